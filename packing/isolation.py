"""Packed documents isolated in every sequence-mixing layer: attention and recurrent (Mamba/SSM) mixers.

A pack holds several documents in one row; ``position_ids`` restart at 0 at each document start
(:mod:`packing.writer`). Inside :func:`document_isolation`:

- attention runs per document (:func:`packing.attention.document_sdpa_forward`; flash-attn varlen on CUDA);
- every recurrent mixer (Mamba-1/Mamba-2 layers of NemotronH, Jamba, Bamba, GraniteMoeHybrid, Zamba2,
  FalconH1, Qwen3-Next's gated DeltaNet, ...: a module with a ``conv1d`` and an ``A_log``) starts each
  document from a zero SSM state and a zero convolution window, as if the document ran alone. On CUDA
  with ``mamba-ssm`` and ``causal-conv1d`` installed, a Mamba-2 mixer of a family whose
  transformers code forwards keyword arguments to the kernels (:data:`SEQ_IDX_MIXERS`) gets the
  document index per token (``seq_idx``, int32 ``[B, T]``, as Megatron-Bridge and SkyRL pass it) and the
  kernels reset the state; everywhere else (the PyTorch reference scan) the mixer runs once on the
  documents as rows of their own (:func:`document_batch`).

The document boundaries come from the ``position_ids`` the model is called with (captured by a
forward pre-hook on the model), so an attention or mixer layer that is not given them (GraniteMoeHybrid's
attention, Jamba's Mamba layers) is still isolated. Under non-reentrant activation checkpointing the
recompute runs during backward, perhaps after the block exited: :func:`recompute_context` (the
``context_fn`` of ``torch.utils.checkpoint``) re-enters the isolation a layer was run under.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from packing.attention import DOCUMENT_ATTENTION, document_ids, document_sdpa_forward

# Mamba-2 mixers whose transformers forward passes **kwargs on to mamba-ssm / causal-conv1d kernels
SEQ_IDX_MIXERS = frozenset({"NemotronHMamba2Mixer", "BambaMixer", "GraniteMoeHybridMambaLayer"})
# config values naming a recurrent (non-attention) layer in layers_block_type / layer_types / pattern strings
RECURRENT_LAYER_TYPES = frozenset({"mamba", "mamba2", "linear_attention", "M"})


class _Isolation:
    """The isolation in force: its model, the ``position_ids`` ``[B, T]`` of the model call being run,
    and the nesting depth of :func:`_installed` blocks."""

    model: torch.nn.Module | None = None
    position_ids: torch.Tensor | None = None
    depth = 0


_STATE = _Isolation()


def recurrent_mixers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The recurrent sequence mixers of ``model`` (an HF model or a wrapper with ``.module``): modules
    holding a ``conv1d`` submodule and an ``A_log`` parameter (every Mamba/SSM/DeltaNet layer of
    transformers' hybrid families); cached on the model.

    Raises:
        ValueError: the config declares recurrent layers (``layers_block_type``/``layer_types``) but none
            is recognizable: packing would leak state across documents, so it is refused.
    """
    hf = getattr(model, "module", model)
    cached = getattr(hf, "_cascade_recurrent_mixers", None)
    if cached is not None:
        return cached
    found = [m for m in hf.modules() if isinstance(getattr(m, "conv1d", None), torch.nn.Module)
             and isinstance(getattr(m, "A_log", None), torch.Tensor)]
    config = hf.config.get_text_config()
    declared = [t for key in ("layers_block_type", "layer_types") for t in (getattr(config, key, None) or [])
                if t in RECURRENT_LAYER_TYPES]
    if declared and not found:
        raise ValueError(f"{type(hf).__name__}: its config declares {len(declared)} recurrent layers but no "
                         "recurrent mixer (conv1d + A_log) was found, so packed documents cannot be isolated")
    object.__setattr__(hf, "_cascade_recurrent_mixers", found)
    return found


def _kernels_take_seq_idx(mixer: torch.nn.Module, hidden: torch.Tensor) -> bool:
    return (hidden.is_cuda and type(mixer).__name__ in SEQ_IDX_MIXERS
            and importlib.util.find_spec("mamba_ssm") is not None
            and importlib.util.find_spec("causal_conv1d") is not None)


def document_batch(position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The documents of a packed batch as rows of their own, right-padded.

    Args:
        position_ids: int64 ``[B, T]``, 0 at each document start.
    Returns:
        ``(index, valid)``: int64 ``[D, L]`` positions into the flattened ``[B * T]`` tokens (``D``
        documents, ``L`` the longest; padding points at the document's first token) and bool ``[D, L]``
        (True on real tokens); ``x.reshape(B * T, ...)[index][valid]`` is ``x`` flattened, in order.
    """
    b, t = position_ids.shape
    starts = (position_ids == 0).clone()
    starts[:, 0] = True
    first = starts.reshape(-1).nonzero().flatten()
    lengths = torch.diff(first, append=first.new_tensor([b * t]))
    offsets = torch.arange(int(lengths.max()), device=position_ids.device)
    valid = offsets[None] < lengths[:, None]
    index = first[:, None] + torch.where(valid, offsets[None], 0)
    return index, valid


def _isolated(mixer: torch.nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
    """``mixer``'s ``forward`` run on each document alone while an isolation is in force (no cache): the
    documents of the batch become rows of their own, right-padded and masked (:func:`document_batch`), in
    ONE call of the mixer, so every rank makes the same module calls whatever its documents (under
    DeepSpeed ZeRO-3 each call gathers parameters collectively). Causal mixers: the padding after a
    document changes none of its outputs. Memory: ``documents x longest document`` tokens per mixer."""
    signature = inspect.signature(forward)

    def isolated_forward(*args: Any, **kwargs: Any) -> Any:
        position_ids = _STATE.position_ids
        bound = signature.bind(*args, **kwargs)
        hidden = bound.arguments.get("hidden_states")
        if position_ids is None or hidden is None or tuple(position_ids.shape) != tuple(hidden.shape[:2]):
            return forward(*args, **kwargs)
        docs = document_ids(position_ids.to(hidden.device))
        if int(docs[:, -1].max()) == 1:  # one document per row: nothing to isolate
            return forward(*args, **kwargs)
        if bound.arguments.get("cache_params") is not None:
            raise ValueError(f"{type(mixer).__name__}: a packed forward cannot fill a recurrent cache (the state "
                             "would be its last document's); call the model with use_cache=False")
        if _kernels_take_seq_idx(mixer, hidden):
            return forward(*args, **kwargs, seq_idx=(docs - 1).to(torch.int32))
        mask = bound.arguments.get("attention_mask")
        mask = mask if isinstance(mask, torch.Tensor) and mask.shape == hidden.shape[:2] else None
        rest = {k: v for k, v in bound.arguments.items() if k not in ("hidden_states", "attention_mask")}
        rest.update(rest.pop("kwargs", {}))
        index, valid = document_batch(position_ids.to(hidden.device))
        flat = hidden.reshape(-1, hidden.shape[-1])
        docs_mask = valid if mask is None else valid & mask.reshape(-1)[index].bool()
        out = forward(hidden_states=flat[index], **rest, attention_mask=docs_mask.to(hidden.dtype))
        return out[valid].view(*hidden.shape[:2], out.shape[-1])

    return isolated_forward


@contextlib.contextmanager
def _installed(model: torch.nn.Module, position_ids: torch.Tensor | None) -> Iterator[None]:
    """Attention and recurrent mixers of ``model`` isolated per document (``position_ids`` given: fixed;
    None: taken from each call of the model). Nested entries are no-ops."""
    from transformers import AttentionInterface

    if _STATE.depth:  # nested: only a fixed position_ids (a recompute) changes the state, for the block
        saved, _STATE.depth = _STATE.position_ids, _STATE.depth + 1
        _STATE.position_ids = saved if position_ids is None else position_ids
        try:
            yield
        finally:
            _STATE.depth, _STATE.position_ids = _STATE.depth - 1, saved
        return
    hf = getattr(model, "module", model)
    AttentionInterface.register(DOCUMENT_ATTENTION, _document_attention)
    previous = hf.config._attn_implementation
    mixers = recurrent_mixers(hf)
    for m in mixers:
        m.forward = _isolated(m, type(m).forward.__get__(m))
    hook = None
    if position_ids is None:
        hook = hf.register_forward_pre_hook(_capture, with_kwargs=True)
    _STATE.model, _STATE.depth, _STATE.position_ids = model, 1, position_ids
    hf.set_attn_implementation(DOCUMENT_ATTENTION)
    try:
        yield
    finally:
        hf.set_attn_implementation(previous)
        _STATE.model, _STATE.depth, _STATE.position_ids = None, 0, None
        if hook is not None:
            hook.remove()
        for m in mixers:
            del m.forward  # the class's forward again


def _capture(_module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError("document isolation needs the model called with position_ids= (restarting at every "
                         "document), not positionally")
    _STATE.position_ids = position_ids


def _document_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None = None,
                        **kwargs: Any) -> tuple[torch.Tensor, None]:
    """:func:`~packing.attention.document_sdpa_forward` with the call's ``position_ids`` when the
    attention layer is not given them."""
    if position_ids is None:
        position_ids = _STATE.position_ids
    return document_sdpa_forward(module, query, key, value, attention_mask, position_ids=position_ids, **kwargs)


def document_isolation(model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
    """Run ``model`` (an HF causal LM, or a wrapper with ``.module``: DeepSpeed engine, Autocast) with
    every packed document isolated in every sequence-mixing layer inside the block (module docstring).

    Call the model with ``position_ids=`` (int64 ``[B, T]``, 0 at each document start) and no
    ``attention_mask``; run the backward of such forwards inside the block too, or enable checkpointing
    with :func:`recompute_context`. Blocks nest (an inner block changes nothing).

    Raises:
        ValueError: (on entry) a model with recurrent layers this module cannot find; (on a call) the model
            called without ``position_ids=``.
    """
    return _installed(model, None)


def recompute_context() -> tuple[contextlib.AbstractContextManager[None], contextlib.AbstractContextManager[None]]:
    """``context_fn`` for ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: ``(forward context,
    recompute context)``; a layer's recompute (during backward, inside the isolation block or after it)
    runs under the isolation its forward ran under (the same model and ``position_ids``), or none. Use as
    ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
    "context_fn": recompute_context})``.
    """
    if not _STATE.depth or _STATE.position_ids is None:
        return contextlib.nullcontext(), contextlib.nullcontext()
    return contextlib.nullcontext(), _installed(_STATE.model, _STATE.position_ids)

"""Attention that never crosses document boundaries inside a pack.

- :func:`document_attention_mask` (CPU, any HF model that accepts a 4-D mask):
  a block-diagonal causal boolean mask from ``position_ids`` (a document
  starts wherever ``position_ids`` is 0).
- :func:`varlen_attention`: attention over a flattened pack given
  ``cu_seqlens``; on CUDA with ``flash-attn`` installed it is
  ``flash_attn_varlen_func`` (Dao 2023, FlashAttention-2, "variable length"
  API), elsewhere each document runs through
  ``torch.nn.functional.scaled_dot_product_attention`` on its own.
  (Hugging Face models with ``attn_implementation="flash_attention_2"`` derive
  the same ``cu_seqlens`` from ``position_ids`` themselves.)
- :func:`document_attention` (CPU, any Hugging Face model whose attention goes through
  transformers' ``AttentionInterface``): switches the model to
  :func:`document_sdpa_forward`, which runs SDPA on each document of each row, so a pack
  costs the sum of its documents' squared lengths instead of the pack length squared
  and no ``[B, T, T]`` mask is built. The training path of ``stages.sft``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

DOCUMENT_ATTENTION = "document_sdpa"


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """int64 [B, T]: the index of the document each token belongs to (counting the 0s of ``position_ids``).

    Raises:
        ValueError: when ``position_ids`` is not 2-D or a row does not start at 0.
    """
    if position_ids.dim() != 2:
        raise ValueError(f"position_ids must be [B, T], got shape {tuple(position_ids.shape)}")
    if position_ids.shape[1] and bool((position_ids[:, 0] != 0).any()):
        raise ValueError("position_ids must start at 0 in every row (a pack starts with a document)")
    return torch.cumsum(position_ids == 0, dim=1)


def document_attention_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal mask, bool [B, 1, T, T]: ``mask[b, 0, i, j]`` is True when
    token ``i`` may attend to token ``j`` (same document and ``j <= i``).

    Pass it as ``attention_mask`` to a Hugging Face model (4-D masks are used as
    given) together with ``position_ids``. Memory is B x T^2 bytes: for the CPU
    path and short packs; long packs use :func:`varlen_attention`.
    """
    doc = document_ids(position_ids)
    t = position_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def _flash_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     softmax_scale: float | None = None) -> torch.Tensor:
    """Causal attention of each document with itself only.

    Args:
        q: [N, H, D] queries of all documents flattened (N = ``cu_seqlens[-1]``).
        k, v: [N, H_kv, D] keys/values (H divisible by H_kv: grouped-query attention).
        cu_seqlens: int32 [n_docs + 1] document offsets, from 0 to N.
        softmax_scale: defaults to 1/sqrt(D).

    Returns:
        [N, H, D], dtype of ``q``.

    Raises:
        ValueError: when ``cu_seqlens`` does not run from 0 to N in non-decreasing steps.
    """
    n = q.shape[0]
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    if cu.dim() != 1 or int(cu[0]) != 0 or int(cu[-1]) != n or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must run from 0 to {n} in non-decreasing steps, got {cu.tolist()[:8]}...")
    flash = _flash_varlen() if q.is_cuda else None
    if flash is not None:
        max_len = int((cu[1:] - cu[:-1]).max())
        return flash(q, k, v, cu, cu, max_len, max_len, softmax_scale=softmax_scale, causal=True)
    out = torch.empty_like(q)
    rep = q.shape[1] // k.shape[1]
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        if e == s:
            continue
        qd, kd, vd = (x[s:e].transpose(0, 1) for x in (q, k, v))  # [H, L, D]
        if rep > 1:
            kd, vd = kd.repeat_interleave(rep, 0), vd.repeat_interleave(rep, 0)
        out[s:e] = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=softmax_scale).transpose(0, 1)
    return out


def document_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                          position_ids: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A transformers attention function (``AttentionInterface``): causal SDPA per document.

    Args:
        query: [B, H, T, D]; key, value: [B, H_kv, T, D] (H divisible by H_kv).
        attention_mask: must be None (documents are found from ``position_ids``).
        position_ids: int64 [B, T], restarting at 0 at every document (padding is one segment).

    Returns:
        ``([B, T, H, D], None)``, the layout transformers' attention functions return. On CUDA with
        ``flash-attn`` installed (and no dropout) the rows run as one varlen call
        (:func:`flattened_varlen`); elsewhere SDPA runs per document.

    Raises:
        ValueError: without ``position_ids``, with a mask, or with a KV cache (query and key
            lengths differ): this is for full-sequence training/scoring forwards.
    """
    if position_ids is None:
        raise ValueError(f"{DOCUMENT_ATTENTION} attention needs position_ids (restarting at every document)")
    if attention_mask is not None:
        raise ValueError(f"{DOCUMENT_ATTENTION} attention takes no attention_mask: documents come from position_ids")
    if query.shape[2] != key.shape[2]:
        raise ValueError(f"{DOCUMENT_ATTENTION} attention is for full-sequence forwards, not a KV cache")
    if query.is_cuda and _flash_varlen() is not None and not (dropout and module.training):
        return flattened_varlen(query, key, value, position_ids, scaling), None
    b, h, t, d = query.shape
    rep = h // key.shape[1]
    out = query.new_empty(b, t, h, d)
    starts = document_ids(position_ids)
    for row in range(b):
        bounds = torch.searchsorted(starts[row], torch.arange(1, int(starts[row, -1]) + 2, device=starts.device))
        for s, e in zip([0, *bounds[:-1].tolist()], bounds.tolist(), strict=True):
            q, k, v = query[row, :, s:e], key[row, :, s:e], value[row, :, s:e]
            if rep > 1:
                k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            out[row, s:e] = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scaling, dropout_p=dropout if module.training else 0.0).transpose(0, 1)
    return out, None


def flattened_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, position_ids: torch.Tensor,
                     scaling: float | None = None) -> torch.Tensor:
    """``[B, T, H, D]``: the ``B`` rows of a packed batch (``query`` ``[B, H, T, D]``, ``key``/``value``
    ``[B, H_kv, T, D]``) flattened to ``[B * T]`` tokens and run through :func:`varlen_attention` with
    ``cu_seqlens`` from ``position_ids`` (a document starts at every 0 and at every row start)."""
    b, h, t, d = query.shape
    starts = (position_ids == 0).clone()
    starts[:, 0] = True
    offsets = starts.reshape(-1).nonzero().flatten()
    cu = torch.cat([offsets, offsets.new_tensor([b * t])]).to(torch.int32)
    flat = [x.transpose(1, 2).reshape(b * t, x.shape[1], d) for x in (query, key, value)]
    return varlen_attention(*flat, cu, softmax_scale=scaling).view(b, t, h, d)


@contextmanager
def document_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` (a Hugging Face model, or a wrapper with ``.module``) with
    :func:`document_sdpa_forward` inside the block; its attention implementation is restored after.

    Call the model with ``position_ids`` and no ``attention_mask``. Blocks nest (each restores the
    implementation it found); a backward that recomputes the forward (activation checkpointing) must
    run inside one too.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(DOCUMENT_ATTENTION, document_sdpa_forward)
    hf = getattr(model, "module", model)
    previous = hf.config._attn_implementation
    hf.set_attn_implementation(DOCUMENT_ATTENTION)
    try:
        yield
    finally:
        hf.set_attn_implementation(previous)

"""Token log-probabilities through the LM head without materializing ``[T, V]`` logits.

At 256K tokens x a 152K vocabulary one fp32 copy of the logits is ~155 GB. :func:`chunked_logprobs`
computes ``log softmax(h W^T / temperature)[target]`` ``chunk`` rows at a time and recomputes each
chunk's logits in the backward pass (the approach of Liger's fused linear cross-entropy and of
torchtune's chunked CE), so the loss needs ``O(chunk x V)`` extra memory whatever ``T`` is, and gives
the same value and gradients as the full ``[T, V]`` form (tests/test_lm_head.py). When all rows fit in
one chunk, that chunk's softmax is kept for the backward instead (same bound, one matmul fewer).
"""

from __future__ import annotations

from typing import Any

import torch

from stages.sdpa import kernel_for
from stages.train_engine import recomputes_layers


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int,
                temperature: float, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        ctx.probs = None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            for s in range(0, hidden.shape[0], chunk):
                logprobs = torch.log_softmax(_logits(hidden[s:s + chunk].to(dtype), w, temperature), -1)
                out[s:s + chunk] = logprobs.gather(1, targets[s:s + chunk, None]).squeeze(1)
            if 0 < hidden.shape[0] <= chunk and any(ctx.needs_input_grad[:2]):
                # one chunk: keep its softmax (the chunk x V the forward held anyway) instead of recomputing
                # the logits in the backward (one [N, H] x [H, V] matmul fewer)
                ctx.probs = logprobs.exp_()
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk, ctx.temperature, ctx.dtype = chunk, temperature, dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(ctx.dtype)
            for s in range(0, hidden.shape[0], ctx.chunk):
                h = hidden[s:s + ctx.chunk].to(ctx.dtype)
                if ctx.probs is not None:
                    probs, ctx.probs = ctx.probs, None
                else:
                    probs = torch.softmax(_logits(h, w, ctx.temperature), -1)
                # d logp[target] / d logits = onehot(target) - softmax(logits), through the temperature
                g = probs.mul_(-grad_out[s:s + ctx.chunk, None])
                g.scatter_add_(1, targets[s:s + ctx.chunk, None], grad_out[s:s + ctx.chunk, None])
                if ctx.temperature != 1.0:
                    g.div_(ctx.temperature)
                g = g.to(ctx.dtype)
                if grad_hidden is not None:
                    grad_hidden[s:s + ctx.chunk] = (g @ w).to(hidden.dtype)
                if ctx.needs_input_grad[1]:  # summed over chunks in fp32 (one chunk: nothing to sum)
                    part = g.T @ h
                    if hidden.shape[0] <= ctx.chunk:
                        grad_weight = part
                    else:
                        grad_weight = part.float() if grad_weight is None else grad_weight.add_(part)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros_like(weight) if grad_weight is None else grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 ``hidden @ weight.T / temperature`` (the matmul in the inputs' dtype; no division at 1)."""
    logits = (hidden @ weight.T).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = 4096,
                     temperature: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
    """float32 ``[N]``: ``log softmax(hidden @ weight.T / temperature)[targets]``, ``chunk`` rows at a time.

    Args:
        hidden: ``[N, H]`` final hidden states (after the last norm), any float dtype, with a graph.
        weight: ``[V, H]`` the LM head's weight (a tied embedding is fine: gradients accumulate).
        targets: int64 ``[N]`` in ``[0, V)``.
        chunk: rows per chunk; extra memory ~ ``chunk x V`` floats (forward and backward).
        dtype: the matmuls' dtype (a bf16 stage: bfloat16, as its autocast ``nn.Linear`` would); default:
            the autocast dtype when autocast is on, else ``hidden``'s. Softmax is fp32.

    Raises:
        ValueError: ``chunk < 1`` or a shape mismatch.
    """
    if chunk < 1 or hidden.ndim != 2 or targets.shape != hidden.shape[:1] or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"chunked_logprobs: chunk {chunk}, hidden {tuple(hidden.shape)}, weight "
                         f"{tuple(weight.shape)}, targets {tuple(targets.shape)}: need chunk >= 1, [N, H], [V, H], [N]")
    device = hidden.device.type
    if dtype is None:
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    return _ChunkedLogprobs.apply(hidden, weight, targets, chunk, temperature, dtype)


def head_weight(model: Any) -> torch.Tensor:
    """The output-embedding weight ``[V, H]`` of an HF causal LM whose logits are ``h @ W^T``.

    Raises:
        ValueError: the model scales or soft-caps its logits (the chunked form would differ).
    """
    module = getattr(model, "module", model)  # a DeepSpeed engine wraps the HF model
    config = module.config.get_text_config()
    for key in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, key, None):
            raise ValueError(f"{type(module).__name__} sets {key}: chunked log-probs need plain logits h @ W^T")
    return module.get_output_embeddings().weight


def head_logprobs(model: Any, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = 4096,
                  temperature: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
    """float32 ``[N]``: :func:`chunked_logprobs` of ``targets`` (int64 ``[N]``) from final hidden states
    ``hidden`` (``[N, H]``) through ``model``'s LM head (:func:`head_weight`).

    When DeepSpeed ZeRO-3 partitions that weight (:func:`partitioned`), it is whole only inside a call
    of its module (DeepSpeed's hooks gather it for the forward and again for the backward, collectively),
    so the chunked computation runs as the head module's forward, once per call on every rank.
    """
    weight = head_weight(model)
    if not partitioned(weight):
        return chunked_logprobs(hidden, weight, targets, chunk, temperature, dtype)
    head = getattr(model, "module", model).get_output_embeddings()
    head.forward = lambda h: chunked_logprobs(h, head.weight, targets, chunk, temperature, dtype)
    try:
        return head(hidden)
    finally:
        del head.forward  # the class's forward again


def partitioned(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is a DeepSpeed ZeRO-3 parameter (partitioned across ranks; its data is only
    whole inside the module calls DeepSpeed hooks, or under ``GatheredParameters``)."""
    return hasattr(weight, "ds_id")


def model_device(model: Any) -> torch.device:
    """The device of ``model``'s parameters (``model``: an HF module or a wrapper of one)."""
    return next(getattr(model, "module", model).parameters()).device


def final_hidden_states(model: Any, **inputs: Any) -> tuple[torch.Tensor, Any]:
    """``([B, T, H] final hidden states, the model's output)`` of an HF causal LM called with ``inputs``
    (``use_cache`` False unless given), its LM head applied to no position (``logits_to_keep`` empty):
    no logits are made. The states come after the last norm, with a graph.

    ``model`` may be the HF module or a wrapper that calls it (:class:`~stages.train_engine.Autocast`,
    a DeepSpeed engine); the states are read by a forward hook on the module's ``base_model``. On CPU, short
    rows run SDPA's math kernel (:func:`stages.sdpa.kernel_for`).
    """
    captured: list[torch.Tensor] = []
    module = getattr(model, "module", model)
    handle = module.base_model.register_forward_hook(
        lambda _m, _a, out: captured.append(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]))
    try:
        with kernel_for(inputs, model_device(model), recomputes_layers(model)):
            out = model(**{"use_cache": False, **inputs}, logits_to_keep=torch.empty(0, dtype=torch.long))
    finally:
        handle.remove()
    return captured[-1], out

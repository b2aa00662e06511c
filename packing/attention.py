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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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

"""Which SDPA kernel a trainer-side forward uses on CPU: the math kernel for short rows.

PyTorch's CPU dispatcher picks its flash kernel whenever it can. On short rows (RL rollouts of a few dozen
tokens) that kernel loses to the math one (``softmax(q k^T) v`` as matmuls): its blocking and its backward
cost more than the ``[B, heads, Q, K]`` matrix it avoids. Measured forward + backward of one attention call,
bf16, 9 query / 3 key-value heads of 64, 2 cores (Xeon with AMX), math / flash time:

========  ====  ====  =====
rows B    Q     K     ratio
========  ====  ====  =====
32        66    66    0.48
16        31    65    0.56
32        96    96    0.65
32        128   128   0.71
16        192   192   1.49
32        64    256   1.37
8         512   512   2.83
========  ====  ====  =====

So up to :data:`MATH_MAX_KEYS` keys a CPU forward runs the math kernel (its ``[B, heads, Q, K]`` matrix is at
most 128 x 128 per head there); longer rows, and every other device, keep PyTorch's choice. Only models
whose attention calls ``torch.nn.functional.scaled_dot_product_attention`` (``attn_implementation``
``sdpa``) are concerned; the values differ from the flash kernel's by float reassociation only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

MATH_MAX_KEYS = 128  # the crossover of the table above: the math kernel is faster up to here


def key_length(inputs: dict[str, Any]) -> int:
    """The number of keys a forward with HF ``inputs`` attends over: the attention mask's width when given
    (it spans the cache and the new tokens), else the new tokens plus the cache's length."""
    if inputs.get("attention_mask") is not None:
        return int(inputs["attention_mask"].shape[-1])
    tokens = inputs["input_ids"] if inputs.get("input_ids") is not None else inputs["inputs_embeds"]
    cache = inputs.get("past_key_values")
    return int(tokens.shape[1]) + (int(cache.get_seq_length()) if cache is not None else 0)


@contextlib.contextmanager
def kernel_for(inputs: dict[str, Any], device: torch.device, recomputed: bool = False) -> Iterator[None]:
    """Inside: SDPA's math kernel when ``device`` is a CPU, the forward of ``inputs`` has at most
    :data:`MATH_MAX_KEYS` keys (:func:`key_length`) and its layers are not ``recomputed`` in the backward
    (activation checkpointing, :func:`stages.train_engine.recomputes_layers`: the recomputation runs outside
    this context and must pick the kernel the forward did); otherwise PyTorch's own choice, unchanged."""
    if device.type != "cpu" or key_length(inputs) > MATH_MAX_KEYS or recomputed:
        yield
        return
    with sdpa_kernel([SDPBackend.MATH]):
        yield

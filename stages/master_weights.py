"""bf16 parameters with fp32 master weights: the mixed precision of Megatron-LM's and DeepSpeed's bf16
optimizers (FSDP: ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``).

The model's parameters are held in bf16, so its forward and backward run in bf16 without autocast's
casts of every weight on every call. Each parameter has an fp32 copy (its master); the optimizer and
its state work on the masters only. Per optimizer step:

1. each backward leaves a bf16 gradient on the parameter; a post-accumulate hook adds it into the
   master's fp32 gradient and frees it, so micro-batches accumulate in fp32 (the master's gradient lives in
   one buffer kept across steps: a fresh 4 bytes per parameter every step cost ~130K page faults on
   SmolLM2-135M);
2. the optimizer steps the masters (clipping, all-reduce and AdamW in fp32);
3. :meth:`MasterWeights.copy_to_model` rounds the masters into the parameters (round to nearest even).

Checkpoints and training states hold the masters (:meth:`MasterWeights.swapped`): a saved model is
fp32 and a resumed run is bitwise the same. Buffers (rotary frequencies, router biases) stay as loaded.

Measured (SmolLM2-135M, 32 rollouts of ~58 tokens, 2 cores): backward + AdamW 3.0 + 0.17 s against
3.2 + 0.23 s under autocast with fp32 weights (benchmarks/grpo.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class MasterWeights:
    """fp32 masters of every parameter of ``model``, which is cast to ``dtype`` in place.

    Args:
        model: the policy (a tied head is one parameter, one master).
        dtype: the parameters' compute dtype (``torch.bfloat16``).

    Attributes:
        trained: the masters of the parameters that require a gradient (what the optimizer steps),
            fp32, each a leaf ``nn.Parameter`` whose ``grad`` the hooks fill.

    Frozen parameters (``trainable_layers``) keep a master too, so a saved checkpoint holds their
    loaded fp32 values, not the bf16 rounding.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16):
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        for p in model.parameters():
            master = torch.nn.Parameter(p.detach().to(torch.float32, copy=True), requires_grad=p.requires_grad)
            self.pairs.append((p, master))
            p.data = p.data.to(dtype)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(_accumulate_into(master))
        self.trained = [m for _, m in self.pairs if m.requires_grad]

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Round every trained master into its parameter (after an optimizer step)."""
        for p, master in self.pairs:
            if master.requires_grad:
                p.copy_(master)

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """Inside: every parameter's data is its fp32 master (a save writes fp32; a load writes into the
        masters). On exit the parameters take their own storage back, rounded from the masters."""
        held = [p.data for p, _ in self.pairs]
        for p, master in self.pairs:
            p.data = master.data
        try:
            yield
        finally:
            for (p, master), data in zip(self.pairs, held, strict=True):
                p.data = data
                with torch.no_grad():
                    p.copy_(master)


def _accumulate_into(master: torch.nn.Parameter):
    kept: list[torch.Tensor] = []  # the master's gradient storage, allocated once: no fresh pages every step

    def hook(p: torch.Tensor) -> None:
        if master.grad is None:  # first gradient since the optimizer's zero_grad(set_to_none=True)
            if not kept:
                kept.append(torch.empty_like(master))
            master.grad = kept[0].copy_(p.grad)
        else:
            master.grad.add_(p.grad)
        p.grad = None

    return hook

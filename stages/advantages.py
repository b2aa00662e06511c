"""Advantage estimators, registered by name (``advantage: grpo`` in a stage config).

Every estimator maps the scalar rewards of ``G`` sampled responses per prompt to one
advantage per response; the loss broadcasts it over the response's tokens. Rewards
arrive flat, prompt-major: ``rewards[p * G + i]`` is sample ``i`` of prompt ``p``.

    >>> grpo_advantages(torch.tensor([1., 0., 0., 0.]), group_size=4).round(decimals=4)
    tensor([ 1.4997, -0.4999, -0.4999, -0.4999])
"""

from __future__ import annotations

from collections.abc import Callable

import torch

AdvantageFn = Callable[..., torch.Tensor]
ADVANTAGES: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: make ``fn(rewards, group_size, **kw) -> advantages`` available as ``name``."""
    def deco(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGES[name] = fn
        return fn
    return deco


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered as ``name``; ValueError lists the known names."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGES)}")
    return ADVANTAGES[name]


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.ndim != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.to(torch.float64).view(-1, group_size)


@register_advantage("grpo")
def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4, ddof: int = 1,
                    scale: bool = True) -> torch.Tensor:
    """Group-normalized advantages ``A_i = (r_i - mean_G r) / (std_G r + eps)`` (GRPO).

    Source: Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300) §4.1.2; the recipe's GRPO
    section. ``ddof=1`` (unbiased std, ``torch.std``'s default and what TRL's
    ``GRPOTrainer`` uses) is our documented choice; ``ddof=0`` gives the population std.
    A group whose rewards are all equal has std 0 and gets advantage exactly 0 (finite,
    thanks to ``eps``). ``scale=False`` keeps only the mean baseline (Dr. GRPO).

    Args:
        rewards: float ``[P * G]``, prompt-major.
        group_size: ``G`` (needs ``G >= 2`` when ``ddof=1``).
    Returns:
        float32 ``[P * G]``; each group's advantages sum to 0.
    Raises:
        ValueError: when ``rewards`` does not split into groups of ``group_size``.
    """
    r = _groups(rewards, group_size)
    if ddof >= group_size:
        raise ValueError(f"ddof={ddof} needs groups larger than {group_size}")
    centered = r - r.mean(dim=1, keepdim=True)
    if scale:
        centered = centered / (r.std(dim=1, correction=ddof, keepdim=True) + eps)
    return centered.view(-1).to(torch.float32)


@register_advantage("leave_one_out")
def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO advantages ``A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_G r)``.

    Source: Ahmadian et al. 2024 (arXiv 2402.14740), Kool et al. 2019. Shapes as in
    :func:`grpo_advantages`; needs ``G >= 2``.
    """
    r = _groups(rewards, group_size)
    if group_size < 2:
        raise ValueError("leave-one-out needs at least 2 samples per prompt")
    baseline = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    return (r - baseline).view(-1).to(torch.float32)


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dynamic filtering (DAPO, arXiv 2503.14476 §3.2): bool ``[P]``, False where all of a
    group's rewards are equal (no learning signal)."""
    r = _groups(rewards, group_size)
    return (r != r[:, :1]).any(dim=1)

"""Advantage estimators, installed by name (``advantage: grpo`` in a stage config; entry-point group
``cascade_rl.advantages``, the built-ins in ``pyproject.toml``).

Every estimator maps the scalar rewards of ``G`` sampled responses per prompt to one
advantage per response; the loss broadcasts it over the response's tokens. Rewards
arrive flat, prompt-major: ``rewards[p * G + i]`` is sample ``i`` of prompt ``p``.

    >>> grpo_advantages(torch.tensor([1., 0., 0., 0.]), group_size=4).round(decimals=4)
    tensor([ 1.4997, -0.4999, -0.4999, -0.4999])
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from common import plugins

AdvantageFn = Callable[..., torch.Tensor]


def get_advantage(name: str) -> AdvantageFn:
    """The estimator installed as ``name`` (entry-point group ``cascade_rl.advantages``, :mod:`common.plugins`).

    Raises:
        ValueError: unknown name, listing the installed ones.
    """
    return plugins.load("advantages", name)


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.ndim != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.to(torch.float64).view(-1, group_size)


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

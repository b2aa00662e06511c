"""Strict on-policy checks (recipe: every Cascade RL stage is strictly on-policy).

Two checks run every optimizer step of the RL runners:

- the sampler's :attr:`~stages.rollout.RolloutEngine.weights_version` equals the trainer's count of
  optimizer steps, so no rollout comes from weights older than the last update;
- ``logprob_diff``, the mean |trainer - sampler| log-probability of the trained tokens, stays within
  ``sampling.max_logprob_diff``. Both sides score the same tokens under the same weights, so a larger
  value means the engines disagree (a stale push, a tied head left behind, a different dtype or
  sampling transform), and the importance ratios of GRPO / MOPD would be wrong.
"""

from __future__ import annotations

import torch

from stages.rollout import Rollouts


class OffPolicyError(RuntimeError):
    """The sampler and the trainer disagree: rollouts are not from the current policy."""


def check_weights_version(version: int, updates: int, stage: str) -> None:
    """Raise :class:`OffPolicyError` unless the engine's ``version`` (weight syncs received) equals
    ``updates`` (optimizer steps taken by stage ``stage``)."""
    if version != updates:
        raise OffPolicyError(f"stage {stage}: the rollout engine samples from weights version {version}, but the "
                             f"trainer has taken {updates} optimizer steps (a weight sync was skipped or failed)")


def logprob_diff_sum(trainer_logprobs: torch.Tensor, rollouts: Rollouts, indices: list[int],
                     mask: torch.Tensor) -> float:
    """Sum over ``mask`` of |trainer - sampler| log-probs (nats).

    Args:
        trainer_logprobs: float ``[B, R]``, row ``b`` scoring sample ``indices[b]``'s response.
        rollouts: the samples, whose ``logprobs`` are the sampler's.
        mask: bool ``[B, R]``, the tokens compared (the trained ones).
    """
    sampler = torch.zeros_like(trainer_logprobs)
    for row, i in enumerate(indices):
        sampler[row, :len(rollouts.logprobs[i])] = torch.tensor(rollouts.logprobs[i])
    return float(torch.where(mask, (trainer_logprobs.detach() - sampler).abs(), 0.0).sum())


def check_logprob_diff(stats: dict[str, float], tolerance: float, stage: str) -> None:
    """Raise :class:`OffPolicyError` when ``stats["logprob_diff"]`` (mean nats per trained token)
    exceeds ``tolerance`` (``sampling.max_logprob_diff``)."""
    diff = stats.get("logprob_diff", 0.0)
    if not diff <= tolerance:  # also NaN
        raise OffPolicyError(
            f"stage {stage}: logprob_diff {diff:.4g} nats/token > sampling.max_logprob_diff {tolerance:g}: the "
            "rollout engine's log-probs disagree with the trainer's on the same tokens and weights. Check that "
            "both use the same dtype (sampling.vllm.dtype), temperature and top_p 1, and that weight sync works")

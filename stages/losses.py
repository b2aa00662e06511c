"""Loss functions on plain tensors, in typed families installed by name.

Two families of on-policy losses, each a :class:`typing.Protocol` and an entry-point group (the built-ins
in ``pyproject.toml``), as verl types ``PolicyLossFn`` and NeMo-RL its ``LossFunction``:

- :class:`PolicyLossFn` (group ``cascade_rl.policy_losses``; ``loss: policy_gradient`` of GRPO and SWE RL):
  per-token log-probs and one advantage per response (or per token) to a loss;
- :class:`DistillationLossFn` (group ``cascade_rl.distillation_losses``; ``loss: mopd`` of MOPD): per-token
  log-probs of the student, the sampler and the teacher to a loss.

A name is looked up in its own family (:func:`get_policy_loss`, :func:`get_distillation_loss`), so a
distillation loss configured as GRPO's is an unknown-name error listing the policy losses. SFT's
cross-entropy (:func:`sft_loss`) is no plugin: the SFT runner computes it chunked through the LM head.

Conventions: ``mask`` is bool/0-1 ``[B, T]`` over response (or supervised) tokens;
masked positions never reach the result (``torch.where``, so even inf/NaN there is
harmless). ``num_tokens`` is the normalizer of the whole gradient-accumulation window
(the recipe's pitfall #1): with it, summing the micro-batch losses of a window gives
exactly the loss of the window processed as one batch.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from common import plugins


class PolicyLossFn(Protocol):
    """A policy-gradient loss (:func:`policy_gradient_loss` is the built-in ``policy_gradient``).

    Args:
        logprobs: float ``[B, T]`` log pi_theta of the sampled tokens, with a graph.
        advantages: float ``[B]`` (one per response) or ``[B, T]``.
        mask: bool ``[B, T]`` trained tokens.
        num_tokens: the accumulation window's trained tokens (default ``mask.sum()``).
        aggregation: :func:`aggregate`'s mode; max_len: Dr. GRPO's constant.
        ref_logprobs: float ``[B, T]`` of the frozen reference (with ``kl_beta > 0``).
        kl_beta, kl_estimator: the KL term (:func:`kl_penalty`).
    Returns:
        ``(loss, stats)``: a scalar with a graph, and floats already normalized by ``num_tokens``.
    """

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                 num_tokens: float | None = None, aggregation: str = "token_mean", max_len: int | None = None,
                 ref_logprobs: torch.Tensor | None = None, kl_beta: float = 0.0,
                 kl_estimator: str = "k2") -> tuple[torch.Tensor, dict[str, float]]: ...


class DistillationLossFn(Protocol):
    """An on-policy distillation loss (``stages.mopd.mopd_loss`` is the built-in ``mopd``).

    Args:
        logprobs: float ``[B, T]`` log pi_train of the sampled tokens, with a graph.
        inf_logprobs: float ``[B, T]`` log pi_inf the sampler reported.
        teacher_logprobs: float ``[B, T]`` log pi_teacher of the same tokens.
        mask: bool ``[B, T]`` trained tokens.
        num_tokens: the accumulation window's trained tokens (default ``mask.sum()``).
        is_bounds: the importance-ratio bounds ``(lo, hi)`` of ``pi_train / pi_inf``.
    Returns:
        ``(loss, stats)``: a scalar with a graph, and floats already normalized by ``num_tokens``.
    """

    def __call__(self, logprobs: torch.Tensor, inf_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                 mask: torch.Tensor, *, num_tokens: float | None = None,
                 is_bounds: tuple[float, float] = (0.5, 2.0)) -> tuple[torch.Tensor, dict[str, float]]: ...


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss installed as ``name`` (entry-point group ``cascade_rl.policy_losses``).

    Raises:
        ValueError: unknown name, listing the installed policy losses.
    """
    return plugins.load("policy_losses", name)


def get_distillation_loss(name: str) -> DistillationLossFn:
    """The distillation loss installed as ``name`` (entry-point group ``cascade_rl.distillation_losses``).

    Raises:
        ValueError: unknown name, listing the installed distillation losses.
    """
    return plugins.load("distillation_losses", name)


AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
              num_tokens: float | None = None, max_len: int | None = None) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar over the tokens where ``mask`` holds.

    Modes (names as in verl's ``agg_loss``):
      - ``token_mean``: ``sum(loss * mask) / num_tokens`` (default ``mask.sum()``); the
        recipe's GRPO aggregation (DAPO, arXiv 2503.14476 §3.3).
      - ``seq_mean_token_mean``: mean over rows with >= 1 token of each row's token mean
        (original GRPO, arXiv 2402.03300 eq. 3).
      - ``seq_mean_token_sum_norm``: ``mean_rows(sum_row / max_len)`` (Dr. GRPO, arXiv 2503.20783).
    A batch with no unmasked token returns 0 (with a graph, no NaN).

    Raises:
        ValueError: unknown ``mode``, mismatched shapes, or ``max_len`` missing for Dr. GRPO.
    """
    if per_token.shape != mask.shape:
        raise ValueError(f"per-token loss {tuple(per_token.shape)} and mask {tuple(mask.shape)} differ in shape")
    mask = mask.bool()
    kept = torch.where(mask, per_token, torch.zeros_like(per_token))
    if mode == "token_mean":
        denom = float(mask.sum()) if num_tokens is None else float(num_tokens)
        return kept.sum() / max(denom, 1.0)
    if mode == "seq_mean_token_mean":
        counts = mask.sum(dim=-1)
        rows = counts > 0
        if not rows.any():
            return kept.sum() * 0.0
        return (kept.sum(dim=-1)[rows] / counts[rows]).mean()
    if mode == "seq_mean_token_sum_norm":
        if max_len is None:
            raise ValueError("seq_mean_token_sum_norm needs max_len")
        return (kept.sum(dim=-1) / max_len).mean() if kept.shape[0] else kept.sum()
    raise ValueError(f"unknown aggregation {mode!r}; known: {AGGREGATIONS}")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / temperature)[target]`` per position.

    Args:
        logits: float ``[B, T, V]`` (position t scores token ``targets[:, t]``).
        targets: int64 ``[B, T]``; out-of-range ids (e.g. -100) are scored as id 0.
    Returns:
        float32 ``[B, T]`` log-probabilities (nats).
    """
    logits = logits.float() / temperature
    safe = targets.clamp(min=0)
    return -F.cross_entropy(logits.flatten(0, 1), safe.flatten(), reduction="none").view_as(targets)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` from tokens sampled from ``pi_theta``.

    ``k3 = exp(d) - d - 1`` with ``d = log pi_ref - log pi_theta`` (Schulman 2020,
    "Approximating KL Divergence"; the estimator of GRPO, arXiv 2402.03300 eq. 4):
    unbiased and >= 0 per token. Shapes ``[B, T]`` float.
    """
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k2",
               clamp: float = 20.0) -> torch.Tensor:
    """Per-token KL penalty term of a loss (``beta * aggregate(kl_penalty)``), from tokens sampled
    from ``pi_theta`` (on-policy), with ``d = log pi_ref - log pi_theta`` clamped to ``[-clamp, clamp]``
    and k3 capped at 10 (verl's ``kl_penalty``; no gradient beyond the clamp).

    Which divergence the gradient descends (expectation over ``y ~ pi_theta``; Schulman 2020,
    "Approximating KL Divergence"; tests/test_losses.py checks each against autograd of the exact
    divergence on a small vocabulary):

    - ``k1 = -d``: gradient ``grad log pi_theta``, zero in expectation. Its value estimates
      KL(pi_theta || pi_ref) without bias, but as a loss it pulls toward nothing.
    - ``k2 = d^2 / 2``: gradient ``-d * grad log pi_theta``, whose expectation is exactly
      ``grad KL(pi_theta || pi_ref)``: the recipe's RLHF term (beta KL(pi_theta || pi_ref)); the default.
    - ``k3 = exp(d) - d - 1`` (GRPO, arXiv 2402.03300 eq. 4): gradient ``(1 - pi_ref / pi_theta) grad log
      pi_theta``, whose expectation is ``grad KL(pi_ref || pi_theta)``: the forward KL, not the reverse
      one its value estimates.

    Shapes ``[B, T]`` float (nats). Raises ValueError for another ``estimator``.
    """
    d = (ref_logprobs - logprobs).clamp(-clamp, clamp)
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        return (torch.exp(d) - d - 1.0).clamp(max=10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {list(KL_ESTIMATORS)}")


def policy_gradient_loss(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                         num_tokens: float | None = None, aggregation: str = "token_mean",
                         max_len: int | None = None, ref_logprobs: torch.Tensor | None = None,
                         kl_beta: float = 0.0, kl_estimator: str = "k2") -> tuple[torch.Tensor, dict[str, float]]:
    """Strict on-policy GRPO loss ``-A_i * rho_{i,t}`` (+ ``beta * kl_penalty``), aggregated over ``mask``.

    ``rho = exp(logprobs - sg[logprobs]) == 1`` (one optimizer step per rollout batch),
    so the gradient is REINFORCE with group-normalized rewards (the recipe's GRPO section).

    Args:
        logprobs: float ``[B, T]`` log pi_theta of the sampled tokens, with a graph.
        advantages: float ``[B]`` (one per response) or ``[B, T]``.
        mask: ``[B, T]`` response tokens that count (truncated responses already zeroed).
        ref_logprobs: ``[B, T]`` of the frozen reference; needed when ``kl_beta > 0``.
        kl_estimator: the penalty's estimator (:func:`kl_penalty`: ``k2`` descends KL(pi_theta || pi_ref)).
    Returns:
        ``(loss, stats)`` with stats ``pg_loss``, and with a KL term ``kl`` (:func:`kl_k3`'s value: the
        unbiased, non-negative estimate of KL(pi_theta || pi_ref)) and ``kl_penalty`` (token means over ``mask``).
    Raises:
        ValueError: ``kl_beta > 0`` without ``ref_logprobs``; see :func:`aggregate`.
    """
    adv = advantages.unsqueeze(-1) if advantages.ndim == 1 else advantages
    ratio = torch.exp(logprobs - logprobs.detach())
    pg = aggregate(-adv * ratio, mask, aggregation, num_tokens, max_len)
    stats = {"pg_loss": float(pg.detach())}
    loss = pg
    if kl_beta:
        if ref_logprobs is None:
            raise ValueError("kl_beta > 0 needs ref_logprobs (a reference model)")
        penalty = aggregate(kl_penalty(logprobs, ref_logprobs, kl_estimator), mask, aggregation, num_tokens, max_len)
        loss = loss + kl_beta * penalty
        stats["kl_penalty"] = float(penalty.detach())
        stats["kl"] = float(aggregate(kl_k3(logprobs.detach(), ref_logprobs), mask, aggregation, num_tokens, max_len))
    return loss, stats


def sft_target_mask(labels: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """bool ``[B, T-1]``: which next-token targets ``labels[:, 1:]`` are trained (see :func:`sft_loss`).

    Its sum over a window is the ``num_tokens`` that :func:`sft_loss` expects."""
    mask = labels[:, 1:] != -100
    if position_ids is not None:
        mask &= position_ids[:, 1:] != 0
    return mask


def sft_loss(logits: torch.Tensor, labels: torch.Tensor, *, position_ids: torch.Tensor | None = None,
             num_tokens: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Next-token cross-entropy over supervised tokens, ``sum / num_tokens``.

    Position ``t`` predicts ``labels[:, t + 1]``; labels ``-100`` are unsupervised. With
    ``position_ids`` (packed rows), a target whose position id is 0 (a document's first
    token) is never trained on the previous document's last token.

    Args:
        logits: float ``[B, T, V]``; labels: int64 ``[B, T]``; position_ids: int64 ``[B, T]``.
        num_tokens: supervised tokens of the whole accumulation window (default: this batch).
    Returns:
        ``(loss, {"nll_sum": summed nats, "tokens": supervised tokens in this batch})``.
    """
    targets = labels[:, 1:]
    mask = sft_target_mask(labels, position_ids)
    nll = -token_logprobs(logits[:, :-1], targets)
    loss = aggregate(nll, mask, "token_mean", num_tokens)
    return loss, {"nll_sum": float(torch.where(mask, nll.detach(), 0.0).sum()), "tokens": int(mask.sum())}

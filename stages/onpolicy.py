"""The strict on-policy step every RL runner shares (recipe: every Cascade RL stage is strictly on-policy).

GRPO, MOPD and SWE RL run one loop (:class:`OnPolicyLoop`), as GRPO and on-policy distillation do in
NeMo-RL; they differ only in their plugins:

- a :class:`Collector` (the environment side): samples this rank's share of a step's prompts with
  the current weights and scores them into an :class:`Experience` (:class:`SingleTurn`: ``n``
  seeded responses per prompt scored by an :class:`~stages.environment.Environment`; SWE RL: agent
  episodes);
- an :class:`Algorithm` (the trainer side): which samples are trained and with what per-token loss
  (GRPO: group advantages, filtering and a :class:`~stages.losses.PolicyLossFn`; MOPD: teacher
  log-probs and a :class:`~stages.losses.DistillationLossFn`).

Per optimizer step: shard the global batch over the data-parallel ranks, check the sampler's weights
version, collect, select, backward in micro-batches normalized over the whole window
(:func:`accumulate`), check ``logprob_diff``, ONE optimizer step and the sampler's weight sync
(:func:`optimizer_step`), log. An MoE policy's loss also carries its router load-balancing term, and
the step logs ``aux_loss`` and the expert load (:mod:`stages.moe`, ``run.routers``).

Two checks run every optimizer step:

- the sampler's :attr:`~stages.rollout.RolloutEngine.weights_version` equals the trainer's count of
  optimizer steps, so no rollout comes from weights older than the last update;
- ``logprob_diff``, the mean |trainer - sampler| log-probability of the trained tokens, stays within
  ``sampling.max_logprob_diff``. Both sides score the same tokens under the same weights, so a larger
  value means the engines disagree (a stale push, a tied head left behind, a different dtype or
  sampling transform), and the importance ratios of GRPO / MOPD would be wrong.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from stages import distributed
from stages.environment import Environment, PromptBuilder, PromptTooLong, load_rl_rows
from stages.logprobs import policy_batch, response_logprobs
from stages.moe import RouterTap
from stages.rollout import RolloutEngine, Rollouts
from stages.runtime import BatchCycle, StageRun


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


@dataclass
class Experience:
    """One optimizer step's samples on this rank, prompt-major, and what the environment said of them.

    Attributes:
        rollouts: the samples (prompt and response ids, sampler log-probs, truncation).
        rows: the RL row of each sample.
        scores: ``(reward, passed)`` per sample; reward ``None`` where the grader failed.
        loss_masks: per sample, int over its response tokens, 1 where the token is trained (the
            model's own tokens of a multi-turn episode); ``None``: every response token.
        stats: the environment's step metrics over the global batch (gathered), seconds included.
    """

    rollouts: Rollouts
    rows: list[dict[str, Any]]
    scores: list[tuple[float | None, bool]]
    loss_masks: list[list[int]] | None = None
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def rewards(self) -> torch.Tensor:
        """float32 ``[N]``, 0 where ungraded."""
        return torch.tensor([s[0] or 0.0 for s in self.scores], dtype=torch.float32)

    @property
    def ungraded(self) -> torch.Tensor:
        """bool ``[N]``: the grader failed, no reward."""
        return torch.tensor([s[0] is None for s in self.scores])

    def masks(self) -> list[list[int]]:
        """:attr:`loss_masks`, or all ones over each response."""
        return self.loss_masks or [[1] * len(ids) for ids in self.rollouts.response_ids]


class Collector(Protocol):
    """The environment side of a step: ``collect(batch, first, step) -> Experience`` for this rank's
    ``batch`` of prompt items, whose first is item ``first`` of the global batch of optimizer step ``step``."""

    def __call__(self, batch: list[Any], first: int, step: int) -> Experience: ...


class Algorithm(Protocol):
    """The trainer side of a step.

    Attributes:
        curves: the step metrics plotted at the end of the run.
    """

    curves: tuple[str, ...]

    def prepare(self, experience: Experience) -> tuple[list[int], dict[str, float]]:
        """This rank's samples to train on (indices into the experience), and step metrics over the
        global batch."""

    def loss(self, logprobs: torch.Tensor, mask: torch.Tensor, chunk: list[int], batch: dict[str, torch.Tensor],
             window: dict[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of micro-batch ``chunk`` (samples of the prepared experience): ``logprobs`` float
        ``[B, R]`` with a graph, ``mask`` bool ``[B, R]`` trained tokens, ``batch`` the micro-batch's
        tensors (:func:`stages.logprobs.policy_batch`); ``window`` holds the all-reduced ``tokens`` and
        ``samples`` of the accumulation window. Returns the loss and stats
        already normalized by the window (summed over micro-batches and ranks)."""


def micro_batches(indices: list[int], size: int) -> list[tuple[list[int], float]]:
    """``(samples, weight)`` per micro-batch: ``indices`` in runs of ``size`` with weight 1, then, with
    data-parallel ranks, zero-weight micro-batches of sample 0 until every rank has as many as the rank
    with the most: DeepSpeed reduces gradients (and ZeRO-3 gathers parameters) inside each backward
    and forward, collectives every rank must join."""
    own = [(indices[s:s + size], 1.0) for s in range(0, len(indices), size)]
    rounds = distributed.all_reduce_max(len(own))
    return own + [([0], 0.0)] * (rounds - len(own))


def accumulate(model: Callable[..., Any], backward: Callable[[torch.Tensor], None], experience: Experience,
               indices: list[int], algorithm: Algorithm, micro_batch_size: int, pad_id: int,
               temperature: float = 1.0, chunk_tokens: int = 4096, routers: RouterTap | None = None,
               share_prompts: bool = True) -> dict[str, Any]:
    """Backward ``algorithm``'s loss of samples ``indices`` in micro-batches of ``micro_batch_size``.

    The trained tokens (response tokens where the experience's loss mask is 1) and samples of all
    ``indices`` of every data-parallel rank form the window (all-reduced) every micro-batch loss is
    normalized by, so the accumulated gradient, summed over ranks, equals that of one batch holding
    them all. Returns, over the global window, the summed ``loss`` and loss stats, ``trained_tokens``,
    ``logprob_diff`` (mean |trainer - sampler| log-prob of the trained tokens: the on-policy check)
    and ``entropy`` (their mean negative log-prob at ``temperature``: the Monte-Carlo estimate of the
    policy's per-token entropy in nats on its own samples).

    With ``routers`` (an MoE policy, :class:`stages.moe.RouterTap`; frozen models such as the KL
    reference or MOPD's teachers have none) each micro-batch loss also gets ``coef x`` its share of the
    router load-balancing loss (each sample's over its prompt and response tokens but the last, weighted by
    its trained tokens over the window's), and the stats gain ``aux_loss`` (the window's token-weighted mean, without
    ``coef``; ``loss`` stays the algorithm's) and the step's expert load
    (:meth:`~stages.moe.RouterTap.step_stats`).
    """
    ro, masks = experience.rollouts, experience.masks()
    window = distributed.all_reduce_sum({"tokens": sum(sum(masks[i]) for i in indices), "samples": len(indices)})
    num_tokens = max(int(window["tokens"]), 1)
    totals: dict[str, float] = {"loss": 0.0, "logprob_diff": 0.0}
    if routers is not None and routers.balancing_loss is not None:
        totals["aux_loss"] = 0.0
    for chunk, weight in micro_batches(indices, micro_batch_size):
        batch = policy_batch(ro, chunk, pad_id)
        mask = batch["response_mask"].clone()
        for row, i in enumerate(chunk):
            mask[row, :len(masks[i])] &= torch.tensor(masks[i], dtype=torch.bool)
        with nullcontext() if routers is None else routers.recording():
            lp = response_logprobs(model, batch, temperature, share_prompts, chunk=chunk_tokens)
        mask = mask.to(lp.device)
        loss, stats = algorithm.loss(lp, mask, chunk, batch, window)
        main, aux = loss, None
        if routers is not None:
            loss, aux = routers.add_aux(loss, batch["input_ids"], mask.sum(1), num_tokens, count=bool(weight),
                                        last=batch["attention_mask"].sum(1) - 1)
        backward(loss * weight)
        if not weight:  # a padding micro-batch (micro_batches): nothing to count
            continue
        if aux is not None:
            totals["aux_loss"] += aux
        totals["loss"] += float(main.detach())
        for k, v in stats.items():
            totals[k] = totals.get(k, 0.0) + v
        totals["logprob_diff"] += logprob_diff_sum(lp, ro, chunk, mask) / num_tokens
        totals["entropy"] = totals.get("entropy", 0.0) + float(-(lp.detach() * mask).sum()) / num_tokens
    moe = routers.step_stats() if routers is not None else {}
    return {**distributed.all_reduce_sum(totals), "trained_tokens": float(window["tokens"]), **moe}


def optimizer_step(run: StageRun, rollout: RolloutEngine, indices: list[int],
                   accumulate_fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    """One strict on-policy update: ``accumulate_fn()`` (the backward of the selected samples, returning
    ``logprob_diff``), the on-policy check (:func:`check_logprob_diff` against ``run.sampling.max_logprob_diff``,
    the rollout engine's, before any weight changes), the optimizer step and the sampler's weight sync
    (``run.updates`` counts it; ``train_s`` times the backward and the optimizer step, ``sync_s`` the sync); or,
    when no sample is left to train on (on any data-parallel rank: ``indices`` are this rank's), no update and
    ``skipped_steps`` counted in ``run.counts``.
    Returns the step's stats, ``trained_samples`` (over all ranks) among them.
    Raises :class:`OffPolicyError`."""
    trained = distributed.total(len(indices))
    if not trained:
        run.counts["skipped_steps"] = run.counts.get("skipped_steps", 0) + 1
        return {"trained_samples": 0.0}
    t0 = time.perf_counter()
    stats = {**accumulate_fn(), "trained_samples": trained}
    check_logprob_diff(stats, run.sampling.max_logprob_diff, run.cfg.name)
    stats.update(run.engine.step())
    stats["train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with run.engine.gathered():
        rollout.sync_weights(run.engine.module)
    run.updates += 1
    return {**stats, "sync_s": time.perf_counter() - t0}


def sample_seed(seed: int, step: int, samples_per_step: int, first: int) -> int:
    """The rollout seed of optimizer step ``step`` (from 1) for a rank whose share starts at global sample
    ``first``: global sample ``k`` of the step draws with ``seed * 2**32 + (step - 1) * samples_per_step + k``
    (the engines' per-sample seeding), so every sample has its own seed, the same on any number of
    ranks and in a resumed run."""
    return seed * 2**32 + (step - 1) * samples_per_step + first


def rollout_stats(ro: Rollouts, rows: list[dict[str, Any]], scores: list[tuple[float | None, bool]]
                  ) -> dict[str, float]:
    """The step's rollout metrics over the global batch (every rank's samples, gathered):
    ``reward_mean`` (graded samples), ``ungraded``, ``pass_rate``, ``response_tokens`` (mean),
    ``truncated`` (fraction) and ``reward/<domain>``."""
    samples = distributed.gather([(s[0], s[1], r["domain"], len(ids), t) for s, r, ids, t in
                                  zip(scores, rows, ro.response_ids, ro.truncated, strict=True)])
    graded = [s[0] for s in samples if s[0] is not None]
    stats: dict[str, float] = {"reward_mean": sum(graded) / len(graded) if graded else float("nan"),
                               "ungraded": float(len(samples) - len(graded)),
                               "pass_rate": sum(s[1] for s in samples) / len(samples),
                               "response_tokens": sum(s[3] for s in samples) / len(samples),
                               "truncated": sum(s[4] for s in samples) / len(samples)}
    for domain in sorted({s[2] for s in samples}):
        mine = [s[0] for s in samples if s[2] == domain and s[0] is not None]
        stats[f"reward/{domain}"] = sum(mine) / len(mine) if mine else float("nan")
    return stats


class SingleTurn:
    """Collector of single-turn rollouts: ``n`` responses per prompt item ``(row, prompt_ids)`` from the
    rollout engine (on gathered weights, each sample seeded by :func:`sample_seed`), scored by ``env``.
    Step metrics: :func:`rollout_stats`, ``generate_s`` and ``score_s``."""

    def __init__(self, rollout: RolloutEngine, env: Environment, n: int, seed: int, prompts_per_step: int,
                 gathered: Callable[[], AbstractContextManager[Any]]):
        self.rollout, self.env, self.n, self.seed = rollout, env, n, seed
        self.samples_per_step, self.gathered = prompts_per_step * n, gathered

    def __call__(self, batch: list[tuple[dict[str, Any], list[int]]], first: int, step: int) -> Experience:
        t0 = time.perf_counter()
        with self.gathered():
            ro = self.rollout.generate([b[1] for b in batch], n=self.n,
                                       seed=sample_seed(self.seed, step, self.samples_per_step, first * self.n))
        t1 = time.perf_counter()
        rows = [b[0] for b in batch for _ in range(self.n)]
        scores = self.env.score(ro.texts, rows)
        if len(scores) != len(ro):
            raise RuntimeError(f"the environment returned {len(scores)} scores for {len(ro)} responses")
        stats = {**rollout_stats(ro, rows, scores), "generate_s": t1 - t0, "score_s": time.perf_counter() - t1}
        return Experience(ro, rows, scores, stats=stats)


def train_prompts(datasets: list[Path], builder: PromptBuilder, stage: str, seed: int,
                  limit: int | None = None) -> tuple[list[tuple[dict[str, Any], list[int]]], dict[str, int]]:
    """The prompt items ``(row, prompt_ids)`` of the train splits of ``datasets`` (the first ``limit``
    rows of each), shuffled with ``seed``, and the dropped counts (``prompt_too_long``).

    Raises:
        ValueError: no trainable prompt (naming the stage, the sets and the prompt budget).
    """
    items, dropped = [], {"prompt_too_long": 0}
    for ds in datasets:
        for row in load_rl_rows(ds, "train", limit=limit):
            try:
                items.append((row, builder(row)))
            except PromptTooLong:
                dropped["prompt_too_long"] += 1
    if not items:
        raise ValueError(f"stage {stage}: no trainable prompt in {[str(d) for d in datasets]} "
                         f"({dropped['prompt_too_long']} longer than max_prompt_tokens={builder.max_prompt_tokens})")
    random.Random(seed).shuffle(items)
    return items, dropped


class OnPolicyLoop:
    """The strict on-policy training loop of an RL stage run (module docstring): ``cfg.steps`` optimizer
    steps over ``items`` (cycled, ``cfg.prompts_per_step`` per step, resumable), each ``collect`` then
    ``algorithm``, logged through ``run``.

    Args:
        run: the stage run (its ``cfg`` needs ``prompts_per_step``, ``micro_batch_size``, ``sampling``).
        rollout: the run's rollout engine (synced after every update).
    """

    def __init__(self, run: StageRun, rollout: RolloutEngine, collect: Collector, algorithm: Algorithm):
        self.run, self.rollout, self.collect, self.algorithm = run, rollout, collect, algorithm

    def train(self, items: list[Any]) -> None:
        """Run the stage's steps over ``items`` (from a resumed run's step and data cursor)."""
        run, cfg = self.run, self.run.cfg
        batches = run.resumable(BatchCycle(items, cfg.prompts_per_step))
        for step in run.progress(cfg.steps):
            t0 = time.perf_counter()
            batch, first = distributed.shard(batches.next(), f"cascade.stages.{cfg.name}.prompts_per_step")
            check_weights_version(self.rollout.weights_version, run.updates, cfg.name)
            exp = self.collect(batch, first, step)
            indices, selected = self.algorithm.prepare(exp)
            stats = {**exp.stats, **selected}
            stats.update(optimizer_step(run, self.rollout, indices, partial(
                accumulate, run.engine.model, run.engine.backward, exp, indices, self.algorithm,
                cfg.micro_batch_size, self.rollout.pad, cfg.sampling.temperature, cfg.loss_chunk_tokens,
                run.routers, cfg.share_prompts)))
            stats["step_s"] = time.perf_counter() - t0
            if "response_tokens" in stats:
                stats["tokens_per_s"] = stats["response_tokens"] * len(exp.rollouts) * distributed.world_size() \
                    / stats["step_s"]
            run.log(step, stats)

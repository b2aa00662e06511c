"""Multi-turn episodes in the RL stages: rows whose ``agent_ref`` names an episode environment
(:func:`validators.episodes.is_episodic`: BFCL multi-turn, ToolTalk, SWE) are played, not answered.

- :class:`EpisodeRunner` builds each environment once per stage (``episodes`` in the stage config:
  ``{agent_ref: factory kwargs}``) and plays rows with a :class:`~stages.policy.ModelPolicy`, the
  episodes of every environment advancing together turn by turn (one batched rollout call per turn).
- :func:`episode_rollouts` turns finished episodes into :class:`~stages.rollout.Rollouts`: the response
  is every token after the first prompt, its ``loss_mask`` 1 exactly on the model's sampled tokens (tool
  outputs, user turns and chat markup the environment wrote are 0), so GRPO and MOPD train only the
  model's tokens; ``truncated`` marks an episode whose context filled before it ended (masked with
  ``mask_truncated``, as a single-turn response without EOS is); a turn cut at ``max_new_tokens`` is
  closed with an untrained EOS and the episode goes on.
- :class:`Episodes` is the collector of the on-policy loop (:class:`stages.onpolicy.Collector`) for
  items ``(row, prompt_ids)``: ``n`` episodes per row, each seeded from its global sample index
  (:func:`stages.onpolicy.sample_seed`), so ranks sample what one process would. :class:`Mixed` sends a
  batch's episode rows to it and the rest to the single-turn collector, and merges them in batch order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from stages import distributed
from stages.onpolicy import Experience, SingleTurn, rollout_stats, sample_seed
from stages.policy import ModelPolicy
from stages.rollout import Rollouts
from validators.episodes import EpisodeEnvironment, EpisodeResult, episode_environment, is_episodic, run_episodes

FINISH_REASONS = ("finished", "submitted", "turn_failed", "max_steps", "timeout", "context", "tool_timeout",
                  "tool_output_limit", "tool_crashed")


def episode_rollouts(results: list[EpisodeResult], group_size: int) -> tuple[Rollouts, list[list[int]]]:
    """Episodes as :class:`Rollouts` (response = every token after the first prompt, ``texts`` the
    grade's reason) and their ``loss_mask`` lists (1: model token).

    Raises:
        ValueError: an episode has no trajectory (not played by a ModelPolicy).
    """
    missing = [r.uuid for r in results if r.trajectory is None]
    if missing:
        raise ValueError(f"episodes {missing[:3]} have no token trajectory (play them with ModelPolicy)")
    trajs = [r.trajectory for r in results]
    ro = Rollouts([t.prompt_ids for t in trajs], [t.ids for t in trajs], [t.logprobs for t in trajs],
                  [r.finish == "context" for r in results],
                  [str(r.grade.reason) for r in results], group_size)
    return ro, [t.loss_mask for t in trajs]


def summarize(results: list[EpisodeResult]) -> dict[str, float]:
    """Mean reward, pass rate, model turns, episode seconds and the share of each finish reason."""
    n = max(len(results), 1)
    out = {"reward": sum(r.grade.reward for r in results) / n, "pass_rate": sum(r.grade.passed for r in results) / n,
           "steps": sum(r.steps for r in results) / n, "episode_s": sum(r.wall_s for r in results) / n,
           "rows": float(len(results))}
    for reason in sorted(set(FINISH_REASONS) | {r.finish for r in results}):
        share = sum(r.finish == reason for r in results) / n
        if share or reason in ("finished", "submitted", "max_steps", "timeout", "context"):
            out[f"finish/{reason}"] = share
    return out


class EpisodeRunner:
    """The episode environments of one stage (or validation), built on first use.

    Args:
        kwargs: ``{agent_ref: factory kwargs}`` (the stage's ``episodes``; absent: the defaults).
    """

    def __init__(self, kwargs: dict[str, dict[str, Any]] | None = None):
        self.kwargs, self.envs = kwargs or {}, {}

    def env(self, agent_ref: str) -> EpisodeEnvironment:
        if agent_ref not in self.envs:
            self.envs[agent_ref] = episode_environment(agent_ref, **self.kwargs.get(agent_ref, {}))
        return self.envs[agent_ref]

    def play(self, policy: ModelPolicy, rows: list[dict[str, Any]]) -> list[EpisodeResult]:
        """One episode per row (results in row order); every environment's episodes advance together (this
        runner is their environment, dispatching by each row's ``agent_ref``)."""
        return run_episodes(self, policy, rows)

    def reset(self, row: dict[str, Any]) -> Any:
        return self.env(row["agent_ref"]).reset(row)

    def step(self, ep: Any, response: str) -> list[dict[str, Any]]:
        return self.env(ep.row["agent_ref"]).step(ep, response)

    def grade(self, ep: Any) -> Any:
        return self.env(ep.row["agent_ref"]).grade(ep)

    def close(self, ep: Any) -> None:
        self.env(ep.row["agent_ref"]).close(ep)


class Episodes:
    """Collector of multi-turn episodes (module doc): ``n`` per item ``(row, prompt_ids)``, played with
    ``policy`` on gathered weights, rewarded by each environment's grade. Step metrics:
    :func:`stages.onpolicy.rollout_stats`, ``episode/*`` (:func:`summarize` over the global batch),
    ``model_tokens`` (trained tokens per episode) and ``episodes_s``."""

    def __init__(self, runner: EpisodeRunner, policy: ModelPolicy, n: int, seed: int, prompts_per_step: int,
                 gathered: Callable[[], AbstractContextManager[Any]]):
        self.runner, self.policy, self.n, self.seed = runner, policy, n, seed
        self.samples_per_step, self.gathered = prompts_per_step * n, gathered

    def seeds(self, step: int, samples: list[int]) -> list[int]:
        """The sampling seed of each global sample index of optimizer step ``step``."""
        return [sample_seed(self.seed, step, self.samples_per_step, k) for k in samples]

    def play(self, rows: list[dict[str, Any]], seeds: list[int]) -> tuple[list[EpisodeResult], Rollouts,
                                                                           list[list[int]]]:
        """Play ``rows`` (one episode each, episode ``k`` seeded ``seeds[k]``) on gathered weights."""
        self.policy.new_seeds = iter(seeds)  # run_episodes resets in row order: trajectories start in that order
        try:
            with self.gathered():
                results = self.runner.play(self.policy, rows)
        finally:
            self.policy.new_seeds = None
        ro, masks = episode_rollouts(results, self.n)
        return results, ro, masks

    def __call__(self, batch: list[tuple[dict[str, Any], list[int]]], first: int, step: int) -> Experience:
        t0 = time.perf_counter()
        rows = [b[0] for b in batch for _ in range(self.n)]
        results, ro, masks = self.play(rows, self.seeds(step, list(range(first * self.n, (first + len(batch)) * self.n))))
        scores = [(float(r.grade.reward), bool(r.grade.passed)) for r in results]
        return Experience(ro, rows, scores, loss_masks=masks,
                          stats={**episode_stats(results, masks), **rollout_stats(ro, rows, scores),
                                 "episodes_s": time.perf_counter() - t0})


def episode_stats(results: list[EpisodeResult], masks: list[list[int]]) -> dict[str, float]:
    """:func:`summarize` over every rank's episodes (``episode/<metric>``) and ``model_tokens`` (mean)."""
    every = distributed.gather([(r, sum(m)) for r, m in zip(results, masks, strict=True)])
    if not every:
        return {}
    out = {f"episode/{k}": v for k, v in summarize([e[0] for e in every]).items() if k != "rows"}
    out["model_tokens"] = sum(e[1] for e in every) / len(every)
    return out


class Mixed:
    """Collector of a batch mixing single-turn and episode rows (module doc): each item's ``n`` samples
    come from ``single`` or ``episodes`` by the row's ``agent_ref``; the experience keeps batch order.
    A stage uses it when any of its rows is an episode row (every rank then runs both phases each step)."""

    def __init__(self, single: SingleTurn, episodes: Episodes):
        self.single, self.episodes, self.n = single, episodes, episodes.n

    def __call__(self, batch: list[tuple[dict[str, Any], list[int]]], first: int, step: int) -> Experience:
        episodic = [is_episodic(row.get("agent_ref")) for row, _ in batch]
        t0, n = time.perf_counter(), self.n
        single = [i for i, e in enumerate(episodic) if not e]
        ro, scores = Rollouts([], [], [], [], [], n), []
        with self.single.gathered():  # every rank enters both phases (ZeRO-3 gathers are collective)
            if single:
                ro = self.single.rollout.generate([batch[i][1] for i in single], n=n, seed=[
                    sample_seed(self.single.seed, step, self.single.samples_per_step, (first + i) * n)
                    for i in single])
        if single:
            scores = self.single.env.score(ro.texts, [batch[i][0] for i in single for _ in range(n)])
        ep_items = [i for i, e in enumerate(episodic) if e]
        samples = [(first + i) * n + j for i in ep_items for j in range(n)]
        results, ero, masks = self.episodes.play([batch[i][0] for i in ep_items for _ in range(n)],
                                                 self.episodes.seeds(step, samples))
        where = {i: (ro, k, scores, None) for k, i in enumerate(single)}
        where.update({i: (ero, k, [(float(r.grade.reward), bool(r.grade.passed)) for r in results], masks)
                      for k, i in enumerate(ep_items)})
        fields: dict[str, list[Any]] = {f: [] for f in ("prompt_ids", "response_ids", "logprobs", "truncated", "texts")}
        all_scores, all_masks = [], []
        for i in range(len(batch)):
            src, k, src_scores, src_masks = where[i]
            for j in range(k * n, (k + 1) * n):
                for f, values in fields.items():
                    values.append(getattr(src, f)[j])
                all_scores.append(src_scores[j])
                all_masks.append(src_masks[j] if src_masks is not None else [1] * len(src.response_ids[j]))
        merged = Rollouts(**fields, group_size=n, weights_version=ro.weights_version)
        all_rows = [b[0] for b in batch for _ in range(n)]
        stats = {**episode_stats(results, masks), **rollout_stats(merged, all_rows, all_scores),
                 "episodes_s": time.perf_counter() - t0}
        return Experience(merged, all_rows, all_scores, loss_masks=all_masks, stats=stats)


def collector(single: SingleTurn, items: list[tuple[dict[str, Any], list[int]]], cfg: Any, tokenizer: Any,
              builder: Any) -> SingleTurn | Mixed:
    """The stage's collector: ``single`` when no item is an episode row, else :class:`Mixed` with a
    :class:`~stages.policy.ModelPolicy` (``cfg.sampling.max_new_tokens`` per model turn,
    ``cfg.max_context_tokens`` per episode) over ``single``'s rollout engine and ``cfg.episodes``."""
    if not any(is_episodic(row.get("agent_ref")) for row, _ in items):
        return single
    policy = ModelPolicy(single.rollout, tokenizer, builder, cfg.sampling.max_new_tokens, cfg.max_context_tokens)
    return Mixed(single, Episodes(EpisodeRunner(cfg.episodes), policy, single.n, single.seed,
                                  single.samples_per_step // single.n, single.gathered))

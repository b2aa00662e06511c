"""SWE RL (recipe: the last Cascade RL stage): multi-turn GRPO on agent episodes with execution reward.

Per optimizer step (the shared strict on-policy loop, :class:`stages.onpolicy.OnPolicyLoop`, with the
GRPO algorithm :class:`stages.grpo.PolicyGradient` and the :class:`AgentEpisodes` collector):
  1. take ``prompts_per_step`` SWE tasks (seeded shuffle of the stage's task sets, cycled);
  2. run ``group_size`` episodes per task with the current policy
     (:class:`stages.policy.ModelPolicy` over the rollout engine, tools in the sandbox);
  3. reward 1 iff every FAIL_TO_PASS and PASS_TO_PASS test passes after the episode
     (:meth:`validators.swe.environment.SWEEnvironment.grade`);
  4. group advantages, dynamic filtering and context-truncation masking as in :mod:`stages.grpo`;
  5. the policy-gradient loss over the episode's tokens where ``loss_mask`` is 1 (the model's own
     sampled tokens; rendered tool outputs and chat markup are masked), normalized by those
     tokens over the whole step, then ONE optimizer step (strict on-policy).

Validation: greedy episodes on the first ``validation_rows`` tasks of each set's validation split
(``swe`` block of the checkpoint record), plus the per-domain validation of ``eval.datasets``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from stages import distributed
from stages.base import StageResult
from stages.environment import Environment, PromptBuilder, PromptTooLong, load_rl_rows
from stages.episodes import episode_rollouts, episode_stats, summarize
from stages.grpo import GRPOConfig, PolicyGradient
from stages.onpolicy import Experience, OnPolicyLoop
from stages.policy import ModelPolicy
from stages.runtime import StageRun
from validators.episodes import EpisodeResult, run_episodes
from validators.swe.environment import AgentConfig, SWEEnvironment


class SWERLConfig(GRPOConfig):
    """GRPO knobs plus the agent's limits (defaults: a CPU smoke run)."""

    agent: AgentConfig = Field(default_factory=AgentConfig)
    validation_rows: int = Field(2, ge=0)  # greedy validation episodes per task set


def run_batch(policy: ModelPolicy, batch: list[tuple[dict[str, Any], SWEEnvironment]]) -> list[EpisodeResult]:
    """Run the batch's episodes, one :func:`run_episodes` call per environment, results in batch order."""
    results: dict[int, EpisodeResult] = {}
    for env in dict.fromkeys(e for _, e in batch):
        idx = [i for i, (_, e) in enumerate(batch) if e is env]
        for i, res in zip(idx, run_episodes(env, policy, [batch[i][0] for i in idx]), strict=True):
            results[i] = res
    return [results[i] for i in range(len(batch))]


class AgentEpisodes:
    """Collector of agent episodes (:class:`stages.onpolicy.Collector`): ``group_size`` episodes per task
    item ``(row, SWEEnvironment)`` with ``policy`` on gathered weights; reward and pass from the tests
    after the episode, the model's own tokens trained (:func:`stages.episodes.episode_rollouts`). Step
    metrics: :func:`stages.episodes.episode_stats` over the global batch, ``reward_mean`` and ``episodes_s``."""

    def __init__(self, policy: ModelPolicy, group_size: int, gathered: Callable[[], AbstractContextManager[Any]]):
        self.policy, self.group_size, self.gathered = policy, group_size, gathered

    def __call__(self, batch: list[tuple[dict[str, Any], SWEEnvironment]], first: int, step: int) -> Experience:
        t0 = time.perf_counter()
        group = [b for b in batch for _ in range(self.group_size)]
        with self.gathered():
            results = run_batch(self.policy, group)
        ro, masks = episode_rollouts(results, self.group_size)
        every = distributed.gather([(r.grade.reward, len(ids)) for r, ids in zip(results, ro.response_ids, strict=True)])
        stats = {**{k.removeprefix("episode/"): v for k, v in episode_stats(results, masks).items()},
                 "reward_mean": sum(e[0] for e in every) / len(every),
                 "episode_tokens": sum(e[1] for e in every) / len(every), "episodes_s": time.perf_counter() - t0}
        return Experience(ro, [row for row, _ in group], [(r.grade.reward, r.grade.passed) for r in results],
                          loss_masks=masks, stats=stats)


class SWERLStage:
    """Stage runner ``swe_rl`` (entry point ``cascade_rl.stages``); datasets are SWE task sets
    (directories with ``train.parquet``/``validation.parquet`` and ``repos/``, from ``cascade swe_tasks``).

    Args:
        config: :class:`SWERLConfig`.
        environment: scores the per-domain validation of ``eval.datasets`` (default: the verifiers);
            the episodes are graded by each task set's :class:`~validators.swe.environment.SWEEnvironment`.
    """

    config_class: ClassVar[type[SWERLConfig]] = SWERLConfig

    def __init__(self, config: SWERLConfig, environment: Environment | None = None):
        self.cfg = config
        self.environment = environment

    def _items(self, datasets: list[Path], split: str, builder: PromptBuilder,
               limit: int | None) -> tuple[list[tuple[dict, SWEEnvironment]], int]:
        items, too_long = [], 0
        for ds in datasets:
            env = SWEEnvironment(ds, self.cfg.agent)
            for row in load_rl_rows(ds, split, limit=limit):
                if row.get("agent_ref") != "swe":
                    raise ValueError(f"{ds}: row {row.get('uuid')!r} has agent_ref {row.get('agent_ref')!r}, not 'swe'")
                try:
                    builder(row)
                except PromptTooLong:
                    too_long += 1
                    continue
                items.append((row, env))
        return items, too_long

    def run(self, datasets: list[Path], init_checkpoint: Path) -> StageResult:
        """Train ``cfg.steps`` multi-turn GRPO steps from ``init_checkpoint``; returns checkpoint + metrics paths.

        Raises:
            ValueError: no SWE task, or a row that is not a SWE task.
        """
        cfg = self.cfg
        with StageRun(cfg, datasets, init_checkpoint) as run:
            engine, tok = run.engine, run.tokenizer
            builder = PromptBuilder(tok, cfg.max_prompt_tokens)
            rollout = run.rollout_engine(cfg.rollout_engine, cfg.sampling)
            items, too_long = self._items(datasets, "train", builder, cfg.max_rows_per_dataset)
            if not items:
                raise ValueError(f"stage {cfg.name}: no SWE task in {[str(d) for d in datasets]} "
                                 f"({too_long} prompts longer than max_prompt_tokens={cfg.max_prompt_tokens})")
            random.Random(cfg.seed).shuffle(items)
            run.counts.update(prompt_too_long=too_long, train_tasks=len(items))
            policy = ModelPolicy(rollout, tok, builder, cfg.sampling.max_new_tokens, cfg.max_context_tokens)
            algorithm = PolicyGradient(cfg, run.reference_model() if cfg.kl_beta or cfg.track_kl else None,
                                       max_len=cfg.max_context_tokens)
            OnPolicyLoop(run, rollout, AgentEpisodes(policy, cfg.group_size, engine.gathered), algorithm).train(items)
            validation = run.validate(rollout, builder, run.environment("verifiers", {}, self.environment))
            val_items, _ = self._items(datasets, "validation", builder, cfg.validation_rows)
            if val_items:
                greedy = ModelPolicy(rollout, tok, builder, cfg.sampling.max_new_tokens, cfg.max_context_tokens,
                                     greedy=True)
                with engine.gathered():  # rank 0 runs the episodes, every rank gets the summary
                    summary = summarize(run_batch(greedy, val_items)) if distributed.is_main() else None
                validation["swe"] = distributed.broadcast(summary)
            return run.finish(validation, curves=("reward_mean", "loss", "steps", "model_tokens"))

"""GRPO as Nemotron-Cascade 2 uses it (recipe §"GRPO as used here"); IF-RL, multi-domain RL,
RLHF, long-context RL and code RL are configs of this one runner, and SWE RL uses its algorithm.

Per optimizer step (the shared strict on-policy loop, :class:`stages.onpolicy.OnPolicyLoop`):
  1. take ``prompts_per_step`` rows (seeded shuffle of the stage's RL sets, cycled);
  2. sample ``group_size`` responses per prompt with the rollout engine (current weights);
  3. score every response with the environment (verifier dispatched by ``agent_ref``); rows played as
     multi-turn episodes (BFCL multi-turn, ToolTalk, SWE: :mod:`stages.episodes`) sample ``group_size``
     episodes instead, rewarded by their environment, only the model's tokens trained;
  4. advantages per group (``advantage``: ``grpo`` | ``leave_one_out``);
  5. dynamic filtering: groups whose rewards are all equal are dropped (counted);
     truncated responses (no EOS within ``max_new_tokens``) are masked (counted);
  6. one backward per micro-batch, each loss normalized by the response-token count of the
     whole step (token-level mean over the accumulation window), then ONE optimizer step:
     strict on-policy, ratio ``pi/sg(pi) == 1``; KL to the frozen initial policy only when
     ``kl_beta > 0`` (RLHF, 0.03).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from stages import distributed
from stages.advantages import get_advantage, informative_groups
from stages.base import StageConfig, StageResult
from stages.environment import Environment, PromptBuilder
from stages.episodes import collector
from stages.logprobs import response_logprobs
from stages.losses import get_policy_loss, kl_k3
from stages.onpolicy import Experience, OnPolicyLoop, SingleTurn, accumulate, train_prompts
from stages.rollout import Rollouts, SamplingConfig
from stages.runtime import StageRun


class GRPOConfig(StageConfig):
    """One GRPO stage (defaults: the recipe's strict on-policy GRPO, no KL)."""

    prompts_per_step: int = Field(4, ge=1)
    group_size: int = Field(4, ge=2)
    micro_batch_size: int = Field(8, ge=1)      # sequences per forward/backward
    max_prompt_tokens: int = Field(1024, ge=1)  # longer prompts are dropped and counted
    max_rows_per_dataset: int | None = Field(None, ge=1)  # first rows of each train set (None: all)
    advantage: str = Field("grpo", json_schema_extra={"plugin": "advantages"})
    advantage_kwargs: dict[str, Any] = Field(default_factory=dict)  # the estimator's own defaults when empty
    loss: str = Field("policy_gradient", json_schema_extra={"plugin": "policy_losses"})
    aggregation: str = "token_mean"
    kl_beta: float = Field(0.0, ge=0.0)
    kl_estimator: Literal["k1", "k2", "k3"] = "k2"  # stages.losses.kl_penalty: k2 descends KL(pi || pi_ref)
    track_kl: bool = False                          # log `kl` to the initial policy without a KL term (one
                                                    # more no-grad forward of it per micro-batch)
    dynamic_filtering: bool = True
    share_prompts: bool = True  # score a prompt's rollouts from one prompt forward (stages.logprobs.response_logprobs)
    mask_truncated: bool = True
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    environment: str = Field("verifiers", json_schema_extra={"plugin": "environments"})
    environment_kwargs: dict[str, Any] = Field(default_factory=dict)


def select_for_training(rewards: torch.Tensor, truncated: torch.Tensor, cfg: GRPOConfig,
                        ungraded: torch.Tensor | None = None) -> tuple[list[int], dict[str, float]]:
    """Indices of the samples that are trained on, and the filtering counts.

    Dynamic filtering drops every sample of a group whose rewards are all equal;
    ``mask_truncated`` drops truncated samples (their group's advantages still use their reward);
    a group with an ``ungraded`` sample (bool ``[N]``: the grader failed, no reward) is dropped
    whole, since its baseline is unknown (counted in ``groups_ungraded``).
    """
    g = cfg.group_size
    groups = informative_groups(rewards, g) if cfg.dynamic_filtering else torch.ones(len(rewards) // g, dtype=torch.bool)
    graded = torch.ones_like(groups) if ungraded is None else ~ungraded.view(-1, g).any(dim=1)
    filtered = ~groups
    groups = groups & graded
    keep = groups.repeat_interleave(g)
    if cfg.mask_truncated:
        keep &= ~truncated
    return keep.nonzero().flatten().tolist(), {"groups_filtered": float(filtered.sum()),
                                               "groups_ungraded": float((~graded).sum()),
                                               "truncated_masked": float((truncated & groups.repeat_interleave(g)).sum())
                                               if cfg.mask_truncated else 0.0}


class PolicyGradient:
    """The GRPO algorithm of the on-policy loop (:class:`stages.onpolicy.Algorithm`): group advantages
    (``cfg.advantage``), :func:`select_for_training`, and ``cfg.loss`` (a
    :class:`~stages.losses.PolicyLossFn`) with a KL term to ``ref_model`` when ``cfg.kl_beta > 0``
    (``cfg.track_kl``: its k3 value logged as ``kl`` without a term).

    Args:
        cfg: the stage's :class:`GRPOConfig`.
        ref_model: the frozen initial policy (``None``: no KL term, no ``kl`` curve).
        max_len: the Dr. GRPO length constant (default ``cfg.sampling.max_new_tokens``).
    """

    curves = ("reward_mean", "loss", "entropy", "kl", "response_tokens", "groups_filtered")

    def __init__(self, cfg: GRPOConfig, ref_model: torch.nn.Module | None = None, max_len: int | None = None):
        self.cfg, self.ref_model, self.max_len = cfg, ref_model, max_len or cfg.sampling.max_new_tokens
        self.advantage, self.loss_fn = get_advantage(cfg.advantage), get_policy_loss(cfg.loss)

    def prepare(self, experience: Experience) -> tuple[list[int], dict[str, float]]:
        """Advantages of the experience's rewards per group, and the samples :func:`select_for_training` keeps."""
        self.advantages = self.advantage(experience.rewards, self.cfg.group_size, **self.cfg.advantage_kwargs)
        indices, counts = select_for_training(experience.rewards, torch.tensor(experience.rollouts.truncated),
                                              self.cfg, experience.ungraded)
        return indices, distributed.all_reduce_sum(counts)

    def loss(self, logprobs: torch.Tensor, mask: torch.Tensor, chunk: list[int], batch: dict[str, torch.Tensor],
             window: dict[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, ref = self.cfg, None
        if self.ref_model is not None:
            with torch.no_grad():
                ref = response_logprobs(self.ref_model, batch, cfg.sampling.temperature, chunk=cfg.loss_chunk_tokens)
        loss, stats = self.loss_fn(logprobs, self.advantages[chunk].to(logprobs.device), mask,
                                   num_tokens=int(window["tokens"]), aggregation=cfg.aggregation, max_len=self.max_len,
                                   ref_logprobs=ref, kl_beta=cfg.kl_beta,
                                   **({"kl_estimator": cfg.kl_estimator} if cfg.kl_beta else {}))
        if cfg.aggregation != "token_mean":  # sequence-level means: weight each micro-batch by its rows
            loss = loss * (len(chunk) / window["samples"])
            stats = {k: v * len(chunk) / window["samples"] for k, v in stats.items()}
        if ref is not None and not cfg.kl_beta:  # track_kl: the loss's own `kl` stat is absent
            stats["kl"] = float((kl_k3(logprobs.detach(), ref) * mask).sum()) / max(window["tokens"], 1)
        return loss, stats


def accumulate_policy_gradient(model: Callable[..., Any], backward: Callable[[torch.Tensor], None],
                               rollouts: Rollouts, advantages: torch.Tensor, indices: list[int],
                               cfg: GRPOConfig, pad_id: int, ref_model: torch.nn.Module | None = None,
                               loss_masks: list[list[int]] | None = None,
                               max_len: int | None = None) -> dict[str, float]:
    """Backward the GRPO loss of samples ``indices`` of ``rollouts`` with the given ``advantages``
    (float ``[N]``) in micro-batches of ``cfg.micro_batch_size`` (:func:`stages.onpolicy.accumulate`
    with :class:`PolicyGradient`; ``loss_masks``: per sample, the trained response tokens).
    Returns the window's summed ``loss``, ``pg_loss`` (``kl`` with ``ref_model``), ``trained_tokens``,
    ``logprob_diff`` and ``entropy``."""
    algorithm = PolicyGradient(cfg, ref_model, max_len)
    algorithm.advantages = advantages
    return accumulate(model, backward, Experience(rollouts, [], [], loss_masks), indices, algorithm,
                      cfg.micro_batch_size, pad_id, cfg.sampling.temperature, cfg.loss_chunk_tokens)


class GRPOStage:
    """Stage runner ``grpo`` (entry point ``cascade_rl.stages``).

    Args:
        config: :class:`GRPOConfig`.
        environment: scores the rollouts (default: ``cfg.environment`` built from ``cfg.environment_kwargs``).
    """

    config_class: ClassVar[type[GRPOConfig]] = GRPOConfig

    def __init__(self, config: GRPOConfig, environment: Environment | None = None):
        self.cfg = config
        self.environment = environment

    def run(self, datasets: list[Path], init_checkpoint: Path) -> StageResult:
        """Train ``cfg.steps`` GRPO steps from ``init_checkpoint``; returns checkpoint + metrics paths.

        Raises:
            ValueError: no trainable prompt. :class:`~stages.onpolicy.OffPolicyError`: sampler and trainer disagree.
        """
        cfg = self.cfg
        with StageRun(cfg, datasets, init_checkpoint) as run:
            env = run.environment(cfg.environment, cfg.environment_kwargs, self.environment)
            builder = PromptBuilder(run.tokenizer, cfg.max_prompt_tokens)
            rollout = run.rollout_engine(cfg.rollout_engine, cfg.sampling)
            algorithm = PolicyGradient(cfg, run.reference_model() if cfg.kl_beta or cfg.track_kl else None)
            items, dropped = train_prompts(datasets, builder, cfg.name, cfg.seed, cfg.max_rows_per_dataset)
            run.counts.update(dropped, train_prompts=len(items))
            collect = collector(SingleTurn(rollout, env, cfg.group_size, cfg.seed, cfg.prompts_per_step,
                                           run.engine.gathered), items, cfg, run.tokenizer, builder)
            OnPolicyLoop(run, rollout, collect, algorithm).train(items)
            validation = run.validate(rollout, builder, run.validation_environment(env))
            return run.finish(validation, curves=algorithm.curves)

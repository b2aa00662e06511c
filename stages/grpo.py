"""GRPO as Nemotron-Cascade 2 uses it (recipe §"GRPO as used here"); IF-RL, multi-domain RL,
RLHF, long-context RL and code RL are configs of this one loop.

Per optimizer step:
  1. take ``prompts_per_step`` rows (seeded shuffle of the stage's RL sets, cycled);
  2. sample ``group_size`` responses per prompt with the rollout engine (current weights);
  3. score every response with the environment (verifier dispatched by ``agent_ref``);
  4. advantages per group (``advantage``: ``grpo`` | ``leave_one_out``);
  5. dynamic filtering: groups whose rewards are all equal are dropped (counted);
     truncated responses (no EOS within ``max_new_tokens``) are masked (counted);
  6. one backward per micro-batch, each loss normalized by the response-token count of the
     whole step (token-level mean over the accumulation window), then ONE optimizer step:
     strict on-policy, ratio ``pi/sg(pi) == 1``; KL to the frozen initial policy only when
     ``kl_beta > 0`` (RLHF, 0.03).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from stages import distributed
from stages.advantages import get_advantage, informative_groups
from stages.base import StageConfig, StageResult
from stages.environment import (
    Environment,
    PromptBuilder,
    PromptTooLong,
    load_rl_rows,
    make_environment,
)
from stages.lm_head import final_hidden_states, head_logprobs, head_weight, model_device, partitioned
from stages.losses import get_loss, kl_k3
from stages.onpolicy import check_logprob_diff, check_weights_version, logprob_diff_sum
from stages.rollout import Rollouts, SamplingConfig
from stages.runtime import BatchCycle, StageRun
from stages.train_engine import compute_dtype


class GRPOConfig(StageConfig):
    """One GRPO stage (defaults: the recipe's strict on-policy GRPO, no KL)."""

    prompts_per_step: int = Field(4, ge=1)
    group_size: int = Field(4, ge=2)
    micro_batch_size: int = Field(8, ge=1)      # sequences per forward/backward
    max_prompt_tokens: int = 1024               # longer prompts are dropped and counted
    max_rows_per_dataset: int | None = None     # first rows of each train set (None: all)
    advantage: str = "grpo"
    advantage_kwargs: dict[str, Any] = Field(default_factory=dict)  # the estimator's own defaults when empty
    loss: str = "policy_gradient"
    aggregation: str = "token_mean"
    kl_beta: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k2"  # stages.losses.kl_penalty: k2 descends KL(pi || pi_ref)
    track_kl: bool = False                          # log `kl` to the initial policy without a KL term (one
                                                    # more no-grad forward of it per micro-batch)
    dynamic_filtering: bool = True
    mask_truncated: bool = True
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    environment: str = "verifiers"
    environment_kwargs: dict[str, Any] = Field(default_factory=dict)


def policy_batch(rollouts: Rollouts, indices: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Training tensors for samples ``indices``: prompts left-padded, responses right-padded.

    Returns int64 ``input_ids``/``attention_mask``/``position_ids`` ``[B, P + R]``,
    ``response_ids`` ``[B, R]`` and bool ``response_mask`` ``[B, R]`` (``P``, ``R``: the
    longest prompt / response among ``indices``). Every response starts at column ``P``.
    """
    prompts = [rollouts.prompt_ids[i] for i in indices]
    responses = [rollouts.response_ids[i] for i in indices]
    p_w, r_w = max(map(len, prompts)), max(max(map(len, responses)), 1)
    ids, att, resp, rmask = [], [], [], []
    for p, r in zip(prompts, responses, strict=True):
        ids.append([pad_id] * (p_w - len(p)) + p + r + [pad_id] * (r_w - len(r)))
        att.append([0] * (p_w - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_w - len(r)))
        resp.append(r + [pad_id] * (r_w - len(r)))
        rmask.append([True] * len(r) + [False] * (r_w - len(r)))
    attention_mask = torch.tensor(att)
    return {"input_ids": torch.tensor(ids), "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_ids": torch.tensor(resp), "response_mask": torch.tensor(rmask)}


def response_logprobs(model: Callable[..., Any], batch: dict[str, torch.Tensor], temperature: float = 1.0,
                      share_prompts: bool = True, chunk: int = 4096) -> torch.Tensor:
    """float32 ``[B, R]`` on the model's device: log pi(response token | prefix) at the sampling
    temperature; 0 where ``response_mask`` is False. ``batch`` (:func:`policy_batch`) may be on any device.

    Only the response tokens go through the LM head, ``chunk`` at a time
    (:func:`stages.lm_head.chunked_logprobs`): no ``[B, R, V]`` logits. Rows with the same prompt (the
    ``n`` rollouts of a prompt, equal left-padded columns ``[:P]``) share its forward when
    ``share_prompts``: the ``U`` distinct prompts run once with a KV cache, the cache is indexed out to
    the ``B`` rows (differentiably: gradients flow back into the prompt forward), and only the
    responses run per row; token for token the same log-probs and gradients as one forward over
    ``[B, P + R]`` (up to float reassociation), on ``U * P + B * R`` tokens instead of ``B * (P + R)``.

    Under DeepSpeed ZeRO-3 (partitioned parameters, gathered inside module calls, each call a
    collective every rank must make the same number of times) the ranks share prompts only when all of
    them can (one all-reduce), and the LM head runs as one module call
    (:func:`stages.lm_head.head_logprobs`).
    """
    batch = {k: v.to(model_device(model)) for k, v in batch.items()}
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    r_w = batch["response_ids"].shape[1]
    p_w = ids.shape[1] - r_w
    scored = batch["response_mask"].bool()
    prompts, inverse = torch.unique(ids[:, :p_w], dim=0, return_inverse=True)
    share = share_prompts and len(prompts) < len(ids) and r_w > 1
    if partitioned(head_weight(model)):
        share = distributed.all_true(share)
    if not share:
        hidden, _ = final_hidden_states(model, input_ids=ids, attention_mask=mask, position_ids=pos)
        hidden = hidden[:, p_w - 1:-1]  # position t scores the token at t + 1
    else:
        first = torch.empty(len(prompts), dtype=torch.long, device=ids.device).scatter_(
            0, inverse, torch.arange(len(ids), device=ids.device))  # any row of each prompt
        head, out = final_hidden_states(model, input_ids=prompts, attention_mask=mask[first, :p_w],
                                        position_ids=pos[first, :p_w], use_cache=True)
        cache = out.past_key_values
        cache.batch_select_indices(inverse)
        tail, _ = final_hidden_states(model, input_ids=ids[:, p_w:-1], attention_mask=mask[:, :-1],
                                      position_ids=pos[:, p_w:-1], past_key_values=cache, use_cache=True)
        hidden = torch.cat([head[inverse, -1:], tail], dim=1)  # head: scores each response's first token
    logprobs = torch.zeros(scored.shape, dtype=torch.float32, device=hidden.device)
    logprobs[scored] = head_logprobs(model, hidden[scored], batch["response_ids"][scored], chunk, temperature,
                                     dtype=compute_dtype(model))
    return logprobs


def micro_batches(indices: list[int], size: int) -> list[tuple[list[int], float]]:
    """``(samples, weight)`` per micro-batch: ``indices`` in runs of ``size`` with weight 1, then, with
    data-parallel ranks, zero-weight micro-batches of sample 0 until every rank has as many as the rank
    with the most: DeepSpeed reduces gradients (and ZeRO-3 gathers parameters) inside each backward
    and forward, collectives every rank must join."""
    own = [(indices[s:s + size], 1.0) for s in range(0, len(indices), size)]
    rounds = distributed.all_reduce_max(len(own))
    return own + [([0], 0.0)] * (rounds - len(own))


def accumulate_policy_gradient(model: Callable[..., Any], backward: Callable[[torch.Tensor], None],
                               rollouts: Rollouts, advantages: torch.Tensor, indices: list[int],
                               cfg: GRPOConfig, pad_id: int,
                               ref_model: torch.nn.Module | None = None,
                               loss_masks: list[list[int]] | None = None,
                               max_len: int | None = None) -> dict[str, float]:
    """Backward the GRPO loss of samples ``indices`` in micro-batches of ``cfg.micro_batch_size``.

    Each micro-batch loss is normalized by the trained tokens of all ``indices`` of every
    data-parallel rank (all-reduced), so the accumulated gradient, summed over ranks, equals that of
    one batch holding them all. ``loss_masks`` (per sample, int over its response tokens; SWE RL's
    agent episodes) restricts training to the tokens marked 1 (the model's own, not tool outputs),
    which are then also the normalizer. ``max_len`` is the Dr. GRPO length constant (default
    ``cfg.sampling.max_new_tokens``). Returns, over the global window, summed ``loss``, ``pg_loss``
    (and ``kl``: the k3 estimate of KL(pi || pi_init) per token, with ``ref_model``), ``trained_tokens``,
    ``logprob_diff``: mean |trainer - sampler| log-prob of the trained tokens (an on-policy sanity
    check), and ``entropy``: their mean negative log-prob at the sampling temperature, the Monte-Carlo
    estimate of the policy's per-token entropy (nats) on its own samples.
    """
    masks = loss_masks or [[1] * len(rollouts.response_ids[i]) for i in range(len(rollouts.response_ids))]
    window = distributed.all_reduce_sum({"tokens": sum(sum(masks[i]) for i in indices), "samples": len(indices)})
    num_tokens = int(window["tokens"])
    loss_fn = get_loss(cfg.loss)
    totals: dict[str, float] = {"loss": 0.0, "logprob_diff": 0.0}
    for chunk, weight in micro_batches(indices, cfg.micro_batch_size):
        batch = policy_batch(rollouts, chunk, pad_id)
        mask = batch["response_mask"].clone()
        for row, i in enumerate(chunk):
            mask[row, :len(masks[i])] &= torch.tensor(masks[i], dtype=torch.bool)
        lp = response_logprobs(model, batch, cfg.sampling.temperature, chunk=cfg.loss_chunk_tokens)
        mask = mask.to(lp.device)
        ref = None
        if ref_model is not None:
            with torch.no_grad():
                ref = response_logprobs(ref_model, batch, cfg.sampling.temperature, chunk=cfg.loss_chunk_tokens)
        loss, stats = loss_fn(lp, advantages[chunk].to(lp.device), mask, num_tokens=num_tokens,
                              aggregation=cfg.aggregation, max_len=max_len or cfg.sampling.max_new_tokens,
                              ref_logprobs=ref, kl_beta=cfg.kl_beta,
                              **({"kl_estimator": cfg.kl_estimator} if cfg.kl_beta else {}))
        if cfg.aggregation != "token_mean":  # sequence-level means: weight each micro-batch by its rows
            loss = loss * (len(chunk) / window["samples"])
            stats = {k: v * len(chunk) / window["samples"] for k, v in stats.items()}
        backward(loss * weight)
        if not weight:  # a padding micro-batch (micro_batches): nothing to count
            continue
        totals["loss"] += float(loss.detach())
        for k, v in stats.items():  # stats are normalized by num_tokens already
            totals[k] = totals.get(k, 0.0) + v
        totals["logprob_diff"] += logprob_diff_sum(lp, rollouts, chunk, mask) / max(num_tokens, 1)
        totals["entropy"] = totals.get("entropy", 0.0) + float(-(lp.detach() * mask).sum()) / max(num_tokens, 1)
        if ref is not None and not cfg.kl_beta:  # track_kl: the loss's own `kl` stat is absent
            totals["kl"] = totals.get("kl", 0.0) + float((kl_k3(lp.detach(), ref) * mask).sum()) / max(num_tokens, 1)
    return {**distributed.all_reduce_sum(totals), "trained_tokens": float(num_tokens)}


def optimizer_step(run: Any, engine: Any, rollout: Any, indices: list[int],
                   accumulate: Callable[[], dict[str, float]]) -> dict[str, float]:
    """One strict on-policy update: ``accumulate()`` (the backward of the selected samples, returning
    ``logprob_diff``), the on-policy check (:func:`stages.onpolicy.check_logprob_diff` against
    ``run.sampling.max_logprob_diff``, the rollout engine's, before any weight changes), the optimizer
    step and the sampler's weight sync (``run.updates`` counts it, ``sync_s`` times it); or, when no sample is left to train
    on (on any data-parallel rank: ``indices`` are this rank's), no update and ``skipped_steps`` counted in ``run.counts``.
    Returns the step's stats, ``trained_samples`` (over all ranks) among them.
    Raises :class:`~stages.onpolicy.OffPolicyError`."""
    trained = distributed.total(len(indices))
    if not trained:
        run.counts["skipped_steps"] = run.counts.get("skipped_steps", 0) + 1
        return {"trained_samples": 0.0}
    stats = {**accumulate(), "trained_samples": trained}
    check_logprob_diff(stats, run.sampling.max_logprob_diff, run.cfg.name)
    stats.update(engine.step())
    t0 = time.perf_counter()
    with engine.gathered():
        rollout.sync_weights(engine.module)
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


class GRPOStage:
    """Stage runner ``grpo`` (entry point ``cascade_rl.stages``)."""

    config_class: ClassVar[type[GRPOConfig]] = GRPOConfig

    def __init__(self, config: GRPOConfig, environment: Environment | None = None):
        self.cfg = config
        self.environment = environment

    def _train_rows(self, datasets: list[Path], builder: PromptBuilder
                    ) -> tuple[list[tuple[dict, list[int]]], dict[str, int]]:
        items, dropped = [], {"prompt_too_long": 0}
        for ds in datasets:
            for row in load_rl_rows(ds, "train", limit=self.cfg.max_rows_per_dataset):
                try:
                    items.append((row, builder(row)))
                except PromptTooLong:
                    dropped["prompt_too_long"] += 1
        if not items:
            raise ValueError(f"stage {self.cfg.name}: no trainable prompt in {[str(d) for d in datasets]} "
                             f"({dropped['prompt_too_long']} longer than max_prompt_tokens={self.cfg.max_prompt_tokens})")
        random.Random(self.cfg.seed).shuffle(items)
        return items, dropped

    def run(self, datasets: list[Path], init_checkpoint: Path) -> StageResult:
        """Train ``cfg.steps`` GRPO steps from ``init_checkpoint``; returns checkpoint + metrics paths."""
        cfg = self.cfg
        with StageRun(cfg, datasets, init_checkpoint) as run:
            engine, tok = run.engine, run.tokenizer
            env = self.environment or make_environment(cfg.environment, **cfg.environment_kwargs)
            builder = PromptBuilder(tok, cfg.max_prompt_tokens)
            rollout = run.rollout_engine(cfg.rollout_engine, cfg.sampling)
            ref_model = run.reference_model() if cfg.kl_beta or cfg.track_kl else None
            items, dropped = self._train_rows(datasets, builder)
            run.counts.update(dropped, train_prompts=len(items))
            advantage = get_advantage(cfg.advantage)
            batches = run.resumable(BatchCycle(items, cfg.prompts_per_step))
            for step in run.progress(cfg.steps):
                t0 = time.perf_counter()
                batch, first = distributed.shard(batches.next(), f"cascade.stages.{cfg.name}.prompts_per_step")
                check_weights_version(rollout.weights_version, run.updates, cfg.name)
                with engine.gathered():
                    ro = rollout.generate([b[1] for b in batch], n=cfg.group_size,
                                          seed=sample_seed(cfg.seed, step, cfg.prompts_per_step * cfg.group_size,
                                                           first * cfg.group_size))
                t_gen = time.perf_counter() - t0
                rows = [b[0] for b in batch for _ in range(cfg.group_size)]
                scores = env.score(ro.texts, rows)
                ungraded = torch.tensor([s[0] is None for s in scores])
                rewards = torch.tensor([s[0] or 0.0 for s in scores], dtype=torch.float32)
                adv = advantage(rewards, cfg.group_size, **cfg.advantage_kwargs)
                indices, filt = select_for_training(rewards, torch.tensor(ro.truncated), cfg, ungraded)
                stats = {**rollout_stats(ro, rows, scores), **distributed.all_reduce_sum(filt)}
                stats.update(optimizer_step(run, engine, rollout, indices, partial(
                    accumulate_policy_gradient, engine.model, engine.backward, ro, adv, indices, cfg, rollout.pad,
                    ref_model)))
                stats.update(generate_s=t_gen, step_s=time.perf_counter() - t0)
                stats["tokens_per_s"] = stats["response_tokens"] * len(ro) * distributed.world_size() / stats["step_s"]
                run.log(step, stats)
            # validation is verifiable per domain: a GenRM judge scores groups, not single answers
            eval_env = make_environment("verifiers") if cfg.environment == "genrm" and not self.environment else env
            validation = run.validate(rollout, builder, eval_env)
            return run.finish(validation, curves=("reward_mean", "loss", "entropy", "kl", "response_tokens",
                                                 "groups_filtered"))

"""Per-domain validation: greedy answers (and ``samples`` sampled ones) to held-out RL rows, scored
by the environment.

The metrics per domain go into the checkpoint record, where
:class:`stages.checkpoints.CheckpointRegistry` ranks checkpoints per domain:

  ``reward``, ``pass_rate``         greedy answers: mean reward, fraction passed (IF: prompt-level accuracy)
  ``pass@k``, ``reward@t``          with ``samples: k``: the fraction of prompts with a passing answer among
                                    ``k`` sampled at ``temperature`` (Chen et al. 2021, n = k), and the mean
                                    reward of those samples
  ``response_tokens``, ``truncated`` greedy answers: mean length, fraction without EOS
  ``sample_response_tokens``        with ``samples``: the sampled answers' mean length
  ``rows``, ``prompt_too_long``, ``ungraded``  prompts scored, skipped (longer than the builder's budget),
                                    and whose greedy answer the grader failed on (scored as reward 0)

The per-prompt scores (``scores``: :func:`split_scores` takes them out of the record) are what
``cascade report`` resamples for paired bootstrap intervals across checkpoints: every checkpoint
answers the same rows, and sample ``j`` of row ``i`` draws with seed ``seed + i * k + j`` on every
checkpoint (common random numbers).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stages.base import EvalConfig
from stages.environment import Environment, PromptBuilder, PromptTooLong, load_rl_rows
from stages.episodes import EpisodeRunner
from stages.policy import ModelPolicy
from stages.rollout import RolloutEngine
from validators.episodes import is_episodic

SCORES = "scores"


@contextmanager
def _temperature(rollout: RolloutEngine, temperature: float):
    """Sample at ``temperature`` for the duration (the built-in engines read ``sampling`` per call)."""
    sampling = getattr(rollout, "sampling", None)
    if sampling is None:
        raise ValueError(f"eval.samples needs a rollout engine with a `sampling` config ({type(rollout).__name__} "
                         f"has none): set eval.samples 0")
    rollout.sampling = sampling.model_copy(update={"temperature": temperature, "top_p": 1.0})
    try:
        yield
    finally:
        rollout.sampling = sampling


def _rewards(env: Environment, texts: list[str], rows: list[dict[str, Any]]) -> tuple[list[float], list[bool], int]:
    """Rewards and passes of ``texts`` (an ungraded answer, ``None`` from the grader, counts as 0 and
    not passed, so every checkpoint's vector covers the same rows), and the number ungraded."""
    scored = env.score(texts, rows)
    return ([float(s[0] or 0.0) for s in scored], [bool(s[1]) and s[0] is not None for s in scored],
            sum(s[0] is None for s in scored))


def _greedy(rollout: RolloutEngine, builder: PromptBuilder, env: Environment, rows: list[dict[str, Any]],
            prompts: list[list[int]], episodic: list[bool], limit: int, episodes: dict[str, dict[str, Any]],
            max_context_tokens: int) -> tuple[list[float], list[bool], list[int], list[bool], int]:
    """Greedy rewards, passes, model tokens and truncation per row, and the number ungraded: single-turn
    rows answered in one batched call, episode rows played (one greedy episode each)."""
    reward, passed = [0.0] * len(rows), [False] * len(rows)
    lengths, truncated = [0] * len(rows), [False] * len(rows)
    single = [i for i, e in enumerate(episodic) if not e]
    ungraded = 0
    if single:
        ro = rollout.generate([prompts[i] for i in single], n=1, greedy=True, max_new_tokens=limit)
        r, p, ungraded = _rewards(env, ro.texts, [rows[i] for i in single])
        for k, i in enumerate(single):
            reward[i], passed[i], lengths[i], truncated[i] = r[k], p[k], len(ro.response_ids[k]), ro.truncated[k]
    played = [i for i, e in enumerate(episodic) if e]
    if played:
        policy = ModelPolicy(rollout, builder.tokenizer, builder, limit, max_context_tokens, greedy=True)
        for i, res in zip(played, EpisodeRunner(episodes).play(policy, [rows[i] for i in played]), strict=True):
            reward[i], passed[i] = float(res.grade.reward), bool(res.grade.passed)
            lengths[i] = sum(res.trajectory.loss_mask) if res.trajectory else 0
            truncated[i] = res.finish == "context" or bool(res.trajectory and res.trajectory.truncated)
    return reward, passed, lengths, truncated, ungraded


def evaluate(rollout: RolloutEngine, builder: PromptBuilder, env: Environment, cfg: EvalConfig,
             episodes: dict[str, dict[str, Any]] | None = None,
             max_context_tokens: int = 4096) -> dict[str, dict[str, Any]]:
    """``{domain: metrics}`` for every dataset in ``cfg.datasets`` (domain = the set's directory name);
    each block also holds ``scores``: ``{"uuid": [str], "reward": [float], "passed": [bool],
    "sample_rewards": [[float] * k], "sample_passed": [[bool] * k]}`` over the scored rows in order.

    ``cfg.max_new_tokens`` is one budget or ``{domain: tokens}`` (ValueError for a domain it lacks).
    Rows whose prompt exceeds ``cfg.max_prompt_tokens`` (else the builder's budget) are counted in
    ``prompt_too_long``, not scored. Episode rows (:func:`validators.episodes.is_episodic`) are played, one
    greedy episode each (environments built with ``episodes``, context up to ``max_context_tokens``; their
    ``response_tokens`` count the model's tokens; a set of them gets no sampled pass@k).
    Raises ValueError (from :func:`_temperature`) when ``cfg.samples`` is set and the engine has no
    ``sampling`` config.
    """
    if cfg.max_prompt_tokens is not None:
        builder = PromptBuilder(builder.tokenizer, cfg.max_prompt_tokens)
    out: dict[str, dict[str, Any]] = {}
    for dataset in cfg.datasets:
        limit = cfg.max_new_tokens
        if isinstance(limit, dict):
            if Path(dataset).name not in limit:
                raise ValueError(f"eval.max_new_tokens has no entry for domain {Path(dataset).name!r} "
                                 f"(it lists {sorted(limit)})")
            limit = limit[Path(dataset).name]
        out[Path(dataset).name] = score_rows(rollout, builder, env, load_rl_rows(dataset, "validation", limit=cfg.rows),
                                             limit, cfg.samples, cfg.temperature, cfg.seed, episodes,
                                             max_context_tokens)
    return out


def score_rows(rollout: RolloutEngine, builder: PromptBuilder, env: Environment, rows: list[dict[str, Any]],
               max_new_tokens: int, samples: int = 0, temperature: float = 1.0, seed: int = 0,
               episodes: dict[str, dict[str, Any]] | None = None, max_context_tokens: int = 4096) -> dict[str, Any]:
    """The metrics block of ``rows`` (see the module doc), with their per-prompt ``scores``: the greedy answers
    of every single-turn prompt in one batched ``generate`` call, then ``samples`` answers per prompt at
    ``temperature`` (seeded ``seed + i * samples + j``) in another; episode rows played, one greedy episode each.
    A row whose prompt exceeds the builder's budget is counted in ``prompt_too_long``, not scored.

    Raises:
        ValueError: ``samples`` set and the engine has no ``sampling`` config (:func:`_temperature`).
    """
    kept, prompts, too_long = [], [], 0
    for row in rows:
        try:
            prompts.append(builder(row))
            kept.append(row)
        except PromptTooLong:
            too_long += 1
    metrics: dict[str, Any] = {"rows": len(kept), "prompt_too_long": too_long}
    if not kept:
        return metrics
    episodic = [is_episodic(r.get("agent_ref")) for r in kept]
    reward, passed, lengths, truncated, ungraded = _greedy(rollout, builder, env, kept, prompts, episodic,
                                                           max_new_tokens, episodes or {}, max_context_tokens)
    scores: dict[str, list[Any]] = {"uuid": [str(r.get("uuid")) for r in kept], "reward": reward, "passed": passed}
    metrics.update(reward=sum(reward) / len(kept), pass_rate=sum(passed) / len(kept), ungraded=ungraded,
                   response_tokens=sum(lengths) / len(kept), truncated=sum(truncated) / len(kept))
    if samples and not any(episodic):
        k = samples
        with _temperature(rollout, temperature):
            sampled = rollout.generate(prompts, n=k, max_new_tokens=max_new_tokens, seed=seed)
        s_reward, s_passed, _ = _rewards(env, sampled.texts, [r for r in kept for _ in range(k)])
        scores["sample_rewards"] = [s_reward[i * k:(i + 1) * k] for i in range(len(kept))]
        scores["sample_passed"] = [s_passed[i * k:(i + 1) * k] for i in range(len(kept))]
        metrics[f"pass@{k}"] = sum(any(p) for p in scores["sample_passed"]) / len(kept)
        metrics["sample_response_tokens"] = sum(map(len, sampled.response_ids)) / len(sampled.response_ids)
        metrics[f"reward@t{temperature:g}"] = sum(s_reward) / len(s_reward)
    metrics[SCORES] = scores
    return metrics


def split_scores(validation: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """``(metrics, scores)``: the validation blocks without their per-prompt ``scores`` (the record and
    the DVC metrics keep the aggregates), and ``{domain: scores}``."""
    metrics = {d: {k: v for k, v in block.items() if k != SCORES} for d, block in validation.items()}
    return metrics, {d: block[SCORES] for d, block in validation.items() if SCORES in block}

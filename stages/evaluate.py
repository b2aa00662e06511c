"""Per-domain validation: greedy responses to held-out RL rows, scored by the environment.

The metrics per domain (``reward`` mean, ``pass_rate``, ``response_tokens`` mean,
``truncated`` fraction, ``rows``, ``prompt_too_long``) go into the checkpoint record, where
:class:`stages.checkpoints.CheckpointRegistry` ranks checkpoints per domain.
"""

from __future__ import annotations

from pathlib import Path

from stages.base import EvalConfig
from stages.environment import Environment, PromptBuilder, PromptTooLong, load_rl_rows
from stages.rollout import RolloutEngine


def evaluate(rollout: RolloutEngine, builder: PromptBuilder, env: Environment,
             cfg: EvalConfig) -> dict[str, dict[str, float]]:
    """``{domain: metrics}`` for every dataset in ``cfg.datasets`` (domain = the set's directory name).

    Rows whose prompt exceeds the builder's budget are counted in ``prompt_too_long``, not scored.
    """
    out: dict[str, dict[str, float]] = {}
    for dataset in cfg.datasets:
        rows = load_rl_rows(dataset, "validation", limit=cfg.rows)
        kept, prompts, too_long = [], [], 0
        for row in rows:
            try:
                prompts.append(builder(row))
                kept.append(row)
            except PromptTooLong:
                too_long += 1
        metrics: dict[str, float] = {"rows": len(kept), "prompt_too_long": too_long}
        if kept:
            ro = rollout.generate(prompts, n=1, greedy=True, max_new_tokens=cfg.max_new_tokens)
            scores = [s for s in env.score(ro.texts, kept) if s[0] is not None]  # None: the grader failed
            metrics["ungraded"] = len(kept) - len(scores)
            metrics.update(reward=sum(s[0] for s in scores) / max(len(scores), 1),
                           pass_rate=sum(s[1] for s in scores) / max(len(scores), 1),
                           response_tokens=sum(map(len, ro.response_ids)) / len(ro),
                           truncated=sum(ro.truncated) / len(ro))
        out[Path(dataset).name] = metrics
    return out

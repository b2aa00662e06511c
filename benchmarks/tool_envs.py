"""The multi-turn tool environments on their real rows: per category, the rows, the scripted ground
truth's score (must be 1.0 everywhere), episodes per second of the scripted policy (sandbox start, tool
calls, grading: the environment's own cost), and a model's greedy pass rate on the first ``--model-rows``
rows of each category that fit ``--max-prompt-tokens``.

    python -m benchmarks.tool_envs [--model data/assets/SmolLM2-135M-Instruct] [--model-rows 4]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from common.paths import SOURCES
from tests.tool_policies import TurnScript
from tests.tool_rows import episode_rows
from validators.episodes import run_episodes
from validators.tools.bfcl import BFCLEnvironment
from validators.tools.tooltalk import ToolTalkEnvironment

ENVS = {"bfcl_multi_turn": BFCLEnvironment, "tooltalk_episodes": ToolTalkEnvironment}


def model_pass_rates(model_dir: str, rows_by_cat: dict[str, list[dict]], per_cat: int, max_prompt: int,
                     max_new_tokens: int, engine: str) -> dict[str, tuple[int, float, float]]:
    """``{category: (episodes, pass rate, seconds)}`` of greedy episodes of the model."""
    from stages.checkpoints import load_checkpoint
    from stages.environment import PromptBuilder, PromptTooLong
    from stages.episodes import EpisodeRunner
    from stages.policy import ModelPolicy
    from stages.rollout import SamplingConfig, make_rollout_engine

    model, tok = load_checkpoint(model_dir)
    rollout = make_rollout_engine(engine, model.eval(), tok, SamplingConfig(max_new_tokens=max_new_tokens), model_dir)
    builder = PromptBuilder(tok, max_prompt)
    policy = ModelPolicy(rollout, tok, builder, max_new_tokens, max_prompt + 2048, greedy=True)
    runner = EpisodeRunner({ref: {"episodes": {"max_steps": 8, "max_steps_per_turn": 3}}
                            for ref in ("bfcl_multi_turn", "tooltalk")})
    out = {}
    for cat, rows in rows_by_cat.items():
        fit = []
        for r in rows:
            try:
                builder(r)
                fit.append(r)
            except PromptTooLong:
                continue
            if len(fit) == per_cat:
                break
        t0 = time.perf_counter()
        res = runner.play(policy, fit) if fit else []
        out[cat] = (len(res), sum(r.grade.passed for r in res) / max(len(res), 1), time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", default=str(SOURCES))
    ap.add_argument("--model", default=None, help="a checkpoint dir for the model pass rate (omit: scripted only)")
    ap.add_argument("--model-rows", type=int, default=4)
    ap.add_argument("--max-prompt-tokens", type=int, default=8192)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--engine", default="auto")
    args = ap.parse_args()
    by_cat: dict[str, list[dict]] = defaultdict(list)
    print(f"{'category':28s} {'rows':>5s} {'rejected':>8s} {'truth':>6s} {'episodes/s':>10s}")
    for source, env_class in ENVS.items():
        rows, rejected = episode_rows(Path(args.sources), source)
        for r in rows:
            by_cat[r["metadata"]["category"]].append(r)
        t0 = time.perf_counter()
        results = run_episodes(env_class(), TurnScript(), rows)
        rate = len(rows) / (time.perf_counter() - t0)
        for cat in sorted({r["metadata"]["category"] for r in rows}):
            mine = [res for res, r in zip(results, rows, strict=True) if r["metadata"]["category"] == cat]
            rej = sum(1 for x in rejected if x and x.rsplit("_", 1)[0] == cat)
            print(f"{cat:28s} {len(mine):5d} {rej:8d} {sum(m.grade.reward for m in mine) / len(mine):6.3f} {rate:10.2f}")
    if args.model:
        print(f"\ngreedy episodes of {args.model} (first {args.model_rows} rows per category within "
              f"{args.max_prompt_tokens} prompt tokens, {args.max_new_tokens} new tokens per turn)")
        for cat, (n, rate, secs) in model_pass_rates(args.model, by_cat, args.model_rows, args.max_prompt_tokens,
                                                      args.max_new_tokens, args.engine).items():
            print(f"{cat:28s} episodes {n:3d}  pass rate {rate:.3f}  {secs:6.1f} s")


if __name__ == "__main__":
    main()

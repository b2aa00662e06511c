"""SWE tasks, agent episodes and test-time refinement, measured on this machine.

    python -m benchmarks.swe [--rows 8] [--rounds 3] [--max-new-tokens 192]

1. build: ``cascade swe_tasks``'s function with ``params.yaml``'s ``swe_tasks`` budget (MBPP tiny
   repositories + the registered toolz package), into a temporary directory: tasks by source,
   sandboxed test runs, wall seconds;
2. episodes: the scripted oracle (applies the known fix) and no-op policies through the real agent
   loop on every built task: reward and seconds per episode (grading included);
3. solve: ``cascade solve``'s loop with SmolLM2-135M-Instruct on the first ``--rows`` problems of
   the MBPP validation split (``data/sets/rl/code``), greedy, public-test feedback: pass rate by round.

Needs ``data/ingested`` and ``data/sets/rl/code`` (``dvc repro build``) and the SmolLM2 asset.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import polars as pl
import yaml


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    args = ap.parse_args()
    from curation.params import check_params
    from curation.swe.tasks import run_swe_tasks
    from stages.checkpoints import load_checkpoint
    from stages.environment import load_rl_rows
    from stages.rollout import HFRolloutEngine, SamplingConfig
    from stages.solve import SolveConfig, solve
    from tests.swe_policies import ScriptedPolicy
    from validators.episodes import run_episodes
    from validators.swe.environment import SWEEnvironment

    params = check_params(yaml.safe_load(Path("params.yaml").read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        m = run_swe_tasks(params.swe_tasks, params.sources.registry, Path("data/ingested"),
                          Path(tmp) / "swe", Path(tmp))
        build_s = time.perf_counter() - t0
        print("## build (params.yaml swe_tasks)")
        print(f"tasks {m['rows_out']} {m['tasks_by_source']} | candidates {m['rows_in']} | rejected "
              f"{m['rejected_by_reason']} | mutants enumerated {m['mutants_enumerated']} | sandboxed test runs "
              f"{m['test_runs']} | build {build_s:.1f} s")
        rows = pl.concat([pl.read_parquet(Path(tmp) / "swe" / f"{s}.parquet") for s in ("train", "validation")]).to_dicts()
        env = SWEEnvironment(Path(tmp) / "swe")
        print("\n## episodes (real agent loop, sandboxed tools, grading included)")
        print(f"{'policy':8} {'tasks':>5} {'reward':>7} {'mean s/episode':>15} {'tiny s':>7} {'toolz s':>8}")
        for name, policy in (("oracle", ScriptedPolicy.oracle(env)), ("noop", ScriptedPolicy.noop())):
            res = []
            for row in rows:  # one at a time: per-episode wall seconds
                res += run_episodes(env, policy, [row])
            tiny = [r.wall_s for r, row in zip(res, rows, strict=True) if row["source"] != "toolz"]
            pkg = [r.wall_s for r, row in zip(res, rows, strict=True) if row["source"] == "toolz"]
            print(f"{name:8} {len(res):5d} {_mean([r.grade.reward for r in res]):7.3f} "
                  f"{_mean([r.wall_s for r in res]):15.2f} {_mean(tiny):7.2f} {_mean(pkg):8.2f}")
    model, tok = load_checkpoint("data/assets/SmolLM2-135M-Instruct")
    cfg = SolveConfig(rows=args.rows, rounds=args.rounds, max_new_tokens=args.max_new_tokens)
    engine = HFRolloutEngine(model.eval(), tok, SamplingConfig(max_new_tokens=cfg.max_new_tokens))
    report = solve(engine, tok, load_rl_rows("data/sets/rl/code", "validation", limit=args.rows), cfg)
    print(f"\n## cascade solve: SmolLM2-135M-Instruct, {report['problems']} MBPP validation problems, greedy, "
          f"public-test feedback, {args.max_new_tokens} new tokens")
    print(f"{'round':>5} {'pass rate':>9} {'public ok':>9} {'active':>6} {'gen s':>7} {'verify s':>8}")
    for r in report["rounds"]:
        print(f"{r['round']:5d} {r['pass_rate']:9.3f} {r['checked_rate']:9.3f} {r['active']:6d} "
              f"{r['generate_s']:7.1f} {r['verify_s']:8.1f}")
    print(json.dumps({"solved_round": report["solved_round"]}))


if __name__ == "__main__":
    main()

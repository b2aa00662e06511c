"""Trainer-side reward cost: one verl ``compute_score`` call per response (what verl's reward
manager does) through the persistent verifier pool, against a ``verify_batch`` started per call and
against ``verify`` in-process (no time limit), on real rows of the RL release.

    python -m benchmarks.rewards [--release release/rl] [--n 60]

Reads the release built by the README's first command. Prints milliseconds per response and the
ratios in one run (the cores are shared and noisy: compare ratios, not absolute times).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from curation.release_loader import load_release
from validators.rewards import shared_pool
from validators.rewards.verl import compute_score
from validators.verifiers import verify, verify_batch

CONFIGS = ("math", "stem_mcqa", "tool_calling", "structured_output", "instruction_following")


def samples(release: Path, n: int) -> list[tuple[str, dict]]:
    """(response, row) pairs, ``n`` per config: a boxed ground truth where there is one, else the prompt."""
    out = []
    for config in CONFIGS:
        for row in list(load_release(release, config, "validation"))[:n]:
            gt = json.loads(row["ground_truth"] or "null") or {}
            out.append((f"\\boxed{{{gt['answer']}}}" if "answer" in gt else
                        row["responses_create_params"]["input"][-1]["content"], row))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", default="release/rl", type=Path)
    ap.add_argument("--n", type=int, default=12, help="rows per config")
    args = ap.parse_args()
    cases = samples(args.release, args.n)
    shared_pool().verify(["warm-up"], [cases[0][1]])  # workers started once per process, as in a trainer

    def per_call(fn) -> tuple[float, list[float]]:
        start = time.perf_counter()
        rewards = [fn(resp, row) for resp, row in cases]
        return 1e3 * (time.perf_counter() - start) / len(cases), rewards

    extra = lambda row: {k: row[k] for k in ("uuid", "agent_ref", "instruction_id_list", "kwargs", "metadata")} | {
        "tools": row["responses_create_params"]["tools"]}
    pool_ms, pool_r = per_call(lambda r, row: compute_score(row["domain"], r, row["ground_truth"], extra(row))["score"])
    batch_ms, batch_r = per_call(lambda r, row: verify_batch([r], [row])[0].reward)
    local_ms, local_r = per_call(lambda r, row: verify(r, row).reward)
    assert pool_r == batch_r == local_r, "the three paths disagree"
    print(f"{len(cases)} responses over {', '.join(CONFIGS)}; identical rewards on every path "
          f"(mean {sum(pool_r) / len(pool_r):.3f})")
    print("| path | ms / response | x pool |\n|---|---|---|")
    for name, ms in [("compute_score (shared VerifierPool)", pool_ms), ("verify_batch per call", batch_ms),
                     ("verify in-process (no time limit)", local_ms)]:
        print(f"| {name} | {ms:.1f} | {ms / pool_ms:.2f} |")


if __name__ == "__main__":
    main()

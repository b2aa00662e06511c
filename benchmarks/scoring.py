"""Scoring time of a GRPO step: the training environment's one verifier pool for the whole run
(``stages.environment.VerifierEnvironment``, what a stage now holds) against a ``verify_batch`` pool
started for every step (what it did before), on real rows of the RL release.

    python -m benchmarks.scoring [--release release/rl] [--steps 8] [--prompts 4] [--group 4]

A step scores ``prompts x group`` responses (the default stage's 4 x 4), prompts drawn round-robin
over the release's configs (:data:`benchmarks.rewards.CONFIGS`; a boxed ground truth or the prompt
as the response). The pooled figure includes its one worker start-up, spread over ``--steps``.
Prints milliseconds per step and the ratio in one run (the cores are shared and noisy: compare
ratios, not absolute times); both paths must give identical rewards.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.rewards import samples
from stages.environment import VerifierEnvironment
from validators.verifiers import verify_batch


def steps(release: Path, n_steps: int, prompts: int, group: int) -> list[tuple[list[str], list[dict]]]:
    """``n_steps`` batches of ``prompts x group`` (response, row) pairs, prompt-major as a GRPO step's."""
    cases = samples(release, max(1, (n_steps * prompts) // 5 + 1))
    out = []
    for s in range(n_steps):
        chosen = [cases[(s * prompts + p) % len(cases)] for p in range(prompts)]
        out.append(([r for r, _ in chosen for _ in range(group)], [row for _, row in chosen for _ in range(group)]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", default="release/rl", type=Path)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4, help="prompts_per_step")
    ap.add_argument("--group", type=int, default=4, help="group_size")
    ap.add_argument("--timeout-s", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    batches = steps(args.release, args.steps, args.prompts, args.group)

    start = time.perf_counter()
    before = [[v.reward for v in verify_batch(resp, rows, timeout_s=args.timeout_s, workers=args.workers)]
              for resp, rows in batches]
    before_ms = 1e3 * (time.perf_counter() - start) / len(batches)

    start = time.perf_counter()
    env = VerifierEnvironment(timeout_s=args.timeout_s, workers=args.workers)
    try:
        after = [[s[0] for s in env.score(resp, rows)] for resp, rows in batches]
    finally:
        env.close()
    after_ms = 1e3 * (time.perf_counter() - start) / len(batches)

    assert before == after, "the two paths disagree"
    n = args.prompts * args.group
    print(f"{len(batches)} GRPO steps of {args.prompts} prompts x {args.group} responses ({n} verdicts a step), "
          f"{args.workers} workers; identical rewards (mean {sum(map(sum, after)) / (n * len(after)):.3f})")
    print("| scoring path | ms / step | ms / response | x pooled |\n|---|---|---|---|")
    for name, ms in [("one VerifierPool for the run (now)", after_ms), ("verify_batch per step (before)", before_ms)]:
        print(f"| {name} | {ms:.0f} | {ms / n:.1f} | {ms / after_ms:.2f} |")


if __name__ == "__main__":
    main()

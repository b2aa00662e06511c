"""Verifier throughput on the real sets: verdicts per second per verifier.

    python -m benchmarks.verifiers [--workers 2]

Reads the fetched sources (``data/sources``, ``cascade fetch``) through the registry's adapters, so
it needs no pipeline output. Each verifier grades responses that should pass (reference solutions,
ground truths): the table reports how many did, and the rate in one process (``verify``) and
through ``verify_batch`` (worker processes, per-sample wall clock; worker start-up included).
The real-case builders here are shared with ``tests/test_verify_real.py``.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Any

from common.io import Rejects
from corpora.registry import load_registry
from curation.ingest import ingest_source, source_root

SOURCES_CACHE = str(Path(__file__).resolve().parents[1] / "data" / "sources")
Case = tuple[str, dict[str, Any]]


@functools.cache
def real_rows(name: str, cache: str = SOURCES_CACHE) -> tuple[dict[str, Any], ...]:
    """The canonical rows of registry source ``name``, ingested from the fetched ``cache``."""
    spec = {s.name: s for s in load_registry()}[name]
    return tuple(ingest_source(spec, source_root(spec, Path(cache)), Rejects("ingest")).rows)


def humaneval_cases() -> list[Case]:
    """(prompt + canonical solution as a fenced response, row) for every HumanEval problem."""
    out = []
    for row in real_rows("humaneval"):
        gt, meta = json.loads(row["ground_truth"]), json.loads(row["metadata"])
        out.append((f"```python\n{gt['prompt']}{meta['canonical_solution']}```", row))
    return out


def mbpp_cases() -> list[Case]:
    """(reference solution, row) for every MBPP problem (the mbpp_solutions SFT answer is the code)."""
    code = {json.loads(r["metadata"])["task_id"]: r["messages"][-1]["content"] for r in real_rows("mbpp_solutions")}
    return [(code[json.loads(r["metadata"])["task_id"]], r) for r in real_rows("mbpp_problems")]


def math500_cases() -> list[Case]:
    """(reference solution, row) for every MATH-500 problem (solutions from the MATH test set)."""
    solution = {r["messages"][0]["content"]: r["messages"][1]["content"] for r in real_rows("math_solutions")}
    return [(solution[json.loads(r["metadata"])["question"]], r) for r in real_rows("math500")]


def bfcl_response(row: dict[str, Any]) -> str:
    """A response holding BFCL's first acceptable value per argument (optional ones omitted)."""
    def first(values: list[Any]) -> Any:
        return literal([v for v in values if v != ""][0])

    def literal(v: Any) -> Any:
        if isinstance(v, list):
            return [literal(x) for x in v]
        if isinstance(v, dict) and v and all(isinstance(x, list) for x in v.values()):
            return {k: first(x) for k, x in v.items() if [a for a in x if a != ""]}
        return v
    blocks = [json.dumps({"name": name, "arguments": {k: first(v) for k, v in args.items() if [a for a in v if a != ""]}})
              for call in json.loads(row["ground_truth"])["calls"] for name, args in call.items()]
    return "".join(f"<tool_call>{b}</tool_call>" for b in blocks) or "No tool fits this request."


def mcqa_cases() -> list[Case]:
    """(boxed gold letter, row) for the ARC items."""
    return [(f"The answer is \\boxed{{{json.loads(r['ground_truth'])['answer']}}}.", r) for r in real_rows("arc")]


def reasoning_gym_cases() -> list[Case]:
    """(``<answer>gold</answer>``, row) for the reasoning-gym items."""
    return [(f"<answer>{json.loads(r['ground_truth'])['answer']}</answer>", r) for r in real_rows("reasoning_gym_math")]


def if_cases() -> list[Case]:
    """(the prompt echoed back, row) for IFEval + IFBench: a real text to check every constraint on."""
    from validators.verifiers import check_row

    out = []
    for name in ("ifeval", "ifbench_prompts"):
        for r in real_rows(name):
            try:
                check_row(r)
            except ValueError:
                continue
            out.append((r["responses_create_params"]["input"][-1]["content"], r))
    return out


def main() -> None:
    """Print the verdicts/s table."""
    from validators.verifiers import verify, verify_batch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    sets = {
        "math (MATH-500 solutions)": math500_cases(),
        "reasoning_gym (6 generators)": reasoning_gym_cases(),
        "code (HumanEval canonical)": humaneval_cases(),
        "code (MBPP reference)": mbpp_cases(),
        "mcqa (ARC)": mcqa_cases(),
        "instruction_following (IFEval+IFBench)": if_cases(),
        "tool_call (BFCL ground truth)": [(bfcl_response(r), r) for r in real_rows("bfcl")],
    }
    print(f"{'verifier (set)':42s} {'n':>6s} {'passed':>7s} {'1 proc/s':>9s} {f'batch x{args.workers}/s':>11s}")
    for label, cases in sets.items():
        responses, rows = [c[0] for c in cases], [c[1] for c in cases]
        if label.startswith("code"):
            single = "-"  # sandboxed runs: measured through the batch runner only
        else:
            t = time.perf_counter()
            for resp, row in cases:
                try:
                    verify(resp, row)
                except ValueError:
                    pass
            single = f"{len(cases) / (time.perf_counter() - t):9.1f}"
        t = time.perf_counter()
        verdicts = verify_batch(responses, rows, timeout_s=30, workers=args.workers)
        rate = len(cases) / (time.perf_counter() - t)
        print(f"{label:42s} {len(cases):6d} {sum(v.passed for v in verdicts):7d} {single:>9s} {rate:11.1f}")


if __name__ == "__main__":
    main()

"""What the `full` benchmark preset would take here, from the throughput of a measured `cascade eval` run.

    python -m benchmarks.eval_estimate metrics/recovery/benchmarks/sft.json [params.yaml]

For each benchmark of the measured result: sampled tokens (greedy + samples, from the mean answer lengths it
recorded) per second of its wall time; then, for each benchmark of the `full` preset (params.yaml), its rows
(`curation.benchmarks.load_benchmark`, less those a training split holds) x (1 + the measured run's samples)
answers at two lengths: the measured mean length (the answers stop as they did under the laptop budget; a
benchmark not measured takes that of a measured one graded by the same verifier) and the full preset's
`max_new_tokens` (every answer runs to the budget: the upper bound). The tokens/s of the measured run
(all its benchmarks together) converts both to hours. An estimate for SmolLM2-135M on this machine: a larger
model or a GPU changes the throughput, not the method.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def main(path: str, params: str = "params.yaml") -> None:
    from curation.benchmarks import held_out, load_benchmark, trained_uuids
    from stages.benchmark_eval import EvalSettings

    result = json.loads(Path(path).read_text(encoding="utf-8"))
    k = result["settings"]["samples"]
    tokens, seconds = 0.0, 0.0
    print(f"measured: {path} (preset {result.get('preset')}, {result['wall_s']} s in all)")
    print(f"{'benchmark':<15}{'rows':>6}{'tokens':>10}{'s':>8}{'tok/s':>8}")
    for name, b in result["benchmarks"].items():
        n = b["rows"]
        t = n * b.get("response_tokens", 0) + n * k * b.get("sample_response_tokens", 0)
        tokens, seconds = tokens + t, seconds + b["wall_s"]
        print(f"{name:<15}{n:>6}{t:>10.0f}{b['wall_s']:>8.0f}{t / b['wall_s']:>8.0f}")
    rate = tokens / seconds
    print(f"{'all':<15}{'':>6}{tokens:>10.0f}{seconds:>8.0f}{rate:>8.0f}")
    settings = EvalSettings.model_validate(yaml.safe_load(Path(params).read_text())["benchmarks"])
    trained = trained_uuids()
    verifier = {}  # agent_ref -> a measured mean answer length
    for name, b in result["benchmarks"].items():
        verifier.setdefault(load_benchmark(name).rows[0]["agent_ref"], b.get("sample_response_tokens"))
    likely_s = bound_s = 0.0
    print(f"\nfull preset at {rate:.0f} tokens/s ({1 + k} answers per prompt):")
    for name, cap in settings.caps("full").items():
        try:
            rows = held_out(load_benchmark(name).rows, trained)[0]
        except Exception as exc:  # a Hub benchmark offline
            print(f"{name:<15} not here ({type(exc).__name__}: {str(exc)[:80]})")
            continue
        measured = result["benchmarks"].get(name)
        mean = ((measured or {}).get("sample_response_tokens") or verifier.get(rows[0]["agent_ref"])
                or cap.max_new_tokens)
        answers = len(rows) * (1 + k)
        likely, bound = answers * mean / rate, answers * cap.max_new_tokens / rate
        likely_s, bound_s = likely_s + likely, bound_s + bound
        print(f"{name:<15}{len(rows):>7} rows  likely {likely / 3600:6.2f} h  at most {bound / 3600:6.2f} h"
              + ("" if measured else "  (length of a benchmark with its verifier)"))
    print(f"{'full':<15}{'':>7}       likely {likely_s / 3600:6.2f} h  at most {bound_s / 3600:6.2f} h")


if __name__ == "__main__":
    main(*sys.argv[1:3])

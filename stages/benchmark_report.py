"""The benchmark table of ``cascade report``: one row per stage, one column per benchmark, from the results of
``cascade eval`` (:mod:`stages.benchmark_eval`) named after the stages (``<results_dir>/<stage>.json``).

Each cell is the greedy accuracy with its 95 % bootstrap interval over prompts and, below it, the paired delta
against the stage's init checkpoint (the stage it started from) on the prompts both answered; pass@k likewise
in a second table. A stage without a result is left out of the table (and named in ``missing``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stages.bootstrap import paired_delta
from stages.report import metric_values


def benchmark_table(stages: list[str], inits: dict[str, str | None], results_dir: str | Path) -> dict[str, Any]:
    """``{"results_dir", "benchmarks": [name], "stages": [stage], "missing": [stage], "accuracy": {stage: {name:
    {mean, ci_low, ci_high, n}}}, "pass_at_k": {stage: {name: {...}}}, "k", "deltas": {stage: {name: {delta,
    ci_low, ci_high, n, init}}}, "wall_s": {stage: seconds}}``.

    ``inits[stage]``: the stage whose checkpoint ``stage`` started from (deltas are paired against it when it
    has a result). Raises ValueError when a result file is not a ``cascade eval`` result (names it).
    """
    results: dict[str, dict[str, Any]] = {}
    for stage in stages:
        path = Path(results_dir) / f"{stage}.json"
        if path.exists():
            result = json.loads(path.read_text(encoding="utf-8"))
            if "benchmarks" not in result:
                raise ValueError(f"{path}: not a `cascade eval` result (no 'benchmarks')")
            results[stage] = result
    names: list[str] = []
    for result in results.values():
        names += [n for n in result["benchmarks"] if n not in names]
    accuracy, pass_at_k, deltas, k = {}, {}, {}, None
    for stage, result in results.items():
        blocks = result["benchmarks"]
        accuracy[stage] = {n: b["accuracy"] for n, b in blocks.items() if "accuracy" in b}
        pass_at_k[stage] = {}
        for n, b in blocks.items():
            key = next((key for key in b if key.startswith("pass@") and key != "pass@1@t"), None)
            if key:
                k, pass_at_k[stage][n] = key, b[key]
        init = inits.get(stage)
        if init in results:
            deltas[stage] = {n: {**d, "init": init} for n, d in paired_deltas(result, results[init]).items()}
    return {"results_dir": str(results_dir), "benchmarks": names, "stages": list(results),
            "missing": [s for s in stages if s not in results], "accuracy": accuracy, "pass_at_k": pass_at_k,
            "k": k, "deltas": deltas, "wall_s": {s: r.get("wall_s") for s, r in results.items()}}


def _cell(iv: dict[str, float] | None, delta: dict[str, float] | None = None) -> str:
    if not iv:
        return "-"
    cell = f"{iv['mean']:.3f} [{iv['ci_low']:.3f}, {iv['ci_high']:.3f}]"
    if delta:
        cell += f"<br>Δ {delta['delta']:+.3f} [{delta['ci_low']:+.3f}, {delta['ci_high']:+.3f}]"
    return cell


def markdown(table: dict[str, Any]) -> str:
    """The table as Markdown (accuracy with deltas, then pass@k), with the n of each benchmark."""
    names = table["benchmarks"]
    if not names:
        return ""
    n = {name: next((table["accuracy"][s][name]["n"] for s in table["stages"] if name in table["accuracy"][s]), 0)
         for name in names}
    head = f"| stage | {' | '.join(f'{name} (n {n[name]})' for name in names)} |"
    lines = ["Benchmarks (`cascade eval`, greedy accuracy, mean [95 % bootstrap CI]; Δ paired against the stage's "
             "init checkpoint):", "", head, "|---|" + "---|" * len(names)]
    for s in table["stages"]:
        d = table["deltas"].get(s, {})
        lines.append(f"| {s} | " + " | ".join(_cell(table["accuracy"][s].get(x), d.get(x)) for x in names) + " |")
    if table["k"]:
        lines += ["", f"{table['k']} at the eval's temperature:", "", head, "|---|" + "---|" * len(names)]
        for s in table["stages"]:
            lines.append(f"| {s} | " + " | ".join(_cell(table["pass_at_k"][s].get(x)) for x in names) + " |")
    if table["missing"]:
        lines += ["", f"No `cascade eval` result for: {', '.join(table['missing'])}."]
    return "\n".join(lines) + "\n"


def print_table(table: dict[str, Any]) -> None:
    """The accuracy table on the console (rich)."""
    from rich.console import Console
    from rich.table import Table

    if not table["benchmarks"]:
        return
    t = Table(title=f"benchmarks ({table['results_dir']}): greedy accuracy [95 % CI], Δ paired against the init")
    t.add_column("stage")
    for name in table["benchmarks"]:
        t.add_column(name, justify="right")
    for s in table["stages"]:
        d = table["deltas"].get(s, {})
        t.add_row(s, *(_cell(table["accuracy"][s].get(x), d.get(x)).replace("<br>", "\n") for x in table["benchmarks"]))
    Console(width=200).print(t)


def paired_deltas(after: dict[str, Any], before: dict[str, Any], metric: str = "accuracy") -> dict[str, Any]:
    """``{benchmark: {delta, ci_low, ci_high, n}}``: ``after`` minus ``before`` (two
    :func:`stages.benchmark_eval.evaluate_checkpoint` results) on the prompts both answered, paired bootstrap
    (:func:`stages.bootstrap.paired_delta`); ``metric`` ``accuracy`` (greedy pass) or ``pass@k`` (a passing
    sample among k)."""
    key = "pass_rate" if metric == "accuracy" else metric
    out = {}
    for name, a in after["benchmarks"].items():
        b = before["benchmarks"].get(name)
        if b and "scores" in a and "scores" in b:
            delta = paired_delta(metric_values(a["scores"], key), metric_values(b["scores"], key))
            if delta:
                out[name] = delta
    return out

"""``cascade report``: per-domain validation across the cascade's stages, the regressions, what MOPD
recovered, and the lineage (dataset hashes) of every checkpoint.

Reads the checkpoint registry (``<checkpoint_root>/<stage>/cascade_checkpoint.json``, written by every
stage, see :mod:`stages.checkpoints`) for the stages of ``cascade.order`` and writes:

  ``metrics/cascade_report.json``  table, regressions, recoveries, lineage (a DVC metric)
  ``plots/cascade_report.csv``     one row per stage, one column per domain
  ``plots/cascade_report.png``     one line per domain across the stages; regressions marked, MOPD shaded

A *regression* is a stage whose value for a domain is below the best value of any earlier stage by
more than ``tolerance``. For a MOPD stage (runner ``mopd``), *recovered* is, per domain that had
regressed before it, ``after - before`` and the fraction ``(after - before) / (best - before)`` of the
gap to the best earlier checkpoint it closed (``before``: the stage that MOPD started from).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from common.io import atomic_path, write_json
from stages.checkpoints import read_record

REPORT_JSON = Path("metrics/cascade_report.json")
REPORT_CSV = Path("plots/cascade_report.csv")
REPORT_PNG = Path("plots/cascade_report.png")


def build_report(stages: list[str], checkpoint_root: str | Path, metric: str = "reward",
                 tolerance: float = 0.0) -> dict[str, Any]:
    """The report of ``stages`` (in cascade order) from their checkpoint records.

    Returns ``{"metric", "stages": [{"stage", "runner", "status"}], "domains", "table": {stage: {domain:
    value | None}}, "regressions": [{stage, domain, value, best, best_stage}], "recovered": [{stage,
    domain, before, after, best, best_stage, recovered, fraction}], "lineage": {stage: {...}}}``.
    ``status`` is ``trained`` | ``skipped`` (``enabled: false``) | ``missing`` (no record yet).

    Raises:
        ValueError: no stage in ``stages`` has a record under ``checkpoint_root``.
    """
    root = Path(checkpoint_root)
    records = {s: read_record(root / s) for s in stages}
    if not any(records.values()):
        raise ValueError(f"no checkpoint record under {root} for any of {stages}: run the cascade first (dvc repro)")
    domains = sorted({d for rec in records.values() if rec for d in rec.get("validation", {})})
    table: dict[str, dict[str, float | None]] = {}
    rows, regressions, recovered, lineage = [], [], [], {}
    best: dict[str, tuple[float, str]] = {}  # domain -> best value so far and its stage
    previous: str | None = None
    for stage in stages:
        rec = records[stage]
        status = "missing" if rec is None else "skipped" if rec["train"]["counts"].get("skipped") else "trained"
        rows.append({"stage": stage, "runner": rec["runner"] if rec else None, "status": status})
        if rec is None:
            continue
        values = {d: rec.get("validation", {}).get(d, {}).get(metric) for d in domains}
        table[stage] = values
        lineage[stage] = {k: rec.get(k) for k in ("init", "lineage", "datasets", "parent_datasets", "teachers")
                          if k in rec}
        for d, v in values.items():
            if v is None:
                continue
            if d in best and v < best[d][0] - tolerance:
                regressions.append({"stage": stage, "domain": d, "value": v, "best": best[d][0],
                                    "best_stage": best[d][1]})
            before = table.get(previous, {}).get(d) if previous else None
            mopd = status == "trained" and rec["runner"] == "mopd"
            if mopd and before is not None and d in best and before < best[d][0] - tolerance:
                gap = best[d][0] - before
                recovered.append({"stage": stage, "domain": d, "before": before, "after": v, "best": best[d][0],
                                  "best_stage": best[d][1], "recovered": v - before, "fraction": (v - before) / gap})
            if d not in best or v > best[d][0]:
                best[d] = (v, stage)
        previous = stage
    return {"metric": metric, "tolerance": tolerance, "stages": rows, "domains": domains, "table": table,
            "regressions": regressions, "recovered": recovered, "lineage": lineage}


def write_report(report: dict[str, Any], json_path: Path = REPORT_JSON, csv_path: Path = REPORT_CSV,
                 png_path: Path = REPORT_PNG) -> None:
    """Write the JSON, the CSV table and the PNG (each to a temp file, then renamed)."""
    write_json(report, json_path)
    with atomic_path(csv_path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["stage", *report["domains"]])
        for stage, values in report["table"].items():
            w.writerow([stage, *("" if values[d] is None else f"{values[d]:.4f}" for d in report["domains"])])
    plot_report(report, png_path)


def plot_report(report: dict[str, Any], png_path: Path) -> None:
    """One line per domain over the stages; red ``v`` on regressions, MOPD stages shaded (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(report["table"])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(stages)), 4))
    runners = {r["stage"]: r["runner"] for r in report["stages"]}
    for x, s in enumerate(stages):
        if runners[s] == "mopd":
            ax.axvspan(x - 0.4, x + 0.4, color="tab:green", alpha=0.12, label="MOPD")
    for d in report["domains"]:
        pts = [(x, report["table"][s][d]) for x, s in enumerate(stages) if report["table"][s][d] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=d)
    reg = [(stages.index(r["stage"]), r["value"]) for r in report["regressions"]]
    if reg:
        ax.scatter([p[0] for p in reg], [p[1] for p in reg], marker="v", s=90, color="red", zorder=3,
                   label="regression")
    ax.set_xticks(range(len(stages)), stages, rotation=20)
    ax.set_ylabel(f"validation {report['metric']}")
    ax.set_title("per-domain validation across the cascade")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)


def print_report(report: dict[str, Any]) -> None:
    """The per-stage table (regressions red with ``v``, MOPD recoveries green with ``+``) and the lineage."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    marks = {(r["stage"], r["domain"]): "v" for r in report["regressions"]}
    rec = {(r["stage"], r["domain"]): r for r in report["recovered"]}
    t = Table(title=f"validation {report['metric']} per domain and stage (v: regression, +: recovered by MOPD)")
    t.add_column("stage")
    t.add_column("runner")
    for d in report["domains"]:
        t.add_column(d, justify="right")
    for row in report["stages"]:
        s = row["stage"]
        if row["status"] == "missing":
            t.add_row(s, "-", *["not run"] * len(report["domains"]))
            continue
        cells = []
        for d in report["domains"]:
            v = report["table"][s][d]
            cell = "-" if v is None else f"{v:.3f}"
            if (s, d) in rec:
                cell = f"[green]{cell} +{rec[(s, d)]['recovered']:.3f}[/green]"
            if (s, d) in marks:
                cell = f"[red]{cell} v[/red]"
            cells.append(cell)
        t.add_row(s, row["runner"] + (" (skipped)" if row["status"] == "skipped" else ""), *cells)
    console.print(t)
    for r in report["recovered"]:
        console.print(f"MOPD ({r['stage']}) {r['domain']}: {r['before']:.3f} -> {r['after']:.3f} "
                      f"(best earlier {r['best']:.3f} at {r['best_stage']}; {r['fraction']:.0%} of the gap closed)")
    lt = Table(title="lineage: datasets (md5) each checkpoint was trained on")
    for col in ("stage", "init", "datasets", "teachers"):
        lt.add_column(col)
    for s, lin in report["lineage"].items():
        ds = "\n".join(f"{k} {v.removeprefix('md5:')[:10]}" for k, v in (lin.get("datasets") or {}).items()) or "-"
        teachers = "\n".join(f"{d}: {p}" for d, p in (lin.get("teachers") or {}).items()) or "-"
        lt.add_row(s, str(lin.get("init")), ds, teachers)
    console.print(lt)


def run_report(params: dict[str, Any]) -> dict[str, Any]:
    """``cascade report`` body: build, write and print the report of ``params``' cascade; returns it.

    Raises:
        ValueError: a stage of the order has no checkpoint record (names it).
    """
    cascade = params.get("cascade") or {}
    settings = cascade.get("report", {})
    root = cascade.get("defaults", {}).get("checkpoint_root", "data/checkpoints")
    report = build_report(cascade.get("order", []), root, settings.get("metric", "reward"),
                          settings.get("tolerance", 0.0))
    write_report(report)
    print_report(report)
    print(f"wrote {REPORT_JSON}, {REPORT_CSV}, {REPORT_PNG}")
    return report

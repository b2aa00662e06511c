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
from stages.bootstrap import domain_mean_delta_ci, interval, paired, paired_delta
from stages.checkpoints import read_record, read_scores

REPORT_JSON = Path("metrics/cascade_report.json")
REPORT_CSV = Path("plots/cascade_report.csv")
REPORT_PNG = Path("plots/cascade_report.png")


def metric_values(scores: dict[str, Any], metric: str) -> tuple[list[str], list[float]] | None:
    """``(uuids, per-prompt values)`` of ``metric`` from one domain's validation scores
    (:func:`stages.evaluate.evaluate`), or ``None`` when they do not hold it. ``reward`` / ``pass_rate``:
    the greedy answer's reward / pass; ``pass@k``: any of the ``k`` samples passed; ``reward@t...``: the
    samples' mean reward."""
    rows = scores.get("sample_passed")
    if metric == "reward":
        values = scores.get("reward")
    elif metric == "pass_rate":
        values = [float(p) for p in scores.get("passed", [])] if "passed" in scores else None
    elif metric.startswith("pass@") and rows is not None and metric == f"pass@{len(rows[0]) if rows else 0}":
        values = [float(any(p)) for p in rows]
    elif metric.startswith("reward@t") and "sample_rewards" in scores:
        values = [sum(r) / len(r) for r in scores["sample_rewards"]]
    else:
        return None
    return (list(scores["uuid"]), [float(v) for v in values]) if values is not None else None


def build_report(stages: list[str], checkpoint_root: str | Path, metric: str = "reward",
                 tolerance: float = 0.0, confidence: float = 0.95,
                 domain_groups: dict[str, list[str]] | None = None,
                 recovery_stages: tuple[str, ...] = ()) -> dict[str, Any]:
    """The report of ``stages`` (in cascade order) from their checkpoint records and per-prompt scores.

    Returns ``{"metric", "tolerance", "confidence", "stages": [{"stage", "runner", "status"}], "domains",
    "table": {stage: {domain: value | None}}, "intervals": {stage: {domain: {mean, ci_low, ci_high, n}}},
    "pass_at_k": {stage: {domain: {...}}}, "deltas": [{stage, init, domain, delta, ci_low, ci_high, n}],
    "regressions": [{stage, domain, value, best, best_stage, ...}], "recovered": [{stage, domain, before,
    after, best, best_stage, recovered, fraction, ...}], "lineage": {stage: {...}}}``. ``status`` is
    ``trained`` | ``skipped`` (``enabled: false``) | ``missing`` (no record yet).

    With per-prompt scores (:data:`stages.checkpoints.SCORES_FILE`) every interval is a 95 % (``confidence``)
    percentile bootstrap over prompts (:mod:`stages.bootstrap`), ``deltas`` are paired against the
    stage's init checkpoint (the stage before it), and a *regression* (a value below the best earlier
    stage's by more than ``tolerance``) is flagged only when the paired interval of the difference
    excludes 0; each carries ``delta``/``ci_low``/``ci_high`` against the best stage. Without scores
    the point values decide. For a MOPD stage (runner ``mopd``), ``recovered`` lists every domain whose
    value before it (its init) is below the best earlier one by more than ``tolerance``: ``after -
    before`` and the fraction ``(after - before) / (best - before)`` of the gap closed, with
    ``regressed`` (whether that drop was flagged) and the paired interval of ``after - before``.
    ``domain_groups`` (``{stage: [domain, ...]}``, e.g. the three domains multi-domain RL trains) adds
    ``group_deltas``: the mean over those domains of the stage's paired deltas against its init, with a
    stratified bootstrap interval (:func:`stages.bootstrap.domain_mean_delta_ci`). ``recovery_stages``: further
    stages whose ``recovered`` entries are listed as a MOPD stage's are (the alternative MOPD is compared with).

    Raises:
        ValueError: no stage in ``stages`` has a record under ``checkpoint_root``.
    """
    root = Path(checkpoint_root)
    records = {s: read_record(root / s) for s in stages}
    if not any(records.values()):
        raise ValueError(f"no checkpoint record under {root} for any of {stages}: run the cascade first (dvc repro)")
    scores = {s: read_scores(root / s) for s in stages if records[s]}
    domains = sorted({d for rec in records.values() if rec for d in rec.get("validation", {})})
    table: dict[str, dict[str, float | None]] = {}
    intervals: dict[str, dict[str, dict[str, float]]] = {}
    pass_at_k: dict[str, dict[str, dict[str, float]]] = {}
    rows, deltas, regressions, recovered, lineage = [], [], [], [], {}
    best: dict[str, tuple[float, str]] = {}  # domain -> best value so far and its stage
    flagged: set[str] = set()  # domains with a flagged regression so far
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
        per_prompt = {d: metric_values(scores[stage].get(d, {}), metric) for d in domains}
        intervals[stage] = {d: interval(v[1], confidence) for d, v in per_prompt.items() if v and v[1]}
        k_metric = next((key for d in domains for key in rec.get("validation", {}).get(d, {})
                         if key.startswith("pass@")), None)
        if k_metric:
            pass_at_k[stage] = {d: interval(v[1], confidence) for d in domains
                                if (v := metric_values(scores[stage].get(d, {}), k_metric)) and v[1]}
        for d, v in values.items():
            if v is None:
                continue
            delta = None  # against the init checkpoint (the stage before)
            if status == "trained" and previous is not None:
                delta = paired_delta(per_prompt[d], metric_values(scores[previous].get(d, {}), metric), confidence)
                if delta is not None:
                    deltas.append({"stage": stage, "init": previous, "domain": d, **delta})
            if d in best and v < best[d][0] - tolerance:
                against = paired_delta(per_prompt[d], metric_values(scores[best[d][1]].get(d, {}), metric), confidence)
                if against is None or against["ci_high"] < 0:
                    flagged.add(d)
                    regressions.append({"stage": stage, "domain": d, "value": v, "best": best[d][0],
                                        "best_stage": best[d][1], **(against or {})})
            before = table.get(previous, {}).get(d) if previous else None
            mopd = status == "trained" and (rec["runner"] == "mopd" or stage in recovery_stages)
            if mopd and before is not None and d in best and before < best[d][0] - tolerance:
                gap = best[d][0] - before
                recovered.append({"stage": stage, "domain": d, "before": before, "after": v, "best": best[d][0],
                                  "best_stage": best[d][1], "recovered": v - before, "fraction": (v - before) / gap,
                                  "regressed": d in flagged,
                                  **({f"change_{k}": delta[k] for k in ("ci_low", "ci_high")} if delta else {})})
            if d not in best or v > best[d][0]:
                best[d] = (v, stage)
        previous = stage
    group_deltas = []
    for stage, group in (domain_groups or {}).items():
        ordered = [s for s in stages if records.get(s)]
        if stage not in ordered or ordered.index(stage) == 0:
            continue
        init = ordered[ordered.index(stage) - 1]
        pairs = []
        for d in group:
            after, before = (metric_values(scores[s].get(d, {}), metric) for s in (stage, init))
            if after is None or before is None:
                raise ValueError(f"cascade.report.domain_groups.{stage}: no per-prompt {metric!r} of {d!r} for "
                                 f"{stage} and {init}")
            pairs.append(paired(after, before))
        d, lo, hi = domain_mean_delta_ci(pairs, confidence)
        group_deltas.append({"stage": stage, "init": init, "domains": list(group), "delta": d, "ci_low": lo,
                             "ci_high": hi})
    return {"metric": metric, "tolerance": tolerance, "confidence": confidence, "stages": rows, "domains": domains,
            "table": table, "intervals": intervals, "pass_at_k": pass_at_k, "deltas": deltas,
            "group_deltas": group_deltas, "regressions": regressions, "recovered": recovered, "lineage": lineage}


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
    intervals = report.get("intervals", {})
    for d in report["domains"]:
        pts = [(x, report["table"][s][d]) for x, s in enumerate(stages) if report["table"][s][d] is not None]
        ci = [intervals.get(s, {}).get(d) for x, s in enumerate(stages) if report["table"][s][d] is not None]
        if all(ci) and ci:  # bootstrap intervals: error bars around the per-prompt mean
            ax.errorbar([p[0] for p in pts], [c["mean"] for c in ci], capsize=3, marker="o", label=d,
                        yerr=[[c["mean"] - c["ci_low"] for c in ci], [c["ci_high"] - c["mean"] for c in ci]])
        else:
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
    t = Table(title=f"validation {report['metric']} per domain and stage [bootstrap CI where per-prompt scores "
                    f"exist] (v: regression, +: recovered by MOPD)")
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
            v, iv = report["table"][s][d], report.get("intervals", {}).get(s, {}).get(d)
            cell = "-" if v is None else f"{v:.3f}" + (f" [{iv['ci_low']:.3f}, {iv['ci_high']:.3f}]" if iv else "")
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
    for g in report.get("group_deltas", []):
        console.print(f"{g['stage']}: mean over {', '.join(g['domains'])} {g['delta']:+.3f} "
                      f"[{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] against {g['init']} (paired, stratified bootstrap)")
    lt = Table(title="lineage: datasets (md5) each checkpoint was trained on")
    for col in ("stage", "init", "datasets", "teachers"):
        lt.add_column(col)
    for s, lin in report["lineage"].items():
        ds = "\n".join(f"{k} {v.removeprefix('md5:')[:10]}" for k, v in (lin.get("datasets") or {}).items()) or "-"
        teachers = "\n".join(f"{d}: {p}" for d, p in (lin.get("teachers") or {}).items()) or "-"
        lt.add_row(s, str(lin.get("init")), ds, teachers)
    console.print(lt)


def summary_json(report: dict[str, Any], wall_s: float | None = None) -> dict[str, Any]:
    """The report's numbers in the documented schema (docs/learning/README.md)::

        {"wall_s", "metric", "confidence", "stages": [{"stage", "status", "domains": {domain: {"mean",
         "ci_low", "ci_high", "n", "pass_at_k": {...}}}}], "deltas": [{"stage", "domain", "delta", "ci_low",
         "ci_high"}], "regressions": [...], "recovered": [...], "curves": {stage: {...}}}

    ``stages`` holds every stage with per-prompt scores (a skipped first stage is the base model);
    ``deltas`` are paired against each trained stage's init checkpoint."""
    stages = []
    for row in report["stages"]:
        intervals = report["intervals"].get(row["stage"])
        if not intervals:
            continue
        k = report["pass_at_k"].get(row["stage"], {})
        stages.append({"stage": row["stage"], "status": row["status"],
                       "domains": {d: {**v, **({"pass_at_k": k[d]} if d in k else {})} for d, v in intervals.items()}})
    keep = ("stage", "domain", "delta", "ci_low", "ci_high", "n", "init")
    return {"wall_s": wall_s, "metric": report["metric"], "confidence": report["confidence"], "stages": stages,
            "deltas": [{k: d[k] for k in keep} for d in report["deltas"]],
            "group_deltas": report.get("group_deltas", []),
            "regressions": report["regressions"], "recovered": report["recovered"],
            "branches": report.get("branches", {}), "benchmarks": report.get("benchmarks"),
            "curves": report.get("curves", {})}


CURVES = ("reward_mean", "entropy", "kl", "reverse_kl", "logprob_diff", "groups_filtered", "response_tokens",
          "truncated", "grad_norm")


def curve_summary(stages: list[str], metrics_dir: str | Path, window: int = 3) -> dict[str, dict[str, Any]]:
    """``{stage: {curve: {"first", "last", "steps"}}}``: the mean of each :data:`CURVES` value over the
    first and the last ``window`` logged steps of every stage with a step log
    (``<metrics_dir>/<stage>/steps.jsonl``): the numbers that say why a stage did or did not learn."""
    import json

    out: dict[str, dict[str, Any]] = {}
    for stage in stages:
        log = Path(metrics_dir) / stage / "steps.jsonl"
        if not log.exists():
            continue
        rows = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        curves = {}
        for name in CURVES:
            values = [r[name] for r in rows if isinstance(r.get(name), int | float) and r[name] == r[name]]
            if values:
                curves[name] = {"first": sum(values[:window]) / len(values[:window]),
                                "last": sum(values[-window:]) / len(values[-window:]), "steps": len(values)}
        out[stage] = curves
    return out


def markdown_table(report: dict[str, Any]) -> str:
    """The per-domain table as Markdown: ``mean [ci_low, ci_high]`` per stage (with the paired delta
    against the stage's init below it, ``v`` on a flagged regression), and pass@k."""
    deltas = {(d["stage"], d["domain"]): d for d in report["deltas"]}
    flagged = {(r["stage"], r["domain"]) for r in report["regressions"]}
    domains = report["domains"]
    pct = int(round(report["confidence"] * 100))
    lines = [f"| stage | {' | '.join(domains)} |", "|---|" + "---|" * len(domains)]
    passed: list[str] = []
    for row in report["stages"]:
        iv = report["intervals"].get(row["stage"])
        if not iv:
            continue
        cells = []
        for d in domains:
            if d not in iv:
                cells.append("-")
                continue
            cell = f"{iv[d]['mean']:.3f} [{iv[d]['ci_low']:.3f}, {iv[d]['ci_high']:.3f}]"
            if (row["stage"], d) in deltas:
                x = deltas[(row["stage"], d)]
                cell += f"<br>Δ {x['delta']:+.3f} [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]"
            if (row["stage"], d) in flagged:
                cell += " **v**"
            cells.append(cell)
        if row["status"] == "skipped" and row is not report["stages"][0]:
            passed.append(row["stage"])  # a pass-through later in the order repeats its init's row
            continue
        name = row["stage"] + (" (skipped: the base model)" if row["status"] == "skipped" else "")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    lines.append("")
    lines.append(f"{report['metric']} of the greedy answer per held-out prompt, mean [{pct} % bootstrap CI]; "
                 f"Δ: paired against the stage's init checkpoint; **v**: a regression (below the best earlier "
                 f"stage, paired CI excluding 0)." + (f" Disabled, passing their init through: {', '.join(passed)}."
                                                       if passed else ""))
    for g in report.get("group_deltas", []):
        lines += ["", f"{g['stage']}: mean over {', '.join(g['domains'])} of the paired deltas against {g['init']}: "
                      f"{g['delta']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] (stratified bootstrap)."]
    if report["pass_at_k"]:
        lines += ["", f"| stage | {' | '.join(domains)} |", "|---|" + "---|" * len(domains)]
        for stage, iv in report["pass_at_k"].items():
            if stage in passed:
                continue
            lines.append(f"| {stage} | " + " | ".join(
                f"{iv[d]['mean']:.3f} [{iv[d]['ci_low']:.3f}, {iv[d]['ci_high']:.3f}]" if d in iv else "-"
                for d in domains) + " |")
        lines += ["", "pass@k of the answers sampled per prompt (k: the eval's `samples`, at its `temperature`)."]
    return "\n".join(lines) + "\n"


def write_docs(report: dict[str, Any], out_dir: str | Path, wall_s: float | None = None) -> None:
    """``report.json`` (:func:`summary_json`), ``report.md`` (:func:`markdown_table`) and ``report.png``
    under ``out_dir``, each written to a temp file and renamed."""
    out = Path(out_dir)
    write_json(summary_json(report, wall_s), out / "report.json")
    from stages.benchmark_report import markdown
    from stages.report_branches import branches_markdown

    text = markdown_table(report) + branches_markdown(report)
    if report.get("benchmarks"):
        text += "\n" + markdown(report["benchmarks"])
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    plot_report(report, out / "report.png")


def run_report(params: dict[str, Any], docs_dir: str | Path | None = None, wall_s: float | None = None
               ) -> dict[str, Any]:
    """``cascade report`` body: build, write and print the report of ``params``' cascade, and with
    ``docs_dir`` its :func:`write_docs` files there (``wall_s``: the run's wall time); returns it.

    ``cascade.report.compare`` (``{stage: alternative}``, e.g. ``{mopd: grpo_more}``): an alternative stage
    from the same init (a stage outside ``order`` whose ``init`` is the stage's) is reported beside it:
    ``branches[alternative]`` holds its deltas, its ``recovered`` entries and ``versus`` (stage minus
    alternative, paired per domain). ``cascade.report.benchmarks_dir`` (default ``metrics/benchmarks``): where
    ``cascade eval`` wrote ``<stage>.json``; the benchmark table (:mod:`stages.benchmark_report`) has a row for
    every stage (and alternative) with a result.

    Raises:
        ValueError: a stage of the order has no checkpoint record (names it); a ``compare`` key outside
            ``order``.
    """
    from stages.benchmark_report import benchmark_table, print_table
    from stages.report_branches import versus

    cascade = params.get("cascade") or {}
    settings = cascade.get("report", {})
    defaults = cascade.get("defaults", {})
    order = list(cascade.get("order", []))
    root = defaults.get("checkpoint_root", "data/checkpoints")
    metric, tolerance = settings.get("metric", "reward"), settings.get("tolerance", 0.0)
    report = build_report(order, root, metric, tolerance, domain_groups=settings.get("domain_groups"))
    inits: dict[str, str | None] = {s: order[i - 1] if i else None for i, s in enumerate(order)}
    report["branches"] = {}
    for stage, alt in (settings.get("compare") or {}).items():
        if stage not in order:
            raise ValueError(f"cascade.report.compare: {stage!r} is not in cascade.order {order}")
        branch = build_report([alt if s == stage else s for s in order[:order.index(stage) + 1]], root, metric,
                              tolerance, recovery_stages=(alt,))
        inits[alt] = inits[stage]
        report["branches"][alt] = {"replaces": stage, "init": inits[stage],
                                   "interval": branch["intervals"].get(alt, {}),
                                   "deltas": [d for d in branch["deltas"] if d["stage"] == alt],
                                   "recovered": [r for r in branch["recovered"] if r["stage"] == alt],
                                   "versus": versus(root, stage, alt, metric)}
    report["curves"] = curve_summary([*order, *report["branches"]], defaults.get("metrics_dir", "metrics/train"))
    report["benchmarks"] = benchmark_table([*order, *report["branches"]], inits,
                                           settings.get("benchmarks_dir", "metrics/benchmarks"))
    write_report(report)
    print_report(report)
    print_table(report["benchmarks"])
    print(f"wrote {REPORT_JSON}, {REPORT_CSV}, {REPORT_PNG}")
    if docs_dir is not None:
        write_docs(report, docs_dir, wall_s)
        print(f"wrote {docs_dir}/report.json, report.md, report.png")
    return report

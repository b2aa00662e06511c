"""File-level wrappers of the pipeline steps: read inputs, call the pure step
function, write outputs, metrics and rejects. ``dvc.yaml`` runs each through
the ``cascade`` CLI; the paths below are the ones it declares.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import polars as pl

from corpora.registry import load_models, load_registry
from corpora.schema import SCHEMAS
from curation.io import Rejects, finish_step, read_parquet, write_json, write_parquet

SOURCES = Path("data/sources")
ASSETS = Path("data/assets")
INGESTED = Path("data/ingested")
DEDUPED = Path("data/dedup")
DECONTAMINATED = Path("data/decontaminated")
SETS = Path("data/sets")
RELEASE = Path("release")
KINDS = ("sft", "rl")


def _registry(params: dict[str, Any]):
    src = params["sources"]
    return load_registry(src["registry"], src.get("only"))


def _load(path: Path) -> pl.DataFrame:
    return pl.from_arrow(read_parquet(path))


def step_fetch(params: dict[str, Any]) -> dict[str, Any]:
    from corpora.fetch import run_fetch

    return run_fetch(_registry(params), SOURCES, load_models(params["sources"]["registry"]))


def step_asset(params: dict[str, Any]) -> list[str]:
    from corpora.assets import build_asset

    return [str(build_asset(m, SOURCES, ASSETS)) for m in load_models(params["sources"]["registry"])]


def step_ingest(params: dict[str, Any]) -> dict[str, Any]:
    from curation.ingest import run_ingest

    return run_ingest(_registry(params), SOURCES, INGESTED)


def step_dedup(params: dict[str, Any]) -> dict[str, Any]:
    from curation.dedup import dedup_stats, exact_dedup

    rejects, rows_in, rows_out, stats = Rejects("dedup"), 0, 0, {}
    for kind in KINDS:
        df = _load(INGESTED / f"{kind}.parquet")
        kept, dupes = exact_dedup(df, kind, normalized=params["dedup"]["normalize"])
        rejects.extend_frame(dupes)
        write_parquet(kept.to_arrow(), DEDUPED / f"{kind}.parquet", SCHEMAS[kind])
        rows_in, rows_out = rows_in + len(df), rows_out + len(kept)
        stats[kind] = {"rows_in": len(df), "rows_out": len(kept), **dedup_stats(kept, dupes)}
    return finish_step("dedup", rows_in, rows_out, rejects, per_table=stats)


def step_decontaminate(params: dict[str, Any]) -> dict[str, Any]:
    from curation.decontaminate import decontaminate

    p = params["decontaminate"]
    bench = _load(INGESTED / "benchmarks.parquet")
    rejects, rows_in, rows_out, stats = Rejects("decontaminate"), 0, 0, {}
    for kind in KINDS:
        df = _load(DEDUPED / f"{kind}.parquet")
        clean, dirty, st = decontaminate(df, kind, bench, int(p["ngram"]), int(p["max_train_doc_freq"]))
        rejects.extend_frame(dirty)
        write_parquet(clean.to_arrow(), DECONTAMINATED / f"{kind}.parquet", SCHEMAS[kind])
        rows_in, rows_out = rows_in + len(df), rows_out + len(clean)
        stats[kind] = {"rows_in": len(df), "rows_out": len(clean), **st}
    totals: dict[str, int] = {}
    for st in stats.values():
        for b, n in st["contaminated_by_benchmark"].items():
            totals[b] = totals.get(b, 0) + n
    per_bench = bench.group_by("source").len().sort("source")
    return finish_step("decontaminate", rows_in, rows_out, rejects, ngram=int(p["ngram"]),
                       benchmark_items=dict(zip(per_bench["source"], per_bench["len"], strict=True)),
                       contaminated_by_benchmark=dict(sorted(totals.items())), per_table=stats)


def step_validate(params: dict[str, Any]) -> dict[str, Any]:
    """Run the GX suites; raises ``SystemExit`` with the report when one fails."""
    from validators.dataset import run_suite

    reports = {kind: run_suite(_load(DECONTAMINATED / f"{kind}.parquet"), kind, kind) for kind in KINDS}
    rows = sum(r.rows for r in reports.values())
    metrics = finish_step("validate", rows, rows, Rejects("validate"),
                          suites={k: r.as_dict() for k, r in reports.items()})
    failed = [f"{k}: {line}" for k, r in reports.items() for line in r.failures]
    if failed:
        raise SystemExit("validation failed:\n  " + "\n  ".join(failed))
    return metrics


def step_build(params: dict[str, Any]) -> dict[str, Any]:
    from curation.build import build_sets

    sft, rl = (_load(DECONTAMINATED / f"{k}.parquet") for k in KINDS)
    sets, capped, stats = build_sets(sft, rl, params["build"])
    rejects = Rejects("build")
    for frame in capped:
        rejects.extend_frame(frame)
    out_rows = 0
    for name, splits in sets.items():
        for split, df in splits.items():
            write_parquet(df.to_arrow(), SETS / name / f"{split}.parquet", SCHEMAS[name.split("/")[0]])
            out_rows += len(df)
    return finish_step("build", len(sft) + len(rl), out_rows, rejects, **stats)


def _read_sets(kind: str) -> dict[str, dict[str, pl.DataFrame]]:
    """``{config: {split: table}}`` of a kind; SFT configs are the SFT domains."""
    if kind == "rl":
        return {d.name: {f.stem: _load(f) for f in sorted(d.glob("*.parquet"))}
                for d in sorted((SETS / "rl").iterdir()) if d.is_dir()}
    out: dict[str, dict[str, pl.DataFrame]] = {}
    for f in sorted((SETS / "sft").glob("*.parquet")):
        for (domain,), df in _load(f).group_by("domain", maintain_order=True):
            out.setdefault(domain, {})[f.stem] = df
    return out


def step_export(params: dict[str, Any]) -> dict[str, Any]:
    from curation.release import export_release

    p = params["export"]
    specs = load_registry(params["sources"]["registry"])
    manifest = json.loads((SOURCES / "manifest.json").read_text())
    rejects, rows_in, rows_out, stats = Rejects("export"), 0, 0, {}
    for kind in KINDS:
        sets = _read_sets(kind)
        refused, st = export_release(sets, kind, RELEASE / kind, specs, manifest,
                                     list(p.get("allow_licenses") or []), int(p["rows_per_shard"]))
        if len(refused):
            rejects.extend_frame(refused)
        n_in = sum(len(df) for splits in sets.values() for df in splits.values())
        n_out = sum(sum(s.values()) for s in st["configs"].values())
        rows_in, rows_out = rows_in + n_in, rows_out + n_out
        stats[kind] = st
    return finish_step("export", rows_in, rows_out, rejects, refused_by_source=rejects.by_source(),
                       releases=stats)


STEPS = {
    "fetch": step_fetch, "asset": step_asset, "ingest": step_ingest, "dedup": step_dedup,
    "decontaminate": step_decontaminate, "validate": step_validate, "build": step_build,
    "export": step_export,
}
ORDER = ["ingest", "dedup", "decontaminate", "validate", "build", "export"]


def summary(root: Path = Path(".")) -> list[dict[str, Any]]:
    """One dict per data step that has run: rows in/out/rejected and rejects by reason."""
    out = []
    for step in ORDER:
        path = root / "metrics" / f"{step}.json"
        if path.exists():
            m = json.loads(path.read_text())
            out.append({"step": step, "in": m["rows_in"], "out": m["rows_out"],
                        "rejected": m["rows_rejected"], "reasons": m["rejected_by_reason"],
                        "seconds": m.get("wall_seconds")})
    return out


def run_step(name: str, params: dict[str, Any]) -> Any:
    """Run step ``name`` and add ``wall_seconds`` to its metrics file."""
    t0 = time.perf_counter()
    result = STEPS[name](params)
    path = Path("metrics") / f"{name}.json"
    if isinstance(result, dict) and path.exists():
        m = json.loads(path.read_text())
        m["wall_seconds"] = round(time.perf_counter() - t0, 2)
        write_json(m, path)
    return result

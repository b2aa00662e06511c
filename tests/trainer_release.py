"""The releases the trainer-integration tests read (tests/test_trainer_*.py).

``release/rl`` and ``release/sft`` when the README's first command built them; otherwise a small
release built by the same code (``curation.build.build_sets`` + ``curation.release.export_release``)
from real rows of every RL domain's sources, ingested from the fetched ``data/sources``.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import yaml

from corpora.schema import SCHEMAS

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / "release"
ROWS_PER_SOURCE = 40
RL_SOURCES = ("math_problems", "mbpp_problems", "arc", "bfcl", "arena_hard_prompts")
SFT_SOURCES = ("sharegpt", "math_solutions", "mbpp_solutions", "tooltalk_conversations")
#: derived RL sources, shrunk: {name: options}
DERIVED = {"if_rl_prompts": {"count": {"sharegpt": 30, "arena_hard_prompts": 10}},
           "structured_output_tasks": {"count": 40},
           "long_context_tasks": {"lengths": [4096], "per_length": 2}}


def _rows(names: tuple[str, ...], cache: Path, qwen3_dir: Path) -> dict[str, list[dict]]:
    from common.io import Rejects
    from corpora.registry import load_registry
    from curation.ingest import ingest_source, source_root
    from validators.verifiers import check_row

    specs = {s.name: s for s in load_registry()}
    rows: dict[str, list[dict]] = {}
    for name in names:
        spec = specs[name]
        if spec.kind == "derived":
            options = {**spec.options, **DERIVED[name]}
            if "tokenizer" in options:
                options["tokenizer"] = str(qwen3_dir)
            spec = spec.model_copy(update={"options": options})
            seeds = {s: rows.get(s) or ingest_source(specs[s], source_root(specs[s], cache), Rejects("t")).rows
                     for s in spec.patterns}
            got = ingest_source(spec, Path("."), Rejects("t"), seeds).rows
        else:
            got = ingest_source(spec, source_root(spec, cache), Rejects("t")).rows
        rows[name] = got
    out = {}
    for name in names:
        kept = rows[name]
        if SCHEMAS_KIND.get(name) == "rl":
            kept = [r for r in kept if _checks(check_row, r)]
        # rows spread over the whole source, so every category is in (BFCL's irrelevance rows are last)
        out[name] = kept if name in DERIVED else kept[::max(1, len(kept) // ROWS_PER_SOURCE)][:ROWS_PER_SOURCE]
    return out


def _checks(check_row, row: dict) -> bool:
    try:
        check_row(row)
    except ValueError:
        return False
    return True


SCHEMAS_KIND = {**{n: "rl" for n in (*RL_SOURCES, *DERIVED)}, **{n: "sft" for n in SFT_SOURCES}}


def build_releases(out: Path, cache: Path, qwen3_dir: Path) -> Path:
    """``out/rl`` and ``out/sft``: a small release of real rows (every config of the RL release:
    each domain's set and the ``multi_domain`` / ``mopd`` mixes of params.yaml)."""
    from curation.build import build_sets
    from curation.params import BuildParams
    from curation.release import export_release

    params = yaml.safe_load((REPO / "params.yaml").read_text())["build"]
    params = {**params, "rl_validation_rows": 8, "rl_validation_fraction": 0.5, "sft_validation_rows": 4,
              "mixes": {k: {**v, "total": 40} for k, v in params["mixes"].items()}}
    rows = _rows((*SFT_SOURCES, *RL_SOURCES, *DERIVED), cache, qwen3_dir)
    frames = {kind: pl.from_arrow(pa.Table.from_pylist(
        [r for n, rs in rows.items() if SCHEMAS_KIND[n] == kind for r in rs], schema=SCHEMAS[kind]))
        for kind in ("sft", "rl")}
    sets, _, _ = build_sets(frames["sft"], frames["rl"], BuildParams.model_validate(params))
    rl = {name.removeprefix("rl/"): splits for name, splits in sets.items() if name.startswith("rl/")}
    sft = {domain: {split: df.filter(pl.col("domain") == domain) for split, df in sets["sft"].items()}
           for domain in frames["sft"]["domain"].unique().to_list()}
    export_release(rl, "rl", out / "rl", [], {}, [], 1000)
    export_release(sft, "sft", out / "sft", [], {}, [], 1000)
    return out


def releases(tmp_root: Path, cache: Path, qwen3_dir: Path) -> Path:
    """``release/`` when built (README's first command), else :func:`build_releases` under ``tmp_root``."""
    if (RELEASE / "rl" / "README.md").exists() and (RELEASE / "sft" / "README.md").exists():
        return RELEASE
    return build_releases(tmp_root, cache, qwen3_dir)

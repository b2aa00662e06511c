"""Release export in the Hugging Face Hub layout, and the push to the Hub.

Layout of one release directory (``release/sft`` or ``release/rl``)::

    README.md                                   dataset card (YAML header + provenance)
    <config>/<split>-00000-of-00002.parquet     one config per domain

``datasets.load_dataset(<dir>, <config>)`` reads it back with every value
unchanged but each message padded with the schema's absent keys (null);
:func:`curation.release_loader.load_release`, and the card's "Loading" snippet,
drop them again. Shards hold every exported row or nothing is written
(:func:`shard_count`). Rows whose license is not in
:data:`corpora.registry.COMMERCIAL_LICENSES` are refused (reason
``license_refused``) unless the license is listed in ``allow_licenses``.
Split and config names are validated before anything is written or uploaded.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import yaml

from common.io import atomic_dir, write_parquet
from corpora.registry import COMMERCIAL_LICENSES, SourceSpec
from corpora.schema import SCHEMAS
from curation.release_loader import drop_absent_keys

#: What ``datasets`` accepts as a split name (``datasets.splits`` uses the same rule).
SPLIT_NAME = re.compile(r"^\w+(\.\w+)*$")
CONFIG_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")
ROWS_PER_SHARD = "export.rows_per_shard"
CARD_PATH = "<this repo or folder>"  # the path in the card's loading snippet
MAX_SHARDS = 99_999  # shard files are <split>-00000-of-99999.parquet (push_release checks the 5 digits)
#: Licenses the Hub has no identifier for: a card with one of them says ``license: other`` and names it in
#: ``license_name``, as NVIDIA's SFT card does.
HUB_OTHER_LICENSES = frozenset({"nvidia-open-model-license"})


def check_split_names(names: list[str]) -> None:
    """Raise ValueError listing every name ``datasets`` would refuse as a split."""
    bad = [n for n in names if not SPLIT_NAME.fullmatch(n)]
    if bad:
        raise ValueError(f"invalid split names {bad!r}: a split name must match {SPLIT_NAME.pattern}")


def license_reason(df: pl.DataFrame, allow_licenses: list[str]) -> pl.DataFrame:
    """``df`` plus a ``reason`` column: null for a row that may be exported, else
    ``license_refused: <license> is not cleared for release``. Per row (the ``export`` map).

    A license is cleared when it is in :data:`COMMERCIAL_LICENSES` or ``allow_licenses``; a
    ``mixed:<a>,<b>`` license when each part is.
    """
    cleared = sorted(COMMERCIAL_LICENSES | set(allow_licenses))
    # a row built from several sources carries "mixed:<a>,<b>": every part must be cleared
    ok = (pl.col("license").str.strip_prefix("mixed:").str.split(",")
          .list.eval(pl.element().is_in(cleared)).list.all())
    return df.with_columns(pl.when(ok).then(None).otherwise(
        pl.format("license_refused: {} is not cleared for release", "license")).alias("reason"))


def split_refused(marked: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(exportable rows without ``reason``, refused rows with it) of :func:`license_reason`'s output."""
    refused = pl.col("reason").is_not_null()
    return marked.filter(~refused).drop("reason"), marked.filter(refused)


def license_filter(df: pl.DataFrame, allow_licenses: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split rows into (exportable, refused-with-reason): :func:`license_reason` then :func:`split_refused`."""
    return split_refused(license_reason(df, allow_licenses))


def check_rows_per_shard(value: Any) -> int:
    """``value`` when it is a whole number >= 1 (not a bool), else ValueError naming the params key."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"params.yaml {ROWS_PER_SHARD}: expected a whole number >= 1, got {value!r}")
    return value


def shard_count(rows: int, rows_per_shard: Any, where: str) -> int:
    """How many shard files ``rows`` rows of ``where`` (``kind/config/split``) take (0 for none).

    Raises:
        ValueError: naming ``export.rows_per_shard`` when it is not a whole number >= 1 or when
            the shards would be more than :data:`MAX_SHARDS` (the 5-digit file names).
    """
    n = math.ceil(rows / check_rows_per_shard(rows_per_shard))
    if n > MAX_SHARDS:
        raise ValueError(f"params.yaml {ROWS_PER_SHARD}: {rows_per_shard} gives {n} shards for {where} "
                         f"({rows} rows), file names hold at most {MAX_SHARDS}; set at least "
                         f"{math.ceil(rows / MAX_SHARDS)}")
    return n


def _loading(kind: str, layout: dict[str, dict[str, Any]]) -> list[str]:
    """The card's "Loading" section: a snippet (``datasets`` only) restoring the messages' key sets."""
    config = next(iter(layout), "<config>")
    split = next(iter(layout.get(config, {})), "train")
    get = ('messages, tools = row["messages"], json.loads(row["tools"]) or None' if kind == "sft" else
           'messages, tools = row["responses_create_params"]["input"], '
           'json.loads(row["responses_create_params"]["tools"]) or None')
    return ["## Loading", "",
            "Parquet gives every message every key of the message schema (`tool_calls: None` on a plain user",
            "turn). A null optional key is an absent key of the source row: the transform below drops them, so a",
            "chat template that tests a key (`'tool_calls' in message`) renders exactly what the source renders.",
            "`tools` and tool-call `arguments` are JSON strings, kept byte for byte.", "",
            "```python", "import json", "", "from datasets import load_dataset", "", "",
            inspect.getsource(drop_absent_keys).rstrip(), "", "",
            f'ds = load_dataset("{CARD_PATH}", "{config}", split="{split}").with_transform(drop_absent_keys)',
            "row = ds[0]", get,
            "# text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)", "```", "",
            "Indexing, iteration, column access and `map` see the transformed rows; `to_list()` and",
            "`to_pandas()` read the padded Arrow table. With cascade-rl installed:",
            "`curation.release_loader.load_release(path, config, split)` does the same."]


def _card(title: str, kind: str, layout: dict[str, dict[str, dict[str, int]]], licenses: list[str],
          provenance: list[dict[str, Any]]) -> str:
    """The dataset card; ``layout[config][split]`` = {num_examples, num_bytes, download_size}. Its
    ``license`` is the one license of every row (lower case), else ``other``; a license the Hub has
    no identifier for (:data:`HUB_OTHER_LICENSES`) is ``other`` with ``license_name``."""
    total = sum(s["num_examples"] for splits in layout.values() for s in splits.values())
    size = "n<1K" if total < 1_000 else "1K<n<10K" if total < 10_000 else "10K<n<100K" if total < 100_000 else "100K<n<1M"
    named = licenses[0] if len(licenses) == 1 and licenses[0] in HUB_OTHER_LICENSES else None
    header = {
        "license": "other" if len(licenses) != 1 or named else licenses[0].lower(),
        **({"license_name": named} if named else {}),
        "license_details": ", ".join(licenses),
        "size_categories": [size],
        "task_categories": ["text-generation"],
        "tags": ["nemotron-cascade-2", "post-training", kind],
        "configs": [{"config_name": c, "data_files": [{"split": sp, "path": f"{c}/{sp}-*.parquet"} for sp in splits]}
                    for c, splits in layout.items()],
        "dataset_info": [{"config_name": c,
                          "splits": [{"name": sp, "num_bytes": s["num_bytes"], "num_examples": s["num_examples"]}
                                     for sp, s in splits.items()],
                          "download_size": sum(s["download_size"] for s in splits.values()),
                          "dataset_size": sum(s["num_bytes"] for s in splits.values())}
                         for c, splits in layout.items()],
    }
    lines = ["---", yaml.safe_dump(header, sort_keys=False).rstrip(), "---", "", f"# {title}", "",
             (f"{kind.upper()} data rebuilt by cascade-rl (Nemotron-Cascade 2 recipe, arXiv 2603.19220): "
              "normalized, exactly deduplicated and decontaminated against the benchmark sources."), "",
             "## Configs", "", "| config | split | rows |", "|---|---|---|"]
    lines += [f"| {c} | {sp} | {s['num_examples']} |" for c, splits in layout.items() for sp, s in splits.items()]
    lines += ["", *_loading(kind, layout)]
    lines += ["", "## Provenance", "", "| source | release | license | rows | archive sha256 |", "|---|---|---|---|---|"]
    lines += [f"| {p['source']} | {p['release']} | {p['license']} | {p['rows']} | {p['sha256']} |" for p in provenance]
    return "\n".join(lines) + "\n"


SetTable = pl.DataFrame | Callable[[], Iterable[pl.DataFrame]]
"""A split of a set: its table, or a function that streams its rows in batches (memory: a batch)."""


def export_release(sets: dict[str, dict[str, SetTable]], kind: str, out_dir: Path,
                   specs: list[SourceSpec], manifest: dict[str, Any], allow_licenses: list[str],
                   rows_per_shard: int, marked: bool = False,
                   on_refused: Callable[[pl.DataFrame], None] | None = None,
                   counts: dict[tuple[str, str], int] | None = None) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Write one release directory for ``kind`` ('sft' | 'rl') atomically.

    Args:
        sets: ``{config: {split: table or reader}}``; configs are domains. A reader is called twice
            (once to count, once to write) and streams batches, so memory holds a shard, not a split.
        on_refused: called with each batch of refused rows (with ``reason``), in order, instead of
            returning them all.
        specs: the registry (provenance per source); manifest: fetch manifest.
        marked: the tables already carry :func:`license_reason`'s ``reason`` column (mapped over
            the set files by an executor); otherwise it is computed here.
        counts: ``{(config, split): rows to export}`` when the caller has counted them (on the
            license column alone): each split is then read once, not twice; a split whose rows
            differ from its count raises ValueError once it is read.

    Returns:
        (refused rows with ``reason``, stats {config: {split: rows}}).

    Raises:
        ValueError: on an invalid split or config name, or a ``rows_per_shard`` that is not a
            whole number >= 1 or gives a split more than :data:`MAX_SHARDS` shards (naming
            ``export.rows_per_shard``), before anything is written.
    """
    check_split_names(sorted({sp for splits in sets.values() for sp in splits}))
    bad = [c for c in sets if not CONFIG_NAME.fullmatch(c)]
    if bad:
        raise ValueError(f"invalid config names {bad!r}")
    check_rows_per_shard(rows_per_shard)

    def parts(key: tuple[str, str]) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
        table = sets[key[0]][key[1]]
        for df in ([table] if isinstance(table, pl.DataFrame) else table()):
            yield split_refused(df) if marked else license_filter(df, allow_licenses)

    keys = [(config, split) for config, splits in sorted(sets.items()) for split in splits]
    # every split is filtered and its shard count checked before the first file is written
    if counts is None:
        counts = {key: sum(len(ok) for ok, _ in parts(key)) for key in keys}
    n_shards = {key: shard_count(counts.get(key, 0), rows_per_shard, f"{kind}/{key[0]}/{key[1]}") for key in keys}
    by_name = {s.name: s for s in specs}
    schema = SCHEMAS[kind]
    layout, rows_by_source, refused = {}, {}, []
    with atomic_dir(out_dir) as staging:
        for key in keys:
            config, split = key
            n = n_shards[key]
            st = {"num_examples": 0, "num_bytes": 0, "download_size": 0}

            def write(shard: pl.DataFrame, i: int, n: int = n, st: dict = st, config: str = config,
                      split: str = split) -> None:  # shard i of n, one chunk (as a slice of the whole split was)
                path = staging / config / f"{split}-{i:05d}-of-{n:05d}.parquet"
                write_parquet(shard.rechunk(), path, schema)
                st["num_examples"] += len(shard)  # counted from the shards written; num_bytes: their uncompressed
                # Parquet size (Arrow's nbytes depends on how the rows were sliced and read, not only on them)
                meta = pq.ParquetFile(path).metadata
                st["num_bytes"] += sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
                st["download_size"] += path.stat().st_size
                for src, rows in shard.group_by("source").len().iter_rows():
                    rows_by_source[src] = rows_by_source.get(src, 0) + rows

            pending, written = pl.DataFrame(), 0
            for ok, no in parts(key):
                if len(no):
                    on_refused(no) if on_refused else refused.append(no)
                pending = pl.concat([pending, ok]) if len(pending) else ok
                while len(pending) >= rows_per_shard:
                    write(pending.head(rows_per_shard), written)
                    pending, written = pending.slice(rows_per_shard), written + 1
            if len(pending):
                write(pending, written)
                written += 1
            if st["num_examples"] != counts.get(key, 0) or written != n:
                raise ValueError(f"{kind}/{config}/{split}: read {st['num_examples']} rows to export in "
                                 f"{written} shards, counted {counts.get(key, 0)} rows ({n} shards) before: "
                                 "did the set change while it was exported?")
            if n:
                layout.setdefault(config, {})[split] = st
        provenance = []
        for src, n in sorted(rows_by_source.items()):
            spec = by_name.get(src)
            if spec is None:
                release = "?"
            elif spec.kind == "pypi":
                release = spec.requirement
            elif spec.kind == "derived":
                release = "derived from " + ", ".join(spec.patterns)
            else:
                release = ", ".join(spec.patterns)
            provenance.append({"source": src, "release": release, "license": spec.license if spec else "?",
                               "rows": n, "sha256": manifest.get(release, {}).get("sha256", "-")})
        licenses = sorted({p["license"] for p in provenance})
        (staging / "README.md").write_text(
            _card(f"cascade-rl {kind.upper()} release", kind, layout, licenses, provenance), encoding="utf-8")
    counts = {c: {sp: s["num_examples"] for sp, s in splits.items()} for c, splits in layout.items()}
    return pl.concat(refused) if refused else pl.DataFrame(), {"configs": counts}


def push_release(release_dir: Path, repo_id: str, token: str | None, private: bool = True,
                 api: Any = None) -> list[str]:
    """Upload a release directory to the Hub dataset ``repo_id``.

    Split names are re-validated from the file names before any network call.
    ``api`` defaults to ``huggingface_hub.HfApi(token=token)``; tests pass a
    recorder. Returns the uploaded paths (relative to the release dir).

    Raises:
        ValueError: on an invalid split name or an empty release directory.
    """
    files = sorted(p.relative_to(release_dir).as_posix() for p in release_dir.rglob("*") if p.is_file())
    parquet = [f for f in files if f.endswith(".parquet")]
    if not parquet:
        raise ValueError(f"{release_dir} holds no parquet shards: run `cascade export` first")
    shard = re.compile(r"^(.*)-\d{5}-of-\d{5}\.parquet$")
    check_split_names(sorted({shard.sub(r"\1", f.split("/")[-1]) for f in parquet}))
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=str(release_dir),
                      commit_message="cascade-rl release")
    return files

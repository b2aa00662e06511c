"""Decontamination as a map over training batches plus the exact reduce on the driver.

:func:`curation.decontaminate.find_contamination_tables` is a whole-corpus function: its
boilerplate and stock-phrase tiers count each n-gram's training rows over every table. A row that
shares no n-gram with the index (and equals no short question) contributes nothing to those counts
and can never match, so the map (:func:`curation.decontaminate.row_hits`, the index sent once to every
worker) returns, per batch, the index hits of the rows that have any (their uuid, prompt-side hash and
hit lists, never their text), and the reduce runs the detection on the hits of every table at once
(:func:`curation.decontaminate.detect_contamination`): the same matches, stats and reasons as on the
whole tables. The hits are streamed to the step's scratch as they come and, when there are more than
``BUCKET_HITS``, split by problem (the prompt side's hash, so each bucket's document frequencies add up)
into buckets that detection reads one at a time: memory holds one bucket of hits, not every row's
(~276 bytes a hit in detection's arrays: ~26 GB for NVIDIA's 24.8M rows at the default data's 3.8 hits a
row; docs/scale.md). A second pass streams the clean rows to the outputs and gathers the contaminated ones.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow.parquet as pq

from common.executor import Executor, compact, gather, write_frames
from common.io import PartWriters, parquet_batches, scratch
from common.take import member
from corpora.schema import SCHEMAS
from curation.decontaminate import (
    HITS_SCHEMA,
    ScannedRows,
    detect_contamination,
    hits_frame_rows,
    row_hits,
    split_contaminated,
)
from curation.ngram_index import NgramIndex

if TYPE_CHECKING:
    from curation.params import DecontaminateParams

BATCH_ROWS = 2_000
BUCKET_HITS = 2_000_000  # n-gram hits of a detection bucket, about (~0.3 KB each while detection runs on it)
SPILL_SCHEMA = {**HITS_SCHEMA, "table": pl.Utf8, "number": pl.Int64}  # a row_hits row, its kind and number


def _without(frame: pl.DataFrame, uuids: pl.Series) -> pl.DataFrame:
    return frame.filter(~member(uuids, frame["uuid"]))  # uuids sorted


def _only(frame: pl.DataFrame, uuids: pl.Series) -> pl.DataFrame:
    return compact(frame.filter(member(uuids, frame["uuid"])))


def spill_hits(ex: Executor, src: dict[str, Path], index: NgramIndex, directory: Path
               ) -> list[Callable[[], ScannedRows]]:
    """Map :func:`~curation.decontaminate.row_hits` over the tables ``src`` (``{kind: parquet}``, in that
    order) on ``ex`` into ``directory``, and return loaders of the buckets of the scanned rows
    (:func:`~curation.decontaminate.detect_contamination`): one bucket up to :data:`BUCKET_HITS` n-gram
    and exact hits, else ``ceil(hits / BUCKET_HITS)`` buckets by ``problem`` modulo their number."""
    schema = pl.DataFrame(schema=SPILL_SCHEMA).to_arrow().schema
    spill, rows, hits = directory / "hits.parquet", 0, 0
    with pq.ParquetWriter(spill, schema, write_statistics=False) as writer:
        for kind, path in src.items():
            for frame in ex.map_parquet(path, partial(row_hits, kind=kind), BATCH_ROWS, {"index": index}):
                frame = frame.with_columns(pl.lit(kind, pl.Utf8).alias("table"),
                                           pl.int_range(rows, rows + len(frame), dtype=pl.Int64).alias("number"))
                writer.write_table(frame.to_arrow().cast(schema))
                rows += len(frame)
                hits += int(frame["side"].list.len().sum() or 0) + int(frame["exact_side"].list.len().sum() or 0)
    buckets = -(-hits // BUCKET_HITS)
    if buckets <= 1:
        return [partial(_load, spill, rows)]
    with PartWriters(directory) as out:
        for batch in parquet_batches(spill, 20_000):
            frame = pl.from_arrow(batch).with_columns((pl.col("problem") % buckets).alias("_bucket"))
            for (b,), part in frame.group_by("_bucket"):
                out.write(int(b), part.drop("_bucket").to_arrow())
    spill.unlink()
    return [partial(_load, directory / f"{b}.parquet", rows) for b in sorted(out.writers)]


def _load(path: Path, total: int) -> ScannedRows:
    return hits_frame_rows(pl.read_parquet(path), total)


def decontaminate_files(ex: Executor, src: dict[str, Path], dest: dict[str, Path], index: NgramIndex,
                        p: DecontaminateParams) -> tuple[dict[str, pl.DataFrame], pl.DataFrame, dict[str, Any],
                                                         dict[str, tuple[int, int]]]:
    """Decontaminate the training tables ``src`` (``{kind: parquet}``) into ``dest`` on ``ex``, as one
    corpus, by the rule of the ``decontaminate`` params ``p`` (:meth:`DecontaminateParams.rule`).

    Returns (``{kind: contaminated rows with reason}``, matches (with ``table``), stats,
    ``{kind: (rows in, rows out)}``). :func:`~curation.decontaminate.row_hits` is mapped over the batches
    of each table, the detection runs on the hits, then the clean rows are streamed to ``dest`` and the
    contaminated ones gathered: memory holds a bucket of index hits and the contaminated rows, not the tables.
    """
    _ = index.lookup  # built once here: the workers receive it with the index instead of each rebuilding it
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="decontaminate-") as tmp:
        matches, stats = detect_contamination(spill_hits(ex, src, index, Path(tmp)), index, **p.rule())
    dirty, counts = {}, {}
    for kind in src:
        mine = matches.filter(pl.col("table") == kind)
        rows = gather(ex, src[kind], _only, BATCH_ROWS, {"uuids": mine["uuid"].unique().sort()},
                      pl.from_arrow(SCHEMAS[kind].empty_table()))
        dirty[kind] = split_contaminated(rows, mine)[1]
        rows_out = write_frames(ex.map_parquet(src[kind], _without, BATCH_ROWS, {"uuids": dirty[kind]["uuid"].sort()}),
                                dest[kind], SCHEMAS[kind])
        counts[kind] = (pq.ParquetFile(src[kind]).metadata.num_rows, rows_out)
    return dirty, matches, stats, counts

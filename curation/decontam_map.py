"""Decontamination as a map over training batches plus the exact reduce on the driver.

:func:`curation.decontaminate.decontaminate` is a whole-table function: its boilerplate guard
counts each n-gram's training rows over the whole table. A row that shares no n-gram with the
index (and equals no short question) contributes nothing to those counts and can never match,
so running it on only the rows that hit the index at all gives the same matches, stats and
reasons as on the whole table. The map (:func:`contamination_candidates`) keeps those rows, with
the index broadcast to every worker; the reduce calls ``decontaminate`` itself on the gathered
candidates; the clean rows are streamed to the output.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from common.executor import Executor, gather, write_frames
from common.io import read_parquet, write_parquet
from corpora.schema import SCHEMAS
from curation.decontaminate import NgramIndex, decontaminate, find_contamination

BATCH_ROWS = 2_000


def contamination_candidates(frame: pl.DataFrame, kind: str, index: NgramIndex) -> pl.DataFrame:
    """The rows of ``frame`` (schema ``kind``) sharing any indexed n-gram with a benchmark item or
    equal to a short question: :func:`find_contamination` with ``min_coverage`` 0 for every n and
    no boilerplate guard (a document frequency bound of ``len(frame)``), in ``frame``'s order."""
    loosest = {n: 0.0 for n in index.meta["ngrams"]}
    matches, _ = find_contamination(frame, kind, index, max(len(frame), 1), loosest)
    return frame.join(matches.select("uuid"), on="uuid", how="semi", maintain_order="left")


def _without(frame: pl.DataFrame, uuids: pl.Series) -> pl.DataFrame:
    return frame.filter(~pl.col("uuid").is_in(uuids.implode()))


def decontaminate_file(ex: Executor, src: Path, dest: Path, kind: str, index: NgramIndex, max_train_doc_freq: int,
                       min_coverage: dict[int, float]) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any], int, int]:
    """Decontaminate the table ``src`` into ``dest`` (schema ``kind``) on ``ex``.

    Returns (contaminated rows with ``reason``, matches, stats, rows in, rows out) as
    :func:`curation.decontaminate.decontaminate` gives them for the whole table. ``local`` runs
    that function on the whole table; other executors map :func:`contamination_candidates` over
    the batches of ``src`` (the index sent once to each worker) and reduce on the candidates.
    """
    if ex.kind == "local":
        train = pl.from_arrow(read_parquet(src))
        clean, dirty, matches, stats = decontaminate(train, kind, index, max_train_doc_freq, min_coverage)
        write_parquet(clean.rechunk().to_arrow(), dest, SCHEMAS[kind])  # one chunk: see write_frames
        return dirty, matches, stats, len(train), len(clean)
    _ = index.lookup  # built once here: the workers receive it with the index instead of each rebuilding it
    cands = gather(ex, src, partial(contamination_candidates, kind=kind), BATCH_ROWS, {"index": index},
                   pl.from_arrow(SCHEMAS[kind].empty_table()))
    _, dirty, matches, stats = decontaminate(cands, kind, index, max_train_doc_freq, min_coverage)
    rows_out = write_frames(ex.map_parquet(src, _without, BATCH_ROWS, {"uuids": dirty["uuid"]}), dest, SCHEMAS[kind])
    return dirty, matches, stats, pq.ParquetFile(src).metadata.num_rows, rows_out

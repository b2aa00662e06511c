"""Decontamination as a map over training batches plus the exact reduce on the driver.

:func:`curation.decontaminate.find_contamination_tables` is a whole-corpus function: its
boilerplate and stock-phrase tiers count each n-gram's training rows over every table. A row that
shares no n-gram with the index (and equals no short question) contributes nothing to those counts
and can never match, so the map (:func:`curation.decontaminate.row_hits`, the index sent once to every
worker) returns, per batch, the index hits of the rows that have any (their uuid, prompt-side hash and
hit lists, never their text), and the reduce runs the detection on the hits of every table at once
(:func:`curation.decontaminate.detect_contamination`): the same matches, stats and reasons as on the
whole tables. A second pass streams the clean rows to the outputs and gathers the contaminated ones.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow.parquet as pq

from common.executor import Executor, gather, write_frames
from common.take import member
from corpora.schema import SCHEMAS
from curation.decontaminate import HITS_SCHEMA, detect_contamination, row_hits, scanned_rows, split_contaminated
from curation.ngram_index import NgramIndex

if TYPE_CHECKING:
    from curation.params import DecontaminateParams

BATCH_ROWS = 2_000


def _without(frame: pl.DataFrame, uuids: pl.Series) -> pl.DataFrame:
    return frame.filter(~member(uuids, frame["uuid"]))  # uuids sorted


def _only(frame: pl.DataFrame, uuids: pl.Series) -> pl.DataFrame:
    return frame.filter(member(uuids, frame["uuid"]))


def decontaminate_files(ex: Executor, src: dict[str, Path], dest: dict[str, Path], index: NgramIndex,
                        p: DecontaminateParams) -> tuple[dict[str, pl.DataFrame], pl.DataFrame, dict[str, Any],
                                                         dict[str, tuple[int, int]]]:
    """Decontaminate the training tables ``src`` (``{kind: parquet}``) into ``dest`` on ``ex``, as one
    corpus, by the rule of the ``decontaminate`` params ``p`` (:meth:`DecontaminateParams.rule`).

    Returns (``{kind: contaminated rows with reason}``, matches (with ``table``), stats,
    ``{kind: (rows in, rows out)}``). :func:`~curation.decontaminate.row_hits` is mapped over the batches
    of each table, the detection runs on the hits, then the clean rows are streamed to ``dest`` and the
    contaminated ones gathered: memory holds index hits and the contaminated rows, not the tables.
    """
    _ = index.lookup  # built once here: the workers receive it with the index instead of each rebuilding it
    parts = [(kind, gather(ex, path, partial(row_hits, kind=kind), BATCH_ROWS, {"index": index},
                           pl.DataFrame(schema=HITS_SCHEMA))) for kind, path in src.items()]
    matches, stats = detect_contamination(scanned_rows(parts), index, **p.rule())
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

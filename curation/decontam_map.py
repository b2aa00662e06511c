"""Decontamination as a map over training batches plus the exact reduce on the driver.

:func:`curation.decontaminate.find_contamination_tables` is a whole-corpus function: its
boilerplate and stock-phrase tiers count each n-gram's training rows over every table. A row that
shares no n-gram with the index (and equals no short question) contributes nothing to those counts
and can never match, so running it on only the rows that hit the index at all gives the same
matches, stats and reasons as on the whole tables. The map (:func:`contamination_candidates`) keeps
those rows, with the index broadcast to every worker; the reduce runs the detection on the gathered
candidates of every table at once; the clean rows are streamed to the outputs.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow.parquet as pq

from common.executor import Executor, gather, write_frames
from corpora.schema import SCHEMAS
from curation.decontaminate import find_contamination, find_contamination_tables, split_contaminated
from curation.ngram_index import NgramIndex

if TYPE_CHECKING:
    from curation.params import DecontaminateParams

BATCH_ROWS = 2_000


def contamination_candidates(frame: pl.DataFrame, kind: str, index: NgramIndex) -> pl.DataFrame:
    """The rows of ``frame`` (schema ``kind``) sharing any indexed n-gram with a benchmark item or
    equal to a short question: :func:`find_contamination` with every coverage 0 (both sides) and
    no boilerplate or stock-phrase guard (a document frequency bound of ``len(frame)``), in ``frame``'s order."""
    loosest = {n: 0.0 for n in index.meta["ngrams"]}
    matches, _ = find_contamination(frame, kind, index, max(len(frame), 1), loosest, answer_min_coverage=0.0)
    return frame.join(matches.select("uuid"), on="uuid", how="semi", maintain_order="left")


def _without(frame: pl.DataFrame, uuids: pl.Series) -> pl.DataFrame:
    return frame.filter(~pl.col("uuid").is_in(uuids.implode()))


def decontaminate_files(ex: Executor, src: dict[str, Path], dest: dict[str, Path], index: NgramIndex,
                        p: DecontaminateParams) -> tuple[dict[str, pl.DataFrame], pl.DataFrame, dict[str, Any],
                                                         dict[str, tuple[int, int]]]:
    """Decontaminate the training tables ``src`` (``{kind: parquet}``) into ``dest`` on ``ex``, as one
    corpus, by the rule of the ``decontaminate`` params ``p`` (:meth:`DecontaminateParams.rule`).

    Returns (``{kind: contaminated rows with reason}``, matches (with ``table``), stats,
    ``{kind: (rows in, rows out)}``). :func:`contamination_candidates` is mapped over the batches of
    each table (the index sent once to each worker), the detection runs on the candidates and the
    clean rows are streamed to ``dest``: memory holds the candidates, not the tables.
    """
    _ = index.lookup  # built once here: the workers receive it with the index instead of each rebuilding it
    tables = {kind: gather(ex, path, partial(contamination_candidates, kind=kind), BATCH_ROWS, {"index": index},
                           pl.from_arrow(SCHEMAS[kind].empty_table())) for kind, path in src.items()}
    matches, stats = find_contamination_tables(tables, index, **p.rule())
    dirty, counts = {}, {}
    for kind, table in tables.items():
        dirty[kind] = split_contaminated(table, matches.filter(pl.col("table") == kind))[1]
        rows_out = write_frames(ex.map_parquet(src[kind], _without, BATCH_ROWS, {"uuids": dirty[kind]["uuid"]}),
                                dest[kind], SCHEMAS[kind])
        counts[kind] = (pq.ParquetFile(src[kind]).metadata.num_rows, rows_out)
    return dirty, matches, stats, counts

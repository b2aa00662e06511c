"""Rows of a parquet file in a given order, out of core, for steps that decide on a few key columns
(uuid, source, domain, a rank; a document's length) and then write whole rows in their chosen order:
the decision holds ~100 bytes a row. One streamed pass writes each wanted row to a scratch file of
its window of ``WINDOW_ROWS`` positions; each window is then read back, sorted and yielded, so memory
holds one batch, then one window, of rows. (DuckDB's ``ORDER BY`` over whole rows, and its
partitioned ``COPY``, ran out of its memory limit on wide nested rows: they do not spill well.)

The pass costs O(log n) per row read, not O(n) per batch: each batch's keys are looked up by binary
search in the sorted wanted keys (a hash join of every batch against all n wanted keys made a
256-row-batch pass quadratic), and hits are scattered to the windows' files in runs of
``WINDOW_ROWS`` rows, or sooner once the batches they came from reach ``FLUSH_BYTES`` (a hit's strings
are views into its batch, so a sparse take held 20,000 hits from up to 20,000 whole batches: build at
64x peaked at 10.2 GB); a random order would otherwise write a row group per window per batch (~1.3M
row groups for 2.8M rows).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from common.io import parquet_batches, scratch

BATCH_ROWS = 10_000
WINDOW_ROWS = 20_000  # rows sorted at once
FLUSH_BYTES = 256 << 20  # bytes of the read batches whose hits are held before they are scattered


def matches(sorted_keys: pl.Series, keys: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(row of ``keys``, index into ``sorted_keys``) int64 pairs of every equal key, by row, then by index; a
    key wanted k times matches k times. ``sorted_keys``: ascending (``Series.sort()``). O(len(keys) log n) a
    call, where a join or ``is_in`` against the n keys hashes all n every call: a 1,000-row batch against 1M
    uuids took 134 ms (left join) and 260 ms (``is_in``), 4.5 ms here; per batch of a pass, that is the
    difference between O(rows) and O(rows x n / batch) (dedup's near passes, the filtering steps' writes)."""
    lo = sorted_keys.search_sorted(keys, "left").to_numpy().astype(np.int64)
    hi = sorted_keys.search_sorted(keys, "right").to_numpy().astype(np.int64)
    counts = hi - lo
    rows = np.repeat(np.arange(len(keys), dtype=np.int64), counts)
    starts = np.repeat(lo - (np.cumsum(counts) - counts), counts)
    return rows, starts + np.arange(len(rows), dtype=np.int64)


def member(sorted_keys: pl.Series, keys: pl.Series) -> np.ndarray:
    """bool ``[len(keys)]``: whether each key is in ``sorted_keys`` (ascending), by binary search
    (:func:`matches`: a batch's cost does not grow with the keys looked up in)."""
    lo = sorted_keys.search_sorted(keys, "left").to_numpy()
    return sorted_keys.search_sorted(keys, "right").to_numpy() > lo


def take_rows(path: str | Path, uuids: pl.Series | None = None, rows: np.ndarray | None = None,
              columns: list[str] | None = None, batch_rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
    """The rows of the parquet file ``path`` whose ``uuid`` is in ``uuids`` (or whose position in the
    file is in ``rows``, int64), in that order, as frames of at most ``batch_rows`` rows with the
    file's columns (or ``columns``). Scratch: the step's (:func:`common.io.scratch`), else a
    temporary directory; removed when the stream ends.

    Raises:
        ValueError: a wanted uuid or position is not in the file, or the file repeats a wanted uuid
            (a row would be lost or doubled).
    """
    if (uuids is None) == (rows is None):
        raise ValueError("take_rows: give uuids or rows, not both")
    wanted = uuids.cast(pl.Utf8) if uuids is not None else pl.Series(np.asarray(rows, dtype=np.int64))
    order = wanted.arg_sort().to_numpy().astype(np.int64)  # wanted position of each sorted key
    sorted_keys = wanted.gather(order)
    names = columns or pq.ParquetFile(path).schema_arrow.names
    read = names if uuids is None or "uuid" in names else [*names, "uuid"]
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="take-") as parts:
        writers: dict[int, pq.ParquetWriter] = {}
        pending: list[pl.DataFrame] = []
        held = held_bytes = found = first = 0

        def scatter() -> None:
            nonlocal held, held_bytes
            hits = pl.concat(pending).with_columns((pl.col("_pos") // WINDOW_ROWS).alias("_part"))
            pending.clear()
            held = held_bytes = 0
            for (part,), window in hits.group_by("_part"):
                table = window.select(*names, "_pos").to_arrow()
                if part not in writers:
                    writers[part] = pq.ParquetWriter(f"{parts}/{part}.parquet", table.schema)
                writers[part].write_table(table)

        try:  # one pass: each wanted row goes to the file of its window of positions
            for batch in parquet_batches(path, batch_rows, columns=read):
                frame = pl.from_arrow(batch)
                keys = frame["uuid"] if uuids is not None else pl.Series(np.arange(first, first + len(frame)))
                first += len(frame)
                at, idx = matches(sorted_keys, keys)
                if not len(at):
                    continue
                hit = frame[at].with_columns(pl.Series("_pos", order[idx]))
                found += len(hit)
                pending.append(hit)  # its strings are views into the batch's buffers: it keeps the batch alive
                held, held_bytes = held + len(hit), held_bytes + batch.nbytes
                if held >= WINDOW_ROWS or held_bytes >= FLUSH_BYTES:
                    scatter()
            if pending:
                scatter()
        finally:
            for writer in writers.values():
                writer.close()
        if found != len(wanted):
            raise ValueError(f"{path}: {len(wanted)} rows asked for, {found} match (missing or repeated keys)")
        for part in range(-(-len(wanted) // WINDOW_ROWS)):  # each window sorted on its own
            yield from pl.read_parquet(f"{parts}/{part}.parquet").sort("_pos").drop("_pos").iter_slices(batch_rows)

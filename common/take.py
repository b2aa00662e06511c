"""Rows of a parquet file in a given order, out of core, for steps that decide on a few key columns
(uuid, source, domain, a rank; a document's length) and then write whole rows in their chosen order:
the decision holds ~100 bytes a row. One streamed pass writes each wanted row to a scratch file of
its window of ``WINDOW_ROWS`` positions; each window is then read back, sorted and yielded, so memory
holds one batch, then one window, of rows. (DuckDB's ``ORDER BY`` over whole rows, and its
partitioned ``COPY``, ran out of its memory limit on wide nested rows: they do not spill well.)
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from common.io import scratch

BATCH_ROWS = 10_000
WINDOW_ROWS = 20_000  # rows sorted at once


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
    if uuids is not None:
        key, wanted = "uuid", pl.DataFrame({"uuid": uuids.cast(pl.Utf8)})
    else:
        key, wanted = "_row", pl.DataFrame({"_row": np.asarray(rows, dtype=np.int64)})
    pos = wanted.with_row_index("_pos")
    names = columns or pq.ParquetFile(path).schema_arrow.names
    read = names if key == "_row" or key in names else [*names, key]
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="take-") as parts:
        writers: dict[int, pq.ParquetWriter] = {}
        found, first = 0, 0
        try:  # one pass: each wanted row goes to the file of its window of positions
            for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=read):
                frame = pl.from_arrow(batch)
                if key == "_row":
                    frame = frame.with_columns(pl.int_range(first, first + len(frame), dtype=pl.Int64).alias("_row"))
                    first += len(frame)
                hit = frame.join(pos, on=key, how="inner").with_columns((pl.col("_pos") // WINDOW_ROWS).alias("_part"))
                found += len(hit)
                for (part,), window in hit.group_by("_part"):
                    table = window.select(*names, "_pos").to_arrow()
                    if part not in writers:
                        writers[part] = pq.ParquetWriter(f"{parts}/{part}.parquet", table.schema)
                    writers[part].write_table(table)
        finally:
            for writer in writers.values():
                writer.close()
        if found != len(wanted):
            raise ValueError(f"{path}: {len(wanted)} rows asked for, {found} match (missing or repeated keys)")
        for part in range(-(-len(wanted) // WINDOW_ROWS)):  # each window sorted on its own
            yield from pl.read_parquet(f"{parts}/{part}.parquet").sort("_pos").drop("_pos").iter_slices(batch_rows)

"""Rows of a parquet file in a given order, out of core (DuckDB), for steps that decide on a few
key columns (uuid, source, domain, a rank) and then write whole rows in their chosen order: the
decision holds ~100 bytes a row, the rows stream through DuckDB's sort, which spills to the step's
scratch beyond ``MEMORY_LIMIT`` (https://duckdb.org/docs/stable/guides/performance/how_to_tune_workloads).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from common.io import scratch

MEMORY_LIMIT = "1GB"  # DuckDB's working memory per query; the sort spills past it
BATCH_ROWS = 10_000


@contextmanager
def connection(threads: int | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB with :data:`MEMORY_LIMIT`, its spill directory in the step's scratch (else a
    temporary directory) and ``threads`` threads (None: DuckDB's default, every core)."""
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="duckdb-") as tmp:
        con = duckdb.connect()
        try:
            con.execute(f"SET memory_limit='{MEMORY_LIMIT}'")
            con.execute(f"SET temp_directory='{tmp}'")
            con.execute("SET preserve_insertion_order=true")
            if threads:
                con.execute(f"SET threads={int(threads)}")
            yield con
        finally:
            con.close()


def take_rows(con: duckdb.DuckDBPyConnection, path: str | Path, uuids: pl.Series | None = None,
              rows: np.ndarray | None = None, columns: list[str] | None = None,
              batch_rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
    """The rows of the parquet file ``path`` whose ``uuid`` is in ``uuids`` (or whose position in the
    file is in ``rows``, int64), in that order, as frames of at most ``batch_rows`` rows with the
    file's columns (or ``columns``).

    Raises:
        ValueError: a wanted uuid or position is not in the file, or matches twice (a row would be
            lost or repeated).
    """
    if (uuids is None) == (rows is None):
        raise ValueError("take_rows: give uuids or rows, not both")
    if uuids is not None:
        wanted, key, source = pl.DataFrame({"uuid": uuids.cast(pl.Utf8)}), "uuid", "read_parquet({})"
    else:
        wanted = pl.DataFrame({"_row": np.asarray(rows, dtype=np.int64)})
        key, source = "_row", "(SELECT *, file_row_number AS _row FROM read_parquet({}, file_row_number=true))"
    con = con.cursor()  # its own registration and result, closed with it
    con.register("_wanted", wanted.with_row_index("_pos").to_arrow())
    quoted = "'" + str(path).replace("'", "''") + "'"
    table = source.format(quoted)
    try:
        found = con.sql(f"SELECT count(*) FROM {table} t JOIN _wanted w USING ({key})").fetchall()[0][0]
        if found != len(wanted):
            raise ValueError(f"{path}: {len(wanted)} rows asked for, {found} match (missing or repeated keys)")
        names = columns or [d[0] for d in con.sql(f"SELECT * FROM read_parquet({quoted}) LIMIT 0").description]
        cols = ", ".join(f't."{c}"' for c in names)
        reader = con.sql(f"SELECT {cols} FROM {table} t JOIN _wanted w USING ({key}) ORDER BY w._pos"
                         ).to_arrow_reader(batch_rows)
        for batch in reader:
            yield pl.from_arrow(batch)
    finally:
        con.close()

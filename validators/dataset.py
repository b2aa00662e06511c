"""Great Expectations suites for the SFT and RL tables.

GX 1.x has no polars backend and cannot hash list/struct columns, so each
table is first reduced to a frame of scalar columns (:func:`profile`), which
is validated in pandas by an ephemeral GX context. A profile too large for
memory is validated from its parquet file (:func:`check_profile_file`): the
row-wise expectations chunk by chunk in GX, uniqueness in DuckDB.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from common.spill import spill_db
from common.text import messages_column, text_hashes
from corpora.schema import SFT_DOMAINS, rl_domains


def profile(df: pl.DataFrame, kind: str) -> pl.DataFrame:
    """Scalar columns derived from a canonical table (one row per input row).

    Columns: ``uuid``, ``source``, ``domain``, ``license``, ``text_hash`` (md5 of
    the normalized row text), ``n_turns``, ``first_role``, ``last_role``,
    ``min_content_chars`` (shortest turn with no tool call), ``total_chars``.
    """
    msgs = messages_column(kind)
    el = pl.element()
    content_len = pl.when(el.struct.field("tool_calls").list.len().fill_null(0) == 0).then(
        el.struct.field("content").str.strip_chars().str.len_chars())
    return df.select(
        "uuid", "source", "domain", "license",
        text_hashes(df, kind).alias("text_hash"),
        msgs.list.len().alias("n_turns"),
        msgs.list.first().struct.field("role").alias("first_role"),
        msgs.list.last().struct.field("role").alias("last_role"),
        msgs.list.eval(content_len).list.min().fill_null(0).alias("min_content_chars"),
        msgs.list.eval(el.struct.field("content").str.len_chars()).list.sum().alias("total_chars"),
    )


UNIQUE = ("uuid", "text_hash")  # the profile's columns whose values are unique over the whole table
CHUNK_ROWS = 250_000  # profile rows validated at once by check_profile_file (~150 bytes a row in polars)


def _suite(kind: str, unique: bool = True) -> list[Any]:
    import great_expectations as gx

    E = gx.expectations
    common = [
        *(E.ExpectColumnValuesToBeUnique(column=c) for c in (UNIQUE if unique else ())),
        E.ExpectColumnValuesToNotBeNull(column="source"),
        E.ExpectColumnValuesToNotBeNull(column="license"),
        E.ExpectColumnValuesToBeBetween(column="min_content_chars", min_value=1),
    ]
    if kind == "sft":
        return common + [
            E.ExpectColumnValuesToBeInSet(column="domain", value_set=list(SFT_DOMAINS)),
            E.ExpectColumnValuesToBeBetween(column="n_turns", min_value=2),
            E.ExpectColumnValuesToBeInSet(column="last_role", value_set=["assistant"]),
            E.ExpectColumnValuesToBeInSet(column="first_role", value_set=["system", "user"]),
        ]
    return common + [
        E.ExpectColumnValuesToBeInSet(column="domain", value_set=list(rl_domains())),
        E.ExpectColumnValuesToBeBetween(column="n_turns", min_value=1),
        E.ExpectColumnValuesToBeInSet(column="last_role", value_set=["user", "tool"]),
    ]


@dataclass
class SuiteReport:
    """Outcome of one suite: ``success`` and one line per failed expectation."""

    table: str
    rows: int
    success: bool
    failures: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "success": self.success, "failures": self.failures}


def run_suite(df: pl.DataFrame, kind: str, table: str) -> SuiteReport:
    """Validate ``df`` (canonical ``kind`` table) with its suite; never raises on failure."""
    return check_profile(profile(df, kind), kind, table)


def check_profile(frame: pl.DataFrame, kind: str, table: str) -> SuiteReport:
    """Validate a :func:`profile` of a ``kind`` table held in memory with its suite; never raises on failure."""
    failures = [_line(*f, len(frame)) for f in _validate(frame, kind, table, unique=True)]
    return SuiteReport(table, len(frame), not failures, failures)


def check_profile_file(path: str | Path, kind: str, table: str, chunk_rows: int = CHUNK_ROWS,
                       scratch: str | Path | None = None) -> SuiteReport:
    """Validate the :func:`profile` of a ``kind`` table written to the parquet file ``path`` with its suite, in
    memory bounded by ``chunk_rows``, not the rows: the row-wise expectations in GX on ``chunk_rows`` rows at a
    time (failures summed over the chunks, the first examples kept), the uniqueness of :data:`UNIQUE` over the
    whole file in DuckDB (a GROUP BY that spills to ``scratch`` past its memory limit). The report equals
    :func:`check_profile`'s of the whole frame where the suite passes; a failed uniqueness line gives the
    duplicated values first seen, one each. Never raises on failure."""
    import pyarrow.parquet as pq

    from common.io import parquet_batches

    rows, found = pq.ParquetFile(path).metadata.num_rows, {}
    for batch in parquet_batches(path, chunk_rows):
        for name, count, examples in _validate(pl.from_arrow(batch), kind, table, unique=False):
            seen = found.setdefault(name, [0, []])
            seen[0] += count
            seen[1] = (seen[1] + examples)[:3]
    failures = [_line(name, count, examples, rows) for name, (count, examples) in found.items()]
    failures[:0] = [_line(*f, rows) for f in _duplicates(path, scratch)]
    return SuiteReport(table, rows, not failures, failures)


def _line(name: str, count: int, examples: list[Any], rows: int) -> str:
    return f"{name}: {count} of {rows} rows fail, e.g. {examples[:3]}"


def _duplicates(path: str | Path, scratch: str | Path | None) -> list[tuple[str, int, list[Any]]]:
    """``(expectation, rows, first duplicated values)`` for each :data:`UNIQUE` column of ``path`` that repeats
    a value (rows: every row whose value repeats, as GX counts them)."""
    out = []
    with spill_db(ordered=False, temp=scratch) as db:
        for column in UNIQUE:
            dup = pl.from_arrow(db.sql(f"""SELECT {column} AS v, count(*) AS n, min(file_row_number) AS first
                                           FROM read_parquet($path, file_row_number = true) GROUP BY {column}
                                           HAVING n > 1""", params={"path": str(path)}).to_arrow_table())
            if len(dup):
                out.append((f"expect_column_values_to_be_unique({column})", int(dup["n"].sum()),
                            dup.sort("first")["v"].head(3).to_list()))
    return out


def _validate(frame: pl.DataFrame, kind: str, table: str, unique: bool) -> list[tuple[str, int, list[Any]]]:
    """``(expectation, unexpected rows, first unexpected values)`` of each expectation of ``kind``'s suite
    (without the uniqueness ones unless ``unique``) that ``frame`` fails, run in an ephemeral GX context."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx

    data = frame.to_pandas()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (ctx.data_sources.add_pandas(f"cascade_{table}").add_dataframe_asset(table)
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": data}))
    suite = ctx.suites.add(gx.ExpectationSuite(name=f"{table}_suite", expectations=_suite(kind, unique)))
    out = []
    for r in batch.validate(suite).results:
        if not r.success:
            cfg, res = r.expectation_config, r.result or {}
            count, examples = res.get("unexpected_count"), list(res.get("partial_unexpected_list", [])[:3])
            if count is None:  # the expectation raised: GX's message stands in for the examples
                count, examples = len(frame), [str((r.exception_info or {}).get("exception_message"))]
            out.append((f"{cfg.type}({cfg.kwargs.get('column')})", int(count), examples))
    return out

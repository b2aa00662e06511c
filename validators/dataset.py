"""Great Expectations suites for the SFT and RL tables.

GX 1.x has no polars backend and cannot hash list/struct columns, so each
table is first reduced to a frame of scalar columns (:func:`profile`), which
is validated in pandas by an ephemeral GX context.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import polars as pl

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


def _suite(kind: str) -> list[Any]:
    import great_expectations as gx

    E = gx.expectations
    common = [
        E.ExpectColumnValuesToBeUnique(column="uuid"),
        E.ExpectColumnValuesToBeUnique(column="text_hash"),
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
    """Validate a :func:`profile` of a ``kind`` table (its scalar columns only: ~150 bytes a row, so
    a step can map :func:`profile` over batches and validate millions of rows) with its suite;
    never raises on failure."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx

    frame = frame.to_pandas()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (ctx.data_sources.add_pandas(f"cascade_{table}").add_dataframe_asset(table)
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
    suite = ctx.suites.add(gx.ExpectationSuite(name=f"{table}_suite", expectations=_suite(kind)))
    result = batch.validate(suite)
    failures = []
    for r in result.results:
        if r.success:
            continue
        cfg = r.expectation_config
        res = r.result or {}
        failures.append(f"{cfg.type}({cfg.kwargs.get('column')}): {res.get('unexpected_count')} of "
                        f"{len(frame)} rows fail, e.g. {res.get('partial_unexpected_list', [])[:3]}")
    return SuiteReport(table, len(frame), bool(result.success), failures)

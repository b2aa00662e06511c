"""Exact deduplication on the normalized row text.

Two rows are duplicates when the md5 of their normalized text (see
:mod:`curation.text`) is equal. The first row in the table's stable order
(registry order of sources, then source order) is kept; every other copy is
rejected with reason ``exact_duplicate: of <kept uuid>``.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from curation.text import md5_hex, normalize, row_text


def text_hashes(df: pl.DataFrame, kind: str, normalized: bool = True) -> pl.Series:
    """md5 hex digest of each row's (normalized) text, as a Utf8 series of ``len(df)``."""
    text = row_text(kind)
    return md5_hex(df.select((normalize(text) if normalized else text).alias("t"))["t"])


def exact_dedup(df: pl.DataFrame, kind: str, normalized: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split ``df`` into (kept, duplicates); ``duplicates`` has a ``reason`` column.

    ``kept`` keeps the input order and gains nothing; ``kept + duplicates``
    hold every input row exactly once.
    """
    h = text_hashes(df, kind, normalized)
    first = h.is_first_distinct()
    kept_uuid = (pl.DataFrame({"h": h, "uuid": df["uuid"]}).filter(first)
                 .select("h", pl.col("uuid").alias("kept")))
    dupes = (df.with_columns(h.alias("_h")).filter(~first)
             .join(kept_uuid, left_on="_h", right_on="h", how="left", maintain_order="left")
             .with_columns(("exact_duplicate: of " + pl.col("kept")).alias("reason"))
             .drop("_h", "kept"))
    return df.filter(first), dupes


def dedup_stats(kept: pl.DataFrame, dupes: pl.DataFrame) -> dict[str, Any]:
    """Duplicates removed per source."""
    by_source = dupes.group_by("source").len().sort("source")
    return {"duplicates_by_source": dict(zip(by_source["source"], by_source["len"], strict=True))}

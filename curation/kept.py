"""Writing what a filtering step keeps: the input streamed to its output without the removed rows, which go
to the step's rejects with their reasons (dedup, quality, semdedup)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from common.io import Rejects, RowCursor, atomic_path, parquet_batches
from common.take import matches
from corpora.schema import SCHEMAS


def write_kept(path: Path, dest: Path, kind: str, removed: pl.DataFrame | None, rejects: Rejects, rows: int,
               flags: Iterator[pa.RecordBatch] | None = None) -> tuple[int, int]:
    """Stream ``path`` into ``dest`` without the removed rows, which go to ``rejects`` in input order.

    A row is removed when its ``uuid`` is in ``removed`` (``uuid``, ``reason``; a uuid listed k times is
    rejected k times) or when ``flags``, record batches whose first column holds one reason (str, null:
    kept) per row of ``path`` in its order, in any batching (a map's results read back from disk, so a
    step holds one batch of them, not a reason per row), gives it one. Raises ValueError naming ``path``
    when ``flags`` has fewer or more rows than ``path``."""
    n_in = n_out = 0
    schema = SCHEMAS[kind]
    removed = (removed if removed is not None else pl.DataFrame(schema={"uuid": pl.Utf8, "reason": pl.Utf8}))
    removed = removed.sort("uuid", maintain_order=True)  # looked up by binary search (common.take.matches)
    reasons = removed["reason"]
    aligned = RowCursor(flags, f"the per-row reasons for {path}") if flags is not None else None
    with atomic_path(dest) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for batch in parquet_batches(path, rows):
            frame = pl.from_arrow(batch)
            n_in += len(frame)
            at, idx = matches(removed["uuid"], frame["uuid"])
            why = reasons.gather(idx)
            if aligned is not None and len(frame):
                flagged = aligned.take(len(frame)).to_series(0).cast(pl.Utf8).alias("reason")
                hit = np.flatnonzero(flagged.is_not_null().to_numpy())
                order = np.argsort(np.concatenate([hit, at]), kind="stable")
                at = np.concatenate([hit, at])[order]
                why = pl.concat([flagged.gather(hit), why]).gather(order)
            if len(at):
                rejects.extend_frame(frame[at].with_columns(why.alias("reason")))
            gone = np.zeros(len(frame), bool)
            gone[at] = True
            kept = frame.filter(~gone)
            writer.write_table(kept.to_arrow().select(schema.names).cast(schema))
            n_out += len(kept)
        if aligned is not None:
            aligned.finish()
    return n_in, n_out


def by_source_and_reason(counts: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """``{source: {category: rows}}`` from :meth:`common.io.Rejects.counts` (e.g. the rows one
    table lost as ``exact_duplicate`` / ``near_duplicate``)."""
    out: dict[str, dict[str, int]] = {}
    for (source, category), n in sorted(counts.items()):
        out.setdefault(source, {})[category] = n
    return out

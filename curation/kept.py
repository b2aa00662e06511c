"""Writing what a filtering step keeps: the input streamed to its output without the removed rows, which go
to the step's rejects with their reasons (dedup, quality, semdedup)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from common.io import Rejects, atomic_path, parquet_batches
from common.take import matches
from corpora.schema import SCHEMAS


def write_kept(path: Path, dest: Path, kind: str, removed: pl.DataFrame, rejects: Rejects,
                rows: int) -> tuple[int, int]:
    """Stream ``path`` into ``dest`` without the ``removed`` rows, which go to ``rejects``."""
    n_in = n_out = 0
    schema = SCHEMAS[kind]
    removed = removed.sort("uuid", maintain_order=True)  # looked up by binary search (common.take.matches)
    reasons = removed.drop("uuid")
    with atomic_path(dest) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for batch in parquet_batches(path, rows):
            frame = pl.from_arrow(batch)
            n_in += len(frame)
            at, idx = matches(removed["uuid"], frame["uuid"])
            if len(at):
                rejects.extend_frame(pl.concat([frame[at], reasons[idx]], how="horizontal"))
            hit = np.zeros(len(frame), bool)
            hit[at] = True
            kept = frame.filter(~hit)
            writer.write_table(kept.to_arrow().select(schema.names).cast(schema))
            n_out += len(kept)
    return n_in, n_out


def by_source_and_reason(counts: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """``{source: {category: rows}}`` from :meth:`common.io.Rejects.counts` (e.g. the rows one
    table lost as ``exact_duplicate`` / ``near_duplicate``)."""
    out: dict[str, dict[str, int]] = {}
    for (source, category), n in sorted(counts.items()):
        out.setdefault(source, {})[category] = n
    return out

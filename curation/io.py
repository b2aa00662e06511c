"""Atomic outputs and per-step bookkeeping shared by every pipeline step.

Every step writes its parquet outputs, ``metrics/<step>.json`` and
``rejects/<step>.parquet`` through these helpers: each file is written to a
temporary name beside its target and renamed, so an interrupted run never
leaves a half-written output, and every step checks that rows in equal rows
out plus rows rejected before anything is written.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

REJECT_SCHEMA = pa.schema([
    ("step", pa.string()),
    ("source", pa.string()),
    ("record_id", pa.string()),
    ("category", pa.string()),  # the reason up to its first ':' (group by this)
    ("reason", pa.string()),
    ("record", pa.string()),  # the rejected record as JSON, for inspection
])

ROW_GROUP_SIZE = 10_000


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On an exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs get the usual file mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet(table: pa.Table | pl.DataFrame, path: str | Path, schema: pa.Schema | None = None) -> None:
    """Write ``table`` atomically (zstd, bounded row groups), cast to ``schema`` if given."""
    if isinstance(table, pl.DataFrame):
        table = table.to_arrow()
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP_SIZE)


def write_json(obj: Any, path: str | Path) -> None:
    """Write ``obj`` as indented JSON atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def read_parquet(path: str | Path) -> pa.Table:
    """Read a step output; raises FileNotFoundError naming the missing input."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing input {path}: run the step that writes it first (dvc repro)")
    return pq.read_table(path)


@dataclass
class Rejects:
    """Rejected records of one step, counted by reason."""

    step: str
    rows: list[dict[str, str]] = field(default_factory=list)

    def add(self, source: str, record_id: str, reason: str, record: Any) -> None:
        """Record one rejected record; ``reason`` is short and stable (it is a metric key)."""
        if not isinstance(record, str):
            record = json.dumps(record, ensure_ascii=False, default=str)
        self.rows.append({"step": self.step, "source": source, "record_id": str(record_id),
                          "category": reason.split(":")[0], "reason": reason, "record": record})

    def extend_frame(self, frame: pl.DataFrame, reason_col: str = "reason",
                     id_col: str = "uuid", source_col: str = "source") -> None:
        """Add every row of ``frame`` (a schema table plus a ``reason`` column)."""
        records = frame.drop(reason_col).to_dicts()
        for rec, reason in zip(records, frame[reason_col].to_list(), strict=True):
            self.add(rec.get(source_col) or "", rec.get(id_col) or "", reason, rec)

    def __len__(self) -> int:
        return len(self.rows)

    def by_reason(self) -> dict[str, int]:
        """Counts per reason, the reason text cut at its first ':' (the detail varies)."""
        return dict(sorted(Counter(r["category"] for r in self.rows).items()))

    def by_source(self) -> dict[str, int]:
        return dict(sorted(Counter(r["source"] for r in self.rows).items()))

    def table(self) -> pa.Table:
        return pa.Table.from_pylist(self.rows, schema=REJECT_SCHEMA)


def finish_step(step: str, rows_in: int, rows_out: int, rejects: Rejects, root: str | Path = ".",
                **extra: Any) -> dict[str, Any]:
    """Check ``rows_in == rows_out + len(rejects)`` and write metrics and rejects.

    Writes ``<root>/metrics/<step>.json`` and ``<root>/rejects/<step>.parquet``.
    Returns the metrics dict.

    Raises:
        AssertionError: when rows are unaccounted for (a bug in the step).
    """
    if rows_in != rows_out + len(rejects):
        raise AssertionError(f"step {step}: {rows_in} rows in != {rows_out} out + {len(rejects)} rejected")
    metrics = {"rows_in": rows_in, "rows_out": rows_out, "rows_rejected": len(rejects),
               "rejected_by_reason": rejects.by_reason(), **extra}
    root = Path(root)
    write_json(metrics, root / "metrics" / f"{step}.json")
    write_parquet(rejects.table(), root / "rejects" / f"{step}.parquet")
    return metrics

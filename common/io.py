"""Atomic outputs and per-step bookkeeping shared by every pipeline step.

Every step writes its parquet outputs, ``metrics/<step>.json`` and
``rejects/<step>.parquet`` through these helpers: each file is written to a
temporary name (in the step's scratch directory inside its DVC output, which
``dvc repro`` removes however it reproduces the stage: :func:`step_scratch`) and
renamed, so an interrupted run never leaves a half-written output or a leftover,
and every step checks that rows in equal rows out plus rows rejected before
anything is written. A step whose ``params.yaml`` block fails its model
stops with one line naming the key (:func:`params_error`).
"""

from __future__ import annotations

import difflib
import glob
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError

from common.json_rows import Unencodable, json_rows

REJECT_SCHEMA = pa.schema([
    ("step", pa.string()),
    ("source", pa.string()),
    ("record_id", pa.string()),
    ("category", pa.string()),  # the reason up to its first ':' (group by this)
    ("reason", pa.string()),
    ("record", pa.string()),  # the rejected record as JSON, for inspection
])

ROW_GROUP_SIZE = 10_000


SCRATCH_NAME = ".cascade-tmp"  # a running step's scratch directory, inside its directory output
SCRATCH_ENV = "CASCADE_SCRATCH"  # where :func:`step_scratch` puts it (inherited by the step's workers)
PAUSE_ENV = "CASCADE_TEST_PAUSE_IN_WRITE"  # tests: seconds to sleep once a temporary exists (a kill point)


def scratch() -> Path | None:
    """The running step's scratch directory (:func:`step_scratch`), or None outside a step."""
    value = os.environ.get(SCRATCH_ENV)
    return Path(value) if value else None


@contextmanager
def step_scratch(home: str | Path | None) -> Iterator[Path | None]:
    """Hold every temporary of the step in ``<home>/.cascade-tmp`` while it runs, and remove it after.

    ``home`` is a directory output of the step's DVC stage: ``dvc repro`` removes a stage's outputs
    before it runs the command *and* before it restores them from its run cache (``Stage.run``), so
    what a SIGKILLed run left there (the temporaries of :func:`atomic_path` / :func:`atomic_dir`,
    whatever the target, and the spilled :class:`Rejects`) is gone after the next ``dvc repro``
    however the stage is reproduced; a temporary beside an output file (``rejects/``, ``metrics/``)
    would survive a restore. A run outside DVC removes a killed run's scratch here, first. ``home``
    None (a step whose directory output is replaced whole, never restored): temporaries go beside their
    targets, removed by the next write of the same target.
    """
    if home is None:
        yield None
        return
    home = Path(home)
    created = not home.exists()
    path = home / SCRATCH_NAME
    shutil.rmtree(path, ignore_errors=True)  # a killed run's (one run per step: none is live)
    path.mkdir(parents=True)
    before = os.environ.get(SCRATCH_ENV)
    os.environ[SCRATCH_ENV] = str(path.resolve())
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(SCRATCH_ENV, None)
        else:
            os.environ[SCRATCH_ENV] = before
        shutil.rmtree(path, ignore_errors=True)
        if created and home.is_dir() and not any(home.iterdir()):
            home.rmdir()  # the step failed before writing: no empty output left for DVC to take


def _temp_parent(path: Path) -> Path:
    """Where the temporary of a write of ``path`` goes: the step's scratch (same file system, and
    not the directory being replaced), else beside ``path``."""
    root = scratch()
    if root is None or root.resolve().is_relative_to(path.resolve()):
        return path.parent
    root.mkdir(parents=True, exist_ok=True)
    return root if os.stat(root).st_dev == os.stat(path.parent).st_dev else path.parent


def _pause_for_tests() -> None:
    if os.environ.get(PAUSE_ENV):
        import time

        time.sleep(float(os.environ[PAUSE_ENV]))


def _remove_leftovers(path: Path) -> None:
    """Remove ``.<name>.*.tmp`` beside ``path``: what a write of ``path`` killed midway (SIGKILL, power
    loss) left behind. One writer per output path is the pipeline's rule, so none is live."""
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path (in the step's scratch, :func:`step_scratch`, else beside ``path``);
    rename it onto ``path`` on success.

    On an exception the temporary file is removed and ``path`` is untouched; leftovers of an
    earlier, killed write of ``path`` are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(path)
    fd, tmp = tempfile.mkstemp(dir=_temp_parent(path), prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    _pause_for_tests()
    umask = os.umask(0)
    os.umask(umask)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs get the usual file mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a new empty directory (mode 0755; in the step's scratch, :func:`step_scratch`, else beside
    ``path``); on success it replaces ``path``.

    On an exception the temporary directory is removed and ``path`` is untouched; leftovers of an
    earlier, killed write of ``path`` are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(path)
    tmp = Path(tempfile.mkdtemp(dir=_temp_parent(path), prefix=f".{path.name}.", suffix=".tmp"))
    try:
        tmp.chmod(0o755)
        _pause_for_tests()
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
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


def read_parquet(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """Read a step output (only ``columns``, if given); raises FileNotFoundError naming the missing input."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing input {path}: run the step that writes it first (dvc repro)")
    return pq.read_table(path, columns=columns)


class PartWriters:
    """Parquet files ``{directory}/{part}.parquet`` of a partitioned spill, each opened at its first table
    and all closed on leaving the ``with`` block. Written without column statistics: an open writer holds
    every row group's footer entry until it closes, so a pass over n rows into k parts holds O(row groups)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.writers: dict[int, pq.ParquetWriter] = {}

    def write(self, part: int, table: pa.Table) -> None:
        """Append ``table`` (one schema per part) as a row group of part ``part``."""
        if part not in self.writers:
            self.writers[part] = pq.ParquetWriter(self.directory / f"{part}.parquet", table.schema,
                                                  write_statistics=False)
        self.writers[part].write_table(table)

    def __enter__(self) -> PartWriters:
        return self

    def __exit__(self, *exc: object) -> None:
        for writer in self.writers.values():
            writer.close()


SPILL = Path("rejects/.spill")  # spilled rejects of a step with no scratch (:func:`step_scratch`), not /tmp


def parquet_batches(path: str | Path, batch_rows: int, columns: list[str] | None = None,
                    row_groups: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    """The record batches of the parquet file ``path``, at most ``batch_rows`` rows each (only ``columns``
    and ``row_groups`` where given), in file order.

    Read without pre-buffering: with pyarrow's default (``pre_buffer=True``) the reader keeps every row
    group's column chunks it fetched until it is closed, so reading a whole file batch by batch held the
    file's compressed size by the end (apache/arrow#39808; a 660 MB file in 1,000-row batches: 690 MB of
    arrow memory at the last batch, 37 MB without). Raises what ``pyarrow.parquet.ParquetFile`` raises
    (FileNotFoundError, ArrowInvalid for a file that is not parquet)."""
    return pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=batch_rows, columns=columns,
                                                               row_groups=row_groups)


class RowCursor:
    """The rows of a stream of record batches handed out ``n`` at a time, whatever its batching: a file read
    beside another stream of the same rows (a map's per-row results, a near-dedup pass's meta), so a step
    holds one batch of it, not a column per row. ``what`` names the stream in errors."""

    def __init__(self, batches: Iterable[pa.RecordBatch], what: str) -> None:
        self._batches, self._what, self._held = iter(batches), what, None

    def take(self, n: int) -> pl.DataFrame:
        """The next ``n`` rows (no columns when ``n`` is 0). Raises ValueError naming the stream when it ends
        before them."""
        parts, got = [], 0
        while got < n:
            if self._held is None:
                batch = next(self._batches, None)
                if batch is None:
                    raise ValueError(f"{self._what} ends before its rows do")
                self._held = pl.from_arrow(batch)
            part = self._held.head(n - got)
            self._held = self._held.slice(len(part)) if len(part) < len(self._held) else None
            parts.append(part)
            got += len(part)
        return pl.concat(parts) if len(parts) > 1 else parts[0] if parts else pl.DataFrame()

    def finish(self) -> None:
        """Raises ValueError naming the stream when rows are left after the last :meth:`take`."""
        if (self._held is not None and len(self._held)) or any(b.num_rows for b in self._batches):
            raise ValueError(f"{self._what} has more rows than it does")


def remove_spills(step: str) -> None:
    """Remove the spill directories under :data:`SPILL` of ``step``'s rejects that a killed run left
    (run before the step)."""
    for stale in SPILL.glob(f"{glob.escape(step)}-*"):
        shutil.rmtree(stale, ignore_errors=True)


class Rejects:
    """Rejected records of one step, counted by source and reason.

    Records are buffered in memory and spilled to temporary parquet chunks of ``spill_rows``
    records (in the step's scratch, :func:`step_scratch`, else under :data:`SPILL`; removed when the
    object goes, a killed step's with its scratch or by :func:`remove_spills` on its next run), so a
    step that drops millions of records (exact duplicates of a large corpus) holds one chunk of them,
    not all; :meth:`write` streams the chunks to the target.
    Pickling (a Ray worker's rejects sent to the driver) materializes the records.
    """

    def __init__(self, step: str, spill_rows: int = ROW_GROUP_SIZE):
        self.step, self.spill_rows = step, spill_rows
        self._rows: list[dict[str, str]] = []  # records added one at a time since the last table piece
        self._pieces: list[pa.Table] = []  # the buffered records before those, in order
        self._buffered = 0  # rows in _pieces and _rows
        self._counts: Counter[tuple[str, str]] = Counter()  # (source, category) -> records
        self._dir: str | None = None
        self._chunks: list[Path] = []

    def add(self, source: str, record_id: str, reason: str, record: Any) -> None:
        """Record one rejected record; ``reason`` is short and stable (it is a metric key)."""
        if not isinstance(record, str):
            record = json.dumps(record, ensure_ascii=False, default=str)
        category = reason.split(":")[0]
        self._rows.append({"step": self.step, "source": source, "record_id": str(record_id),
                           "category": category, "reason": reason, "record": record})
        self._counts[source, category] += 1
        self._buffered += 1
        self._spill_full()

    def _add_table(self, table: pa.Table) -> None:
        """Append records as a table of :data:`REJECT_SCHEMA` (counted here)."""
        if not table.num_rows:
            return
        for source, category, n in pl.from_arrow(table.select(["source", "category"])).group_by(
                "source", "category").len().iter_rows():
            self._counts[source, category] += n
        self._pieces += [self._table(self._rows), table] if self._rows else [table]
        self._rows, self._buffered = [], self._buffered + table.num_rows
        self._spill_full()

    def _buffer(self) -> pa.Table:
        """The buffered records as one table (one chunk per column: written as a single table was)."""
        pieces = self._pieces + [self._table(self._rows)]
        return pa.concat_tables(pieces).combine_chunks() if len(pieces) > 1 else pieces[0]

    def _spill_full(self) -> None:
        """Write ``spill_rows`` records at a time to the spill directory while that many are buffered."""
        while self._buffered >= self.spill_rows:
            if self._dir is None:
                spill = scratch() or SPILL
                spill.mkdir(parents=True, exist_ok=True)
                self._dir = tempfile.mkdtemp(dir=spill, prefix=f"{self.step}-")
                _pause_for_tests()
            pieces = pa.concat_tables(self._pieces + [self._table(self._rows)])
            chunk = Path(self._dir) / f"{len(self._chunks):06d}.parquet"
            pq.write_table(pieces.slice(0, self.spill_rows).combine_chunks(), chunk)
            self._chunks.append(chunk)
            rest = pieces.slice(self.spill_rows)
            self._pieces, self._rows, self._buffered = [rest] if rest.num_rows else [], [], rest.num_rows

    @staticmethod
    def _table(rows: list[dict[str, str]]) -> pa.Table:
        return pa.Table.from_pylist(rows, schema=REJECT_SCHEMA)

    def _tables(self) -> Iterator[pa.Table]:
        for chunk in self._chunks:
            yield pq.read_table(chunk)
        yield self._buffer()

    def extend_frame(self, frame: pl.DataFrame, reason_col: str = "reason",
                     id_col: str = "uuid", source_col: str = "source") -> None:
        """Add every row of ``frame`` (a schema table plus a ``reason`` column), each record the JSON
        of its row without ``reason``: the bytes :meth:`add` writes for ``row.to_dicts()``, encoded
        column-wise (:func:`common.json_rows.json_rows`; row by row for a dtype it does not encode).

        Raises:
            ValueError: naming the column when ``reason`` holds a null."""
        if not len(frame):
            return
        if frame[reason_col].null_count():
            raise ValueError(f"rejects of {self.step}: column {reason_col!r} holds {frame[reason_col].null_count()} "
                             "nulls; every rejected record needs a reason")
        records = frame.drop(reason_col)
        try:
            record = json_rows(records)
        except Unencodable:
            record = pl.Series([json.dumps(r, ensure_ascii=False, default=str) for r in records.to_dicts()],
                               dtype=pl.String)

        def text(col: str) -> pl.Expr | pl.Series:  # the row's value as add() gets it: str(value or "")
            if col not in frame.columns:
                return pl.lit("")
            if frame.schema[col] == pl.String or isinstance(frame.schema[col], (pl.Categorical, pl.Enum)):
                return pl.col(col).cast(pl.String).fill_null("")
            return pl.Series([str(v or "") for v in frame[col].to_list()], dtype=pl.String)

        table = frame.select(
            pl.lit(self.step, pl.String).alias("step"), text(source_col).alias("source"),
            text(id_col).alias("record_id"), pl.col(reason_col).str.split(":").list.first().alias("category"),
            pl.col(reason_col).alias("reason"), record.alias("record"))
        self._add_table(table.to_arrow().cast(REJECT_SCHEMA))

    def merge(self, other: Rejects) -> None:
        """Append every record of ``other`` (same columns; its ``step`` is kept)."""
        for table in other._tables():
            self._add_table(table.cast(REJECT_SCHEMA))

    @property
    def rows(self) -> list[dict[str, str]]:
        """Every record, in the order added (spilled chunks read back: for inspection and tests)."""
        return [row for table in self._tables() for row in table.to_pylist()]

    def __len__(self) -> int:
        return sum(self._counts.values())

    def __getstate__(self) -> dict[str, Any]:
        return {"step": self.step, "spill_rows": self.spill_rows, "rows": self.rows}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["step"], state["spill_rows"])
        self._add_table(self._table(state["rows"]))

    def __del__(self) -> None:
        if getattr(self, "_dir", None) is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def counts(self) -> Counter[tuple[str, str]]:
        """Records per ``(source, category)`` (a copy)."""
        return Counter(self._counts)

    def by_reason(self) -> dict[str, int]:
        """Counts per reason, the reason text cut at its first ':' (the detail varies)."""
        out: Counter[str] = Counter()
        for (_, category), n in self._counts.items():
            out[category] += n
        return dict(sorted(out.items()))

    def by_source(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (source, _), n in self._counts.items():
            out[source] += n
        return dict(sorted(out.items()))

    def write(self, path: str | Path) -> None:
        """Write every record to ``path`` atomically, streaming the spilled chunks: the same
        bytes as :func:`write_parquet` of the whole table (zstd, :data:`ROW_GROUP_SIZE` rows
        per row group, which ``spill_rows`` must equal when chunks exist)."""
        if not self._chunks:
            write_parquet(self._buffer(), path)
            return
        if self.spill_rows != ROW_GROUP_SIZE:
            raise ValueError(f"Rejects.spill_rows {self.spill_rows} != ROW_GROUP_SIZE {ROW_GROUP_SIZE}")
        with atomic_path(path) as tmp, pq.ParquetWriter(tmp, REJECT_SCHEMA, compression="zstd") as writer:
            for table in self._tables():
                if table.num_rows:
                    writer.write_table(table, row_group_size=ROW_GROUP_SIZE)


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
    rejects.write(root / "rejects" / f"{step}.parquet")
    return metrics


def _known(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the block that ``loc`` (minus its last part) points into."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if isinstance(part, str) else None
        inner = getattr(field, "annotation", None) if field else None
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return []
        model = inner
    return list(model.model_fields)


def params_error(exc: ValidationError, model: type[BaseModel], source: str = "params.yaml",
                 prefix: tuple[str, ...] = ()) -> ValueError:
    """The error to raise for ``exc``, raised validating ``model`` (the block at ``prefix`` of
    ``source``): one line naming its first bad key, the same for the whole file
    (:func:`curation.params.check_params`) and for a block checked on its own
    (:meth:`validators.verifiers.sandbox.SandboxParams.from_block`, ``cascade train``), e.g.
    ``params.yaml dedup.near.treshold: unknown key (did you mean 'threshold'?)`` or
    ``params.yaml dedup.near.threshold: Input should be less than or equal to 1 (got 1.7)``.
    The offending value is shown except for a missing key or a validator's own message."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in (*prefix, *err["loc"]))
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(err["loc"][-1]), _known(model, err["loc"]), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return ValueError(f"{source} {where}: unknown key{hint}")
    got = "" if err["type"] in ("missing", "value_error") else f" (got {err['input']!r})"
    return ValueError(f"{source} {where}: {err['msg'].removeprefix('Value error, ')}{got}")

"""Rows of a parquet file in a given order, out of core, for steps that decide on a few key columns
(uuid, source, domain, a rank; a document's length) and then write whole rows in their chosen order:
the decision holds ~100 bytes a row. One streamed pass finds the wanted rows and writes each to the
scratch file of its bucket of positions; a bucket of at most ``WINDOW_ROWS`` positions and
``WINDOW_BYTES`` bytes is then read back and yielded in order, and a larger one is split the same way into
buckets of its own (a radix partition of the positions, at most ``FAN_OUT`` files open at a time), so
memory holds one batch, then one window, of rows, whatever the number of rows. (DuckDB's ``ORDER BY``
over whole rows, and its partitioned ``COPY``, ran out of its memory limit on wide nested rows: they do
not spill well.)

The pass costs O(log n) per row read, not O(n) per batch: each batch's keys are looked up by binary
search in the sorted wanted keys (a hash join of every batch against all n wanted keys made a
256-row-batch pass quadratic). Hits are scattered to the buckets' files in runs of ``WINDOW_ROWS`` rows,
or sooner once the batches they came from reach ``FLUSH_BYTES`` (a hit's strings are views into its
batch, so a sparse take held 20,000 hits from up to 20,000 whole batches: build at 64x peaked at
10.2 GB). Every run writes a row group to each bucket it reaches, so one file per window of positions
(as before) wrote (n / WINDOW_ROWS)^2 row groups for a random order, whose footers the open writers
hold: a random take of 12.8M small rows took 9.2x the CPU of 3.2M (``benchmarks/take.py``), and 24.8M rows would have written
1.5M row groups; with at most ``FAN_OUT`` buckets a pass writes at most n / WINDOW_ROWS x FAN_OUT, and
every row is written once per pass (one pass up to ``FAN_OUT`` x ``WINDOW_ROWS`` rows, two up to
``FAN_OUT``^2 x ``WINDOW_ROWS``).

:func:`take_rows` holds the wanted keys (~24 bytes a row wanted); :func:`take_plan` reads them from a plan
file sorted by position beside the input, so nothing in memory grows with the rows (build's sets).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from common.io import PartWriters, parquet_batches, scratch

BATCH_ROWS = 10_000
WINDOW_ROWS = 20_000  # rows sorted at once, at most
WINDOW_BYTES = 512 << 20  # bytes in memory of the rows sorted at once, at most (but one row)
GATHER_ROWS = 4_096  # rows of a window put in order at once
FLUSH_BYTES = 256 << 20  # bytes of the read batches whose hits are held before they are scattered
FAN_OUT = 128  # bucket files a pass writes at most


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


def fan_out(span: int) -> int:
    """Buckets to split ``span`` positions into: the fewest passes of at most :data:`FAN_OUT` buckets that
    bring every bucket to :data:`WINDOW_ROWS` positions, each pass splitting alike (a balanced radix)."""
    windows, passes = -(-span // WINDOW_ROWS), 1
    while FAN_OUT ** passes < windows:
        passes += 1
    fan = max(1, round(windows ** (1 / passes)))
    while fan ** passes < windows:
        fan += 1
    return fan


def _scatter(hits: Iterable[tuple[pl.DataFrame, int]], lo: int, width: int, names: list[str],
             parts: str) -> dict[int, int]:
    """Write each ``(rows with _pos, bytes of the batches they keep alive)`` to ``{parts}/{k}.parquet``,
    k = (_pos - lo) // width, in runs of :data:`WINDOW_ROWS` rows or :data:`FLUSH_BYTES` held bytes; returns
    each bucket's bytes in memory (polars' ``estimated_size``; a file's parquet sizes are encoded ones: a row
    group of tokenized documents is 43 MB encoded before compression, 106 MB in memory)."""
    sizes: dict[int, int] = {}
    pending: list[pl.DataFrame] = []
    held = held_bytes = 0

    def flush(out: PartWriters) -> None:
        nonlocal held, held_bytes
        run = pl.concat(pending).with_columns(((pl.col("_pos") - lo) // width).alias("_part"))
        pending.clear()
        held = held_bytes = 0
        for (part,), bucket in run.group_by("_part"):
            out.write(part, bucket.select(*names, "_pos").to_arrow())
            sizes[part] = sizes.get(part, 0) + bucket.estimated_size()

    with PartWriters(parts) as out:
        for frame, nbytes in hits:
            pending.append(frame)
            held, held_bytes = held + len(frame), held_bytes + nbytes
            if held >= WINDOW_ROWS or held_bytes >= FLUSH_BYTES:
                flush(out)
        if pending:
            flush(out)
    return sizes


def _in_order(path: str, lo: int, span: int, size: int, names: list[str], batch_rows: int) -> Iterator[pl.DataFrame]:
    """The rows of ``path`` (positions ``_pos``: lo, lo + 1, ..., lo + span - 1, once each) sorted by position
    without ``_pos`` (``size``: their bytes in memory). A file of more than :data:`WINDOW_ROWS` rows or
    :data:`WINDOW_BYTES` bytes is split into buckets beside it first: pack asks for the longest documents first,
    and at 64x the first 20,000 held 137M tokens (0.69 GB; the first window peaked 2 GB above the rest).

    Raises:
        ValueError: the positions are not those (a wanted key missing while another is repeated).
    """
    if not Path(path).exists():
        raise ValueError(f"positions {lo}..{lo + span - 1}: no wanted row found (another was repeated)")
    if span <= WINDOW_ROWS and (size <= WINDOW_BYTES or span == 1):
        window = pl.read_parquet(path)
        pos = window["_pos"].to_numpy()
        by_pos = np.argsort(pos, kind="stable")
        if not np.array_equal(pos[by_pos], np.arange(lo, lo + span)):
            raise ValueError(f"positions {lo}..{lo + span - 1}: a wanted row is missing or repeated")
        window = window.drop("_pos")
        step = batch_rows * max(1, GATHER_ROWS // batch_rows)  # gathered a few batches at a time: no sorted
        for start in range(0, span, step):  # copy of the window, and not a gather call per 256-row batch
            yield from window[by_pos[start:start + step]].iter_slices(batch_rows)
        return
    fan = min(span, max(fan_out(span), min(FAN_OUT, -(-size // WINDOW_BYTES))))
    width = -(-span // fan)
    with tempfile.TemporaryDirectory(dir=Path(path).parent, prefix="split-") as parts:
        rows = max(1, min(BATCH_ROWS, WINDOW_BYTES // 8 * span // max(size, 1)))  # batches of ~WINDOW_BYTES / 8
        sizes = _scatter(((pl.from_arrow(b), b.nbytes) for b in parquet_batches(path, rows)), lo, width, names, parts)
        Path(path).unlink()  # its rows are in the buckets now
        yield from _buckets(parts, lo, span, width, sizes, names, batch_rows)


def _buckets(parts: str, lo: int, span: int, width: int, sizes: dict[int, int], names: list[str],
             batch_rows: int) -> Iterator[pl.DataFrame]:
    """The rows of :func:`_scatter`'s buckets of ``span`` positions from ``lo`` in ``parts``, in order (the
    last bucket may be short, and there may be fewer than asked for when ``width`` was rounded up)."""
    for k in range(-(-span // width)):
        start = lo + k * width
        yield from _in_order(f"{parts}/{k}.parquet", start, min(width, lo + span - start), sizes.get(k, 0), names,
                             batch_rows)


def n_rows(path: str | Path) -> int:
    """Rows of the parquet file ``path`` (its footer's count)."""
    return pq.ParquetFile(path).metadata.num_rows


def _spanning(path: str | Path, lo: int, hi: int) -> tuple[list[int], int]:
    """(the row groups of ``path`` holding file positions ``lo``..``hi``, the position of the first one's
    first row); positions past the file fall in no group (and are reported missing by the caller)."""
    meta = pq.ParquetFile(path).metadata
    starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
    first = max(int(np.searchsorted(starts, lo, "right")) - 1, 0)
    last = max(int(np.searchsorted(starts, hi, "right")) - 1, first)
    return list(range(first, min(last + 1, meta.num_row_groups))), int(starts[first])


def take_rows(path: str | Path, uuids: pl.Series | None = None, rows: np.ndarray | None = None,
              columns: list[str] | None = None, batch_rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
    """The rows of the parquet file ``path`` whose ``uuid`` is in ``uuids`` (or whose position in the
    file is in ``rows``, int64), in that order, as frames of at most ``batch_rows`` rows with the
    file's columns (or ``columns``). Positions are read only from the row groups that span them (a
    window of a large file costs a pass over that window, not the file). Scratch: the step's
    (:func:`common.io.scratch`), else a temporary directory; removed when the stream ends.

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
    groups, first_row = None, 0
    if rows is not None and len(wanted):
        groups, first_row = _spanning(path, int(sorted_keys[0]), int(sorted_keys[-1]))
    n, found = len(wanted), 0

    def hits() -> Iterator[tuple[pl.DataFrame, int]]:  # the file's wanted rows, with their wanted position
        nonlocal found
        first = first_row
        for batch in parquet_batches(path, batch_rows, columns=read, row_groups=groups):
            frame = pl.from_arrow(batch)
            keys = frame["uuid"] if uuids is not None else pl.Series(np.arange(first, first + len(frame)))
            first += len(frame)
            at, idx = matches(sorted_keys, keys)
            if len(at):
                found += len(at)  # the hits' strings are views into the batch's buffers: they keep it alive
                yield frame[at].with_columns(pl.Series("_pos", order[idx])), batch.nbytes

    yield from _take(path, hits(), n, names, batch_rows, lambda: found)


def _take(path: str | Path, hits: Iterator[tuple[pl.DataFrame, int]], n: int, names: list[str], batch_rows: int,
          found: Callable[[], int]) -> Iterator[pl.DataFrame]:
    """The ``n`` rows of ``hits`` (each with ``_pos``, its place in the output) in order, through buckets in a
    scratch directory; raises ValueError when ``found()`` after the pass is not ``n``."""
    width = max(1, -(-n // fan_out(n)))
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="take-") as parts:
        sizes = _scatter(hits, 0, width, names, parts)
        if found() != n:
            raise ValueError(f"{path}: {n} rows asked for, {found()} match (missing or repeated keys)")
        yield from _buckets(parts, 0, n, width, sizes, names, batch_rows)


def take_plan(path: str | Path, plan: str | Path, columns: list[str] | None = None,
              batch_rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
    """Rows of the parquet file ``path`` placed by the parquet file ``plan``, with no per-row state in
    memory (:func:`take_rows` holds the wanted positions): ``plan`` has ``pos`` (int64 positions in
    ``path``, ascending: a row wanted twice is listed twice), ``out`` (int64 place of each in the output, a
    permutation of 0..n-1) and optionally other columns, appended to the rows taken. Yields frames of at
    most ``batch_rows`` rows in ``out`` order with the file's columns (or ``columns``), then the plan's
    others. Both files are read a batch at a time, side by side (e.g. a plan a DuckDB ``COPY ... ORDER BY
    pos`` wrote under its memory limit).

    Raises:
        ValueError: ``plan`` lacks ``pos`` or ``out``, its positions are not ascending, a position is not in
            the file, or ``out`` is not a permutation (a row would be lost or doubled).
    """
    names = columns or pq.ParquetFile(path).schema_arrow.names
    plan_names = pq.ParquetFile(plan).schema_arrow.names
    if not {"pos", "out"} <= set(plan_names):
        raise ValueError(f"take plan {plan}: needs columns pos and out, has {plan_names}")
    extra = [c for c in plan_names if c not in ("pos", "out")]
    n, found = n_rows(plan), 0

    def hits() -> Iterator[tuple[pl.DataFrame, int]]:
        nonlocal found
        cursor = _PlanCursor(plan)
        first = 0
        for batch in parquet_batches(path, batch_rows, columns=names):
            frame = pl.from_arrow(batch)
            wanted = cursor.before(first + len(frame))
            if len(wanted):
                found += len(wanted)
                at = wanted["pos"].to_numpy() - first
                if at[0] < 0:
                    raise ValueError(f"take plan {plan}: position {at[0] + first} is not in {path}")
                yield (frame[at].with_columns(wanted.select(*extra, _pos="out")), batch.nbytes)
            first += len(frame)

    yield from _take(path, hits(), n, [*names, *extra], batch_rows, lambda: found)


class _PlanCursor:
    """A take plan's rows read in order, handed out by position (:meth:`before`)."""

    def __init__(self, plan: str | Path) -> None:
        self.plan, self.batches, self.held, self.last = plan, parquet_batches(plan, BATCH_ROWS), None, -1

    def before(self, end: int) -> pl.DataFrame:
        """The plan rows with ``pos < end`` not handed out yet (``end`` grows from call to call).

        Raises:
            ValueError: the positions are not ascending.
        """
        parts = []
        while True:
            if self.held is None:
                batch = next(self.batches, None)
                if batch is None:
                    break
                self.held = pl.from_arrow(batch)
                pos = self.held["pos"]
                if len(pos) and (pos[0] < self.last or not pos.is_sorted()):
                    raise ValueError(f"take plan {self.plan}: pos is not ascending")
                self.last = pos[-1] if len(pos) else self.last
            cut = int(self.held["pos"].search_sorted(end, "left"))
            parts.append(self.held.head(cut))
            if cut < len(self.held):
                self.held = self.held.slice(cut)
                break
            self.held = None
        return pl.concat(parts) if parts else pl.DataFrame()

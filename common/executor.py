"""Where the table-shaped steps run their per-batch work: in this process (``local``) or as
Ray Data pipelines (``ray``, :mod:`common.ray_exec`).

A step is split into pure per-batch functions ``fn(frame: pl.DataFrame, **shared) -> pl.DataFrame``
(the *map*, e.g. :func:`curation.minhash.signature_batch`) and a global reduce on the driver over
what they return (exact-duplicate groups, connected components, decontamination matching). Both
executors call the same functions and yield their results in input row order, so the outputs do
not depend on the executor (``tests/test_ray_executor.py`` checks byte-identical files).

Params (``params.yaml: executor``)::

    kind: local | ray          # ray: Ray Data map_batches over the step's parquet inputs
    address: null              # ray: null starts a local Ray on this machine; "auto" joins a cluster
    num_cpus: 2                # local Ray only
    object_store_mb: 1024      # local Ray only: the plasma store limit (spills to disk beyond it)
    block_mb: 8                # Ray Data target block size (smaller: more parallel map tasks)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from common.io import ROW_GROUP_SIZE, atomic_path, parquet_batches

BatchFn = Callable[..., pl.DataFrame]
"""A pure map ``fn(frame, **shared) -> frame``: no state, no I/O, same output for the same rows."""


class Executor(Protocol):
    """Runs a :data:`BatchFn` over every batch of a parquet file, yielding results in row order."""

    kind: str

    def map_parquet(self, path: str | Path, fn: BatchFn, batch_rows: int, shared: dict[str, Any] | None = None,
                    workers: int = 1, row_index: bool = False) -> Iterator[pl.DataFrame]:
        """``fn(batch, **shared)`` for consecutive batches of ``path`` (at most ``batch_rows`` rows each
        locally; Ray Data's blocks on ``ray``), in row order. ``shared`` is sent to every worker once
        (``ray.put``); ``workers`` is the local thread count. ``row_index``: each batch starts with a
        UInt32 column ``row_index``, the row's position in the file (:func:`indexed_batches`)."""
        ...

    def map_items(self, items: list[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """``[fn(item) for item in items]`` for picklable items and results, in order (on Ray: one
        Ray Data row, and task, per item)."""
        ...

    def release(self) -> None:
        """Give back what idle workers hold while the driver works alone; the next map starts them again."""
        ...


def ordered_map(fn: Callable[[Any], Any], items: Iterator[Any], workers: int) -> Iterator[Any]:
    """``map(fn, items)`` on ``workers`` threads, in order, with at most 2*workers items in flight."""
    from concurrent.futures import ThreadPoolExecutor

    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers) as pool:
        pending = []
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * workers:
                yield pending.pop(0).result()
        for fut in pending:
            yield fut.result()


_WORK: dict[str, Callable[[Any], Any]] = {}  # a worker process's current map, by the file it came from


def _run_work(fn_path: str, item: Any) -> Any:
    if fn_path not in _WORK:
        import cloudpickle

        _WORK.clear()
        _WORK[fn_path] = cloudpickle.loads(Path(fn_path).read_bytes())
    return _WORK[fn_path](item)


class ProcessPool:
    """``processes`` worker processes kept for a step's lifetime, mapping one function at a time.

    Workers fork from a clean ``forkserver`` process with polars, numpy and pyarrow imported, not
    from the (threaded) step process, and import the rest once. Each :meth:`map` writes its function
    (with what it binds: a step's shared index or settings; cloudpickle, so closures work) to a
    scratch file that each worker loads once; items and results are pickled. A script that uses
    it needs the ``if __name__ == "__main__":`` guard of :mod:`multiprocessing`."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._pool: Any = None
        self._dir: Any = None
        self._calls = 0

    def map(self, fn: Callable[[Any], Any], items: Iterator[Any]) -> Iterator[Any]:
        """``map(fn, items)`` in order, with at most 2*processes items in flight."""
        import multiprocessing as mp
        import tempfile
        from collections import deque
        from concurrent.futures import ProcessPoolExecutor

        import cloudpickle

        if self._pool is None:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["polars", "numpy", "pyarrow", "pyarrow.parquet"])
            self._pool = ProcessPoolExecutor(self.processes, mp_context=ctx)
            self._dir = tempfile.TemporaryDirectory(prefix="cascade-map-")
        self._calls += 1
        fn_path = Path(self._dir.name) / f"map{self._calls}.pkl"
        fn_path.write_bytes(cloudpickle.dumps(fn))
        pending: deque = deque()
        for item in items:
            pending.append(self._pool.submit(_run_work, str(fn_path), item))
            if len(pending) >= 2 * self.processes:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def close(self) -> None:
        """Stop the workers and remove the scratch files."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._dir.cleanup()
            self._pool = None


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class LocalExecutor:
    """This machine's executor: parquet batches of ``batch_rows`` rows mapped in this process
    (``processes`` 1: on the call's ``workers`` threads) or on ``processes`` worker processes
    (:class:`ProcessPool`: the maps are Python and polars code, so threads would share one core
    under the GIL). Results come in row order either way, so outputs do not depend on it.
    :meth:`close` stops the workers (:func:`open_executor` does on exit)."""

    kind = "local"

    def __init__(self, processes: int = 1) -> None:
        self.processes = processes
        self.pool = ProcessPool(processes) if processes > 1 else None

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self.pool is not None:
            self.pool.close()

    def release(self) -> None:
        """Stop the worker processes until the next map (which starts them again, ~0.6 s): each holds
        ~0.5 GB of imports and allocator caches, idle while the driver bands or writes alone."""
        self.close()

    def map_parquet(self, path: str | Path, fn: BatchFn, batch_rows: int, shared: dict[str, Any] | None = None,
                    workers: int = 1, row_index: bool = False) -> Iterator[pl.DataFrame]:
        """See :meth:`Executor.map_parquet`; raises FileNotFoundError naming a missing input."""
        if not Path(path).exists():
            raise FileNotFoundError(f"missing input {path}: run the step that writes it first (dvc repro)")
        frames = (indexed_batches(path, batch_rows) if row_index else
                  (pl.from_arrow(b) for b in parquet_batches(path, batch_rows)))
        work = partial(call_with, fn, shared or {})
        if self.pool is not None:
            return self.pool.map(work, frames)
        return ordered_map(work, frames, workers)

    def map_items(self, items: list[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """See :meth:`Executor.map_items`."""
        return [fn(item) for item in items]


def indexed_batches(path: str | Path, batch_rows: int, row_group: int | None = None) -> Iterator[pl.DataFrame]:
    """Batches of at most ``batch_rows`` rows of the parquet file ``path`` (of its row group
    ``row_group`` only, if given), each led by a UInt32 column ``row_index``: the row's position in
    the whole file, so a map that depends on it (e.g. which rows to cross-check) gives the same
    result whichever worker reads which part of the file."""
    f = pq.ParquetFile(path)
    first = sum(f.metadata.row_group(g).num_rows for g in range(row_group or 0))
    for batch in parquet_batches(path, batch_rows, row_groups=None if row_group is None else [row_group]):
        frame = pl.from_arrow(pa.Table.from_batches([batch]))
        yield frame.with_row_index("row_index", offset=first)
        first += len(frame)


def compact(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with string and list data of its own: a few rows filtered out of a batch keep views into
    the batch's buffers (polars' string views), which a worker's pickled result carries whole and the
    driver then holds (10 rows of a 2,000-row RL batch: 0.61 MB pickled, 0.02 MB compacted; decontaminate's
    contaminated RL rows held 0.9 GB at 64x). Costs a copy of the rows: for maps that keep few of them."""
    return pl.from_arrow(frame.to_arrow(compat_level=pl.CompatLevel.oldest()))


def call_with(fn: BatchFn, shared: dict[str, Any], frame: pl.DataFrame) -> pl.DataFrame:
    """``fn(frame, **shared)``: a map with its shared arguments bound first (picklable with partial)."""
    return fn(frame, **shared)


def then(frame: pl.DataFrame, first: BatchFn, second: BatchFn, **shared: Any) -> pl.DataFrame:
    """``second(first(frame), **shared)``: compose a projection with a map (picklable with partial)."""
    return second(first(frame), **shared)


@dataclass
class ParquetBatches:
    """The re-iterable text stream of :data:`curation.minhash.Batches` over a parquet file, whose
    ``map`` runs a :data:`BatchFn` on ``executor`` (``prep`` projects each raw batch first)."""

    executor: Executor
    path: Path
    prep: BatchFn
    batch_rows: int
    workers: int = 1

    def __call__(self) -> Iterator[pl.DataFrame]:
        return self.map(lambda frame: frame)

    def map(self, fn: BatchFn, **shared: Any) -> Iterator[pl.DataFrame]:
        """``fn(prep(batch), **shared)`` on every batch, in order."""
        return self.executor.map_parquet(self.path, partial(then, first=self.prep, second=fn), self.batch_rows,
                                         shared, self.workers)

    def release(self) -> None:
        """The executor's :meth:`Executor.release`: between passes, while the driver works alone."""
        self.executor.release()


def gather(ex: Executor, path: str | Path, fn: BatchFn, batch_rows: int, shared: dict[str, Any],
           empty: pl.DataFrame) -> pl.DataFrame:
    """The whole table of ``fn`` mapped over ``path`` on ``ex``, in row order and in one chunk (so
    what is written from it does not depend on the batches); ``empty`` (``fn`` of no rows) gives
    the columns when ``path`` has no rows."""
    return pl.concat([empty, *ex.map_parquet(path, fn, batch_rows, shared)], rechunk=True)


def write_frames(frames: Iterator[pl.DataFrame], path: str | Path, schema: pa.Schema,
                 chunks: list[int] | None = None) -> int:
    """Stream ``frames`` (cast to ``schema``) into one parquet file atomically; returns rows written.

    Row groups hold :data:`common.io.ROW_GROUP_SIZE` rows and each is written from one arrow
    chunk whatever the frame sizes (page boundaries follow arrow chunks), so the file is
    byte-identical to :func:`common.io.write_parquet` of the concatenated, rechunked table; with
    ``chunks`` (the row counts of the arrow chunks of a table, e.g. ``Series.chunk_lengths()``),
    byte-identical to :func:`common.io.write_parquet` of a table chunked that way.
    """
    edges = list(itertools.accumulate(chunks or []))
    rows, written, pending, held = 0, 0, [], 0
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        def flush(final: bool) -> None:
            nonlocal pending, held, written
            table = pa.concat_tables(pending) if pending else schema.empty_table()
            cut = len(table) if final else len(table) - len(table) % ROW_GROUP_SIZE
            if cut or (final and rows == 0):  # write_parquet writes one empty row group for no rows
                cuts = [0, *(e - written for e in edges if written < e < written + cut), cut]
                pieces = [table.slice(a, b - a).combine_chunks() for a, b in itertools.pairwise(cuts) if b > a]
                writer.write_table(pa.concat_tables(pieces) if pieces else table.slice(0, 0),
                                   row_group_size=ROW_GROUP_SIZE)
            pending, held, written = [table.slice(cut)], len(table) - cut, written + cut

        for frame in frames:
            pending.append(frame.to_arrow().select(schema.names).cast(schema))
            held += len(frame)
            rows += len(frame)
            if held >= ROW_GROUP_SIZE:
                flush(False)
        flush(True)
    return rows


class ExecutorParams(BaseModel):
    """``params.yaml: executor``: where the per-source and per-batch work of the data steps runs.

    ``kind``: ``local`` (this process, and ``threads`` worker processes: null, every CPU this process may
    use; 1, this process alone) | ``ray`` (Ray Data; ``address`` joins a
    running cluster, else a local Ray starts with ``num_cpus`` CPUs, an ``object_store_mb`` MiB object
    store and ``block_mb`` MiB target blocks).
    """

    model_config = ConfigDict(extra="forbid")
    kind: Literal["local", "ray"] = "local"
    threads: int | None = Field(None, ge=1)
    address: str | None = None
    num_cpus: int = Field(2, ge=1)
    object_store_mb: int = Field(1024, ge=64)
    block_mb: int = Field(8, ge=1)


@contextmanager
def open_executor(p: ExecutorParams) -> Iterator[Executor]:
    """The executor ``p`` names; a Ray one is connected (or started) on entry and shut down on exit.
    Raises ImportError naming the extra when ``ray`` is asked for but missing."""
    if p.kind == "local":
        local = LocalExecutor(p.threads or available_cpus())
        try:
            yield local
        finally:
            local.close()
        return
    from common.ray_exec import RayExecutor

    ex = RayExecutor(p)
    try:
        yield ex
    finally:
        ex.close()

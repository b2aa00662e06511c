"""The ``ray`` executor: the per-batch maps of the pipeline steps as Ray Data pipelines
(``ray.data.read_parquet`` -> ``map_batches``), results streamed back to the driver in row order.

``shared`` (the decontamination index, the uuids to skip, ...) is put in the object store once
(``ray.put``) and read by every map task; each worker process keeps the last one it read, so a
large index is deserialized once per worker, not per batch. Needs the ``ray`` extra
(``pip install -e '.[ray]'``); the package must be importable on every node of a cluster.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from common.executor import BatchFn, ExecutorParams, indexed_batches

_CACHE: dict[str, dict[str, Any]] = {}


def _apply(fn: BatchFn, ref: Any, table: pa.Table) -> pa.Table:
    """Worker side of a map: ``fn(frame, **shared)`` on one Ray Data batch, back to arrow."""
    import ray

    key = ref.hex()
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = ray.get(ref)
    return fn(pl.from_arrow(table), **_CACHE[key]).to_arrow(compat_level=pl.CompatLevel.oldest())


def _apply_row_groups(path: str, fn: BatchFn, ref: Any, batch_rows: int, table: pa.Table) -> pa.Table:
    """Worker side of ``map_parquet(row_index=True)``: ``fn`` on the indexed batches of each row group."""
    out = [_apply(fn, ref, frame.to_arrow()) for g in table["row_group"].to_pylist()
           for frame in indexed_batches(path, batch_rows, g)]
    return pa.concat_tables(out) if out else pa.table({})  # an empty row group: nothing to map


def _apply_items(fn: Callable[[Any], Any], table: pa.Table) -> pa.Table:
    """Worker side of :meth:`RayExecutor.map_items`: unpickle each item, pickle ``fn(item)``."""
    out = [pickle.dumps(fn(pickle.loads(b)), protocol=pickle.HIGHEST_PROTOCOL) for b in table["item"].to_pylist()]
    return pa.table({"result": pa.array(out, pa.large_binary())})


class RayExecutor:
    """Runs maps on Ray Data. ``p`` is :func:`common.executor.from_params`' dict.

    With ``address`` (e.g. ``"auto"``) it joins that cluster; without, it starts a local Ray with
    ``num_cpus`` CPUs and an ``object_store_mb`` MiB object store (no dashboard). A Ray already
    initialized in this process is used as it is and left running.

    Raises:
        ImportError: ``ray`` is not installed (the ``ray`` extra).
    """

    kind = "ray"

    def __init__(self, p: ExecutorParams) -> None:
        try:
            import ray
            import ray.data
        except ImportError as exc:
            raise ImportError("executor.kind: ray needs the ray extra: pip install -e '.[ray]'") from exc
        self._owned = not ray.is_initialized()
        if self._owned:
            opts: dict[str, Any] = {"address": p.address} if p.address else {
                "num_cpus": p.num_cpus, "object_store_memory": p.object_store_mb << 20,
                "include_dashboard": False}
            ray.init(**opts, logging_level=logging.WARNING, log_to_driver=False,
                     runtime_env={"env_vars": {"POLARS_MAX_THREADS": "1", "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}})
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # results come back in input row order
        ctx.use_datasource_v2 = False  # V2's ListFiles -> ReadFiles chain costs seconds per small read
        ctx.enable_progress_bars = False
        ctx.target_max_block_size = p.block_mb << 20
        self._ray = ray

    def map_parquet(self, path: str | Path, fn: BatchFn, batch_rows: int, shared: dict[str, Any] | None = None,
                    workers: int = 1, row_index: bool = False) -> Iterator[pl.DataFrame]:
        """See :meth:`common.executor.Executor.map_parquet` (``workers`` is ignored: Ray schedules).

        With ``row_index`` the pipeline is ``ray.data.from_items`` over the file's row groups (one
        task each, which reads its row group and knows its first row's position), not ``read_parquet``.
        """
        if not Path(path).exists():
            raise FileNotFoundError(f"missing input {path}: run the step that writes it first (dvc repro)")
        ref = self._ray.put(shared or {})
        if row_index:
            groups = [{"row_group": g} for g in range(pq.ParquetFile(path).metadata.num_row_groups)]
            if not groups:
                return
            ds = self._ray.data.from_items(groups, override_num_blocks=max(len(groups), 1)).map_batches(
                partial(_apply_row_groups, str(Path(path).resolve()), fn, ref, batch_rows), batch_size=1,
                batch_format="pyarrow")
        else:
            ds = self._ray.data.read_parquet(str(Path(path).resolve())).map_batches(
                partial(_apply, fn, ref), batch_format="pyarrow", batch_size=batch_rows, zero_copy_batch=True)
        for table in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            if table.num_columns or not row_index:
                yield pl.from_arrow(table)

    def map_items(self, items: list[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """See :meth:`common.executor.Executor.map_items`: ``ray.data.from_items``, one block per item."""
        if not items:
            return []
        rows = [{"item": pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)} for x in items]
        ds = self._ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
            partial(_apply_items, fn), batch_size=1, batch_format="pyarrow")
        return [pickle.loads(b) for t in ds.iter_batches(batch_size=None, batch_format="pyarrow")
                for b in t["result"].to_pylist()]

    def release(self) -> None:
        """Nothing: Ray's workers are Ray's to keep or stop."""

    def close(self) -> None:
        """Shut down the Ray this executor started (not one it joined)."""
        if self._owned:
            self._ray.shutdown()

"""Deduplication step: exact duplicates, then near-duplicates (:mod:`curation.minhash`).

Exact: two rows are duplicates when the md5 of their normalized text (see
:mod:`common.text`) is equal. The first row in the table's stable order
(registry order of sources, then source order) is kept; every other copy is
rejected with reason ``exact_duplicate: of <kept uuid>``.

Near: MinHash LSH with exact Jaccard verification over the whole row text
(SFT: the conversation; RL: the prompt) within the ``scope`` (``within_domain``
or ``across_domains``); optionally (``rl_vs_sft``) RL prompts that near-duplicate
an SFT row's user turns are removed as well. Rows of ``exempt_sources`` (seeded
generators whose distinct problems share a long instruction template) get exact
dedup only.

:func:`run_dedup` streams the parquet row groups and holds nothing per row: each row's keys (position,
uuid, the text's 16-byte md5, source, scope group, priority) go to a file in the step's scratch; DuckDB
finds the exact duplicates there under its memory limit (:func:`exact_duplicates`), and the near pass
reads its meta from that file beside the text stream (:func:`curation.minhash.near_dedup`, which holds
its candidates, not its rows). What is held grows with the duplicates and candidates found. Its per-batch
passes run on an executor (:mod:`common.executor`: this process, or Ray Data). ``rl_vs_sft`` (off by
default) reads both tables' meta from scratch files the same way (:func:`curation.minhash.cross_dedup`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from common.executor import Executor, LocalExecutor, ParquetBatches, write_frames
from common.io import Rejects, finish_step, parquet_batches, scratch
from common.spill import spill_db
from common.take import member
from common.text import md5_halves, row_text, text_hashes, user_text
from curation.kept import by_source_and_reason, write_kept
from curation.minhash import cross_dedup, near_dedup

if TYPE_CHECKING:
    from curation.params import DedupParams, MinHashConfig

KINDS = ("sft", "rl")
KEY_SCHEMA = pa.schema({"pos": pa.int64(), "uuid": pa.string(), "hi": pa.uint64(), "lo": pa.uint64(),
                        "source": pa.string(), "group": pa.string(), "priority": pa.int64()})
"""A dedup keys file (:func:`key_frames`): a row per input row, in order."""
META_SCHEMA = pa.schema({k: KEY_SCHEMA.field(k).type for k in ("uuid", "source", "group", "priority")})
"""The near pass's meta file (:func:`near_rows`)."""


def exact_duplicates(keys: pl.DataFrame | Path) -> pl.DataFrame:
    """Rows whose text hash occurred before, in table order: ``uuid``, ``reason`` (``exact_duplicate: of
    <first uuid>``) and ``pos`` (Int64, the row's position). ``keys``: a frame of ``uuid`` and ``h``
    (:func:`common.text.md5_halves`) in table order, or a parquet file of ``pos``, ``uuid``, ``hi`` and ``lo``
    (:data:`KEY_SCHEMA`). Decided by DuckDB (a window over the hashes) under its memory limit, spilling to
    the step's scratch (:func:`common.spill.spill_db`), so memory holds the duplicates, not the keys."""
    with spill_db() as db:
        if isinstance(keys, pl.DataFrame):
            db.register("keys", keys.unnest("h").with_row_index("pos").to_arrow())
            src, params = "keys", {}
        else:
            src, params = "read_parquet($keys)", {"keys": str(keys)}
        found = db.sql(f"""SELECT uuid, 'exact_duplicate: of ' || kept AS reason, pos::BIGINT AS pos FROM (
                             SELECT pos, uuid, row_number() OVER w AS n, first_value(uuid) OVER w AS kept
                             FROM {src} WINDOW w AS (PARTITION BY hi, lo ORDER BY pos))
                           WHERE n > 1 ORDER BY pos""", params=params).to_arrow_table()
    return pl.from_arrow(found).cast({"uuid": pl.Utf8, "reason": pl.Utf8, "pos": pl.Int64})


def exact_dedup(df: pl.DataFrame, kind: str, normalized: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split ``df`` into (kept, duplicates); ``duplicates`` has a ``reason`` column.

    ``kept`` keeps the input order and gains nothing; ``kept + duplicates``
    hold every input row exactly once.
    """
    dupes = exact_duplicates(pl.DataFrame({"uuid": df["uuid"], "h": md5_halves(text_hashes(df, kind, normalized))}))
    dupes = dupes.select("uuid", "reason")
    return (df.join(dupes, on="uuid", how="anti", maintain_order="left"),
            df.join(dupes, on="uuid", how="inner", maintain_order="left"))


def key_batch(frame: pl.DataFrame, kind: str, normalized: bool) -> pl.DataFrame:
    """Map of the exact pass: ``uuid``, ``h`` (:func:`text_hashes` as :func:`common.text.md5_halves`: 16
    bytes a row), ``source``, ``domain`` of each row."""
    return frame.select("uuid", md5_halves(text_hashes(frame, kind, normalized)).alias("h"), "source", "domain")


def text_batch(frame: pl.DataFrame, kind: str, user_only: bool, skip: pl.Series,
               exempt: tuple[str, ...] = ()) -> pl.DataFrame:
    """Projection of the near passes: ``uuid``, ``text`` (row text, or the user turns) of the
    rows of ``frame`` whose uuid is not in ``skip`` (sorted: :func:`common.take.member`) and whose source is
    not in ``exempt``."""
    text = user_text(kind) if user_only else row_text(kind)
    keep = ~member(skip, frame["uuid"]) & ~frame["source"].is_in(list(exempt)).to_numpy()
    return frame.filter(keep).select("uuid", text.alias("text"))


def key_frames(frames: Iterator[pl.DataFrame], priority: dict[str, int], scope: str) -> Iterator[pl.DataFrame]:
    """The frames of :func:`key_batch` mapped over a file, in order, as rows of :data:`KEY_SCHEMA`: ``pos``
    counted across them, the md5's halves as columns, the near pass's ``group`` (the domain, or ``all``
    across domains) and ``priority`` (the source's registry position; unknown sources last)."""
    first = 0
    for frame in frames:
        yield frame.unnest("h").with_columns(
            pl.int_range(first, first + len(frame), dtype=pl.Int64).alias("pos"),
            (pl.col("domain") if scope == "within_domain" else pl.lit("all")).alias("group"),
            pl.col("source").replace_strict(priority, default=len(priority), return_dtype=pl.Int64).alias("priority"))
        first += len(frame)


def near_rows(keys: Path, duplicates: pl.Series, exempt: list[str], batch_rows: int) -> Iterator[pl.DataFrame]:
    """The near pass's meta (``uuid``, ``source``, ``group``, ``priority``), read from the keys file ``keys`` a
    batch at a time: its rows but the exact ``duplicates`` (positions, ascending) and the ``exempt`` sources'."""
    for batch in parquet_batches(keys, batch_rows, columns=["pos", "uuid", "source", "group", "priority"]):
        frame = pl.from_arrow(batch)
        keep = ~member(duplicates, frame["pos"]) & ~frame["source"].is_in(exempt).to_numpy()
        yield frame.filter(keep).drop("pos")


def run_dedup(p: DedupParams, priority: dict[str, int], src: Path, out: Path,
              signatures: Path, root: Path = Path("."), executor: Executor | None = None) -> dict[str, Any]:
    """The ``dedup`` step over ``src/{sft,rl}.parquet``: writes ``out/{kind}.parquet``, the
    MinHash signatures ``signatures/{kind}.parquet`` (settings in the parquet metadata
    key ``minhash``), ``metrics/dedup.json`` and ``rejects/dedup.parquet``.

    ``priority`` maps a source name to its registry position (lower survives). The per-batch
    passes (hashes, signatures, shingle sets) run on ``executor`` (default: this process); the
    exact-duplicate groups, LSH banding, Jaccard checks, components and the writes on the driver.
    Raises :class:`curation.minhash.DedupAlarm` when an alarm fires with ``on_alarm: fail``.
    """
    ex = executor or LocalExecutor()
    near = cfg = p.near
    rows = cfg.batch_rows
    removed: dict[str, pl.DataFrame] = {}
    stats: dict[str, Any] = {}
    for kind in KINDS:
        path = src / f"{kind}.parquet"
        with tempfile.TemporaryDirectory(dir=scratch(), prefix="dedup-") as tmp:
            keys, meta = Path(tmp) / "keys.parquet", Path(tmp) / "meta.parquet"
            n = write_frames(key_frames(ex.map_parquet(path, partial(key_batch, kind=kind, normalized=p.normalize),
                                                       rows), priority, near.scope), keys, KEY_SCHEMA)
            exact = exact_duplicates(keys)
            parts = [exact.select("uuid", "reason")]
            stats[kind] = {"rows_in": n, "exact_duplicates": len(exact)}
            if near.enabled:
                write_frames(near_rows(keys, exact["pos"], near.exempt_sources, rows), meta, META_SCHEMA)
                skip = exact["uuid"].sort()
                batches = ParquetBatches(ex, path, partial(text_batch, kind=kind, user_only=False, skip=skip,
                                                           exempt=tuple(near.exempt_sources)), rows, cfg.workers)
                near_removed, st = near_dedup(batches, meta, cfg, near.alarms, kind, near.verify_chars,
                                              signatures / f"{kind}.parquet")
                parts.append(near_removed.select("uuid", "reason"))
                stats[kind]["near"] = st
        removed[kind] = pl.concat(parts)
    if near.enabled and near.rl_vs_sft:
        rl_removed, st = _rl_vs_sft(ex, src, removed, cfg)
        removed["rl"] = pl.concat([removed["rl"], rl_removed.select("uuid", "reason")])
        stats["rl_vs_sft"] = st
    ex.release()  # the writes are the driver's
    rejects, rows_in, rows_out = Rejects("dedup"), 0, 0
    for kind in KINDS:
        before = rejects.counts()
        n_in, n_out = write_kept(src / f"{kind}.parquet", out / f"{kind}.parquet", kind, removed[kind], rejects, rows)
        rows_in, rows_out = rows_in + n_in, rows_out + n_out
        by_source = by_source_and_reason(rejects.counts() - before)
        stats[kind].update(rows_out=n_out, duplicates_by_source=by_source)
    return finish_step("dedup", rows_in, rows_out, rejects, root=root, per_table=stats,
                       minhash=cfg.settings() if near.enabled else None)


def _rl_vs_sft(ex: Executor, src: Path, removed: dict[str, pl.DataFrame], cfg: MinHashConfig):
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="rl-vs-sft-") as tmp:
        def side(kind: str):
            path, skip, meta = src / f"{kind}.parquet", removed[kind]["uuid"].sort(), Path(tmp) / f"{kind}.parquet"
            write_frames(ex.map_parquet(path, partial(_id_source, skip=skip), cfg.batch_rows), meta,
                         pa.schema({"uuid": pa.string(), "source": pa.string()}))
            return ParquetBatches(ex, path, partial(text_batch, kind=kind, user_only=True, skip=skip), cfg.batch_rows,
                                  cfg.workers), meta

        (sft, sft_meta), (rl, rl_meta) = side("sft"), side("rl")
        return cross_dedup(sft, sft_meta, rl, rl_meta, cfg, "rl prompt vs sft prompt")


def _id_source(frame: pl.DataFrame, skip: pl.Series) -> pl.DataFrame:
    return frame.filter(~member(skip, frame["uuid"])).select("uuid", "source")

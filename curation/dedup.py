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
dedup only. :func:`run_dedup` streams the
parquet row groups, so memory holds per-row keys, not tables: the exact pass's uuid, 16-byte text hash and
categorical source and domain (~80 bytes a row), then near-dedup's uuid, source, priority and length
(~70 bytes), a union-find parent and a chunk number (:func:`curation.minhash.near_dedup`: 16 bytes; the band
keys on disk). Its
per-batch passes run on an executor (:mod:`common.executor`: this process, or Ray Data).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from common.executor import Executor, LocalExecutor, ParquetBatches
from common.io import Rejects, finish_step
from common.take import member
from common.text import md5_halves, row_text, text_hashes, user_text
from curation.kept import by_source_and_reason, write_kept
from curation.minhash import cross_dedup, near_dedup

if TYPE_CHECKING:
    from curation.params import DedupParams, MinHashConfig

KINDS = ("sft", "rl")


def exact_duplicates(keys: pl.DataFrame) -> pl.DataFrame:
    """Rows of ``keys`` (``uuid``, ``h``, in table order) whose ``h`` occurred before:
    ``uuid`` and ``reason`` (``exact_duplicate: of <first uuid>``)."""
    first = keys["h"].is_first_distinct()
    dupes = keys.filter(~first)
    kept = (keys.filter(first).join(dupes.select("h"), on="h", how="semi")  # only the first rows that have copies
            .select("h", pl.col("uuid").alias("kept")))
    return (dupes.join(kept, on="h", how="left", maintain_order="left")
            .select("uuid", ("exact_duplicate: of " + pl.col("kept")).alias("reason")))


def exact_dedup(df: pl.DataFrame, kind: str, normalized: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split ``df`` into (kept, duplicates); ``duplicates`` has a ``reason`` column.

    ``kept`` keeps the input order and gains nothing; ``kept + duplicates``
    hold every input row exactly once.
    """
    dupes = exact_duplicates(pl.DataFrame({"uuid": df["uuid"], "h": text_hashes(df, kind, normalized)}))
    return (df.join(dupes, on="uuid", how="anti", maintain_order="left"),
            df.join(dupes, on="uuid", how="inner", maintain_order="left"))


def key_batch(frame: pl.DataFrame, kind: str, normalized: bool) -> pl.DataFrame:
    """Map of the exact pass: ``uuid``, ``h`` (:func:`text_hashes` as :func:`common.text.md5_halves`: 16
    bytes a row), ``source``, ``domain`` of each row."""
    return frame.select("uuid", md5_halves(text_hashes(frame, kind, normalized)).alias("h"), "source", "domain")


def text_batch(frame: pl.DataFrame, kind: str, user_only: bool, skip: pl.Series) -> pl.DataFrame:
    """Projection of the near passes: ``uuid``, ``text`` (row text, or the user turns) of the
    rows of ``frame`` whose uuid is not in ``skip`` (sorted: :func:`common.take.member`)."""
    text = user_text(kind) if user_only else row_text(kind)
    return frame.filter(~member(skip, frame["uuid"])).select("uuid", text.alias("text"))


def _gather(frames: Iterator[pl.DataFrame], schema: dict[str, Any]) -> pl.DataFrame:
    """The frames of a map, their ``source`` and ``domain`` as categoricals (4 bytes a row, not a string)
    as each arrives."""
    cat = [c for c in ("source", "domain") if c in schema]
    schema = {**schema, **dict.fromkeys(cat, pl.Categorical)}
    return pl.concat([pl.DataFrame(schema=schema), *(f.with_columns(pl.col(cat).cast(pl.Categorical)) for f in frames)])


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
        keys = _gather(ex.map_parquet(path, partial(key_batch, kind=kind, normalized=p.normalize), rows),
                       {"uuid": pl.Utf8, "h": pl.Struct({"hi": pl.UInt64, "lo": pl.UInt64}), "source": pl.Utf8,
                        "domain": pl.Utf8})
        exact = exact_duplicates(keys.select("uuid", "h"))
        parts = [exact]
        stats[kind] = {"rows_in": len(keys), "exact_duplicates": len(exact)}
        if near.enabled:
            exempt = keys.filter(pl.col("source").is_in(near.exempt_sources))["uuid"]
            skip = exact["uuid"].append(exempt).sort()
            meta = keys.filter(~pl.col("uuid").is_in(skip.implode())).select("uuid", "source", "domain")
            meta = meta.with_columns(
                (pl.col("domain") if near.scope == "within_domain"
                 else pl.lit("all")).alias("group"),
                pl.col("source").replace_strict(priority, default=len(priority), return_dtype=pl.Int64).alias("priority"))
            del keys, exempt  # a row's keys and hash are not held through near-dedup
            batches = ParquetBatches(ex, path, partial(text_batch, kind=kind, user_only=False, skip=skip), rows,
                                     cfg.workers)
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
    def side(kind: str):
        path, skip = src / f"{kind}.parquet", removed[kind]["uuid"].sort()
        meta = _gather(ex.map_parquet(path, partial(_id_source, skip=skip), cfg.batch_rows),
                       {"uuid": pl.Utf8, "source": pl.Utf8})
        return ParquetBatches(ex, path, partial(text_batch, kind=kind, user_only=True, skip=skip), cfg.batch_rows,
                              cfg.workers), meta

    (sft, sft_meta), (rl, rl_meta) = side("sft"), side("rl")
    return cross_dedup(sft, sft_meta, rl, rl_meta, cfg, "rl prompt vs sft prompt")


def _id_source(frame: pl.DataFrame, skip: pl.Series) -> pl.DataFrame:
    return frame.filter(~member(skip, frame["uuid"])).select("uuid", "source")

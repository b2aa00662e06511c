"""Near-duplicate removal: MinHash LSH with exact Jaccard verification.

1. Shingles: word n-grams (``ngram``, default 5) of the normalized text, hashed
   by :mod:`curation.ngrams`; ``shingle: char`` uses character n-grams instead
   (every character of the normalized text, a run of non-word characters read as ``_``).
2. Signatures: datasketch's MinHash (``scheme`` affine32, its seeded permutations
   ``a*fmix32(h)+b mod 2^32``; Broder 1997) computed with numpy over whole batches;
   equal to ``datasketch.MinHash(...).update_batch`` on the same 32-bit hashes.
3. LSH: ``bands`` x ``rows`` from the Jaccard ``threshold`` and ``num_perm`` by
   datasketch's ``_optimal_param`` (the false-negative weight is high because
   every candidate is verified); rows whose band keys collide are candidates.
4. Every candidate pair is verified by the exact Jaccard of its shingle sets
   (64-bit shingle hashes); only pairs with J >= threshold become edges.
5. Clusters are the connected components of verified edges. Each keeps one
   survivor, the member with the smallest key (source priority = registry order,
   then longest text, then smallest uuid); removed = rows - clusters.

Texts with fewer tokens than ``ngram`` have no shingle: they are matched by the
md5 of their normalized text instead (an exact-match edge with J = 1).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasketch
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from tqdm import tqdm

from common.executor import call_with, ordered_map, write_frames
from common.io import RowCursor, parquet_batches, scratch
from common.spill import spill_db
from common.take import matches, member, n_rows, take_rows
from common.text import md5_hex, normalize
from curation.ngrams import Tokens, fmix64, tokenize, window_hashes

if TYPE_CHECKING:
    from curation.params import AlarmParams, MinHashConfig

Batches = Callable[[], Iterable[pl.DataFrame]]
"""A re-iterable stream of frames with at least ``uuid`` and ``text`` (Utf8) columns; one with a
``map`` method (:class:`common.executor.ParquetBatches`) runs the per-batch passes on its executor."""


class DedupAlarm(RuntimeError):
    """A near-dedup alarm fired (cluster too large, or a source lost too many rows)."""


@dataclass
class BandKeys:
    """LSH keys of N texts in every band (:func:`band_keys`), read one band at a time (:meth:`band`, uint64
    ``[N]``): held in memory (``values`` uint64 ``[N, bands]``, 128 bytes a text at 16 bands) or, with
    ``path``, the parquet file :func:`compute_signatures` writes with ``spill`` (columns ``has`` and
    ``k0``..``k<bands-1>``), read from disk a band at a time. A text with no shingle has all-zero keys and
    is in no bucket (:attr:`has`)."""

    settings: dict[str, Any]
    values: np.ndarray | None = None
    path: Path | None = None

    def __len__(self) -> int:
        return len(self.values) if self.values is not None else n_rows(self.path)

    @property
    def has(self) -> np.ndarray:
        """bool ``[N]``: the texts with a shingle (non-zero keys)."""
        if self.values is not None:
            return self.values.any(axis=1)
        return pl.read_parquet(self.path, columns=["has"])["has"].to_numpy()

    def band(self, band: int) -> np.ndarray:
        """The keys uint64 ``[N]`` of every text in ``band``."""
        if self.values is not None:
            return self.values[:, band]
        return pl.read_parquet(self.path, columns=[f"k{band}"])[f"k{band}"].to_numpy()


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _tokens(texts: pl.Series, cfg: MinHashConfig) -> Tokens:
    if cfg.shingle == "word":
        return tokenize(texts)
    # char: every character of the normalized text is a token, a run of non-word characters one '_'
    chars = pl.DataFrame({"t": texts.fill_null("")}).select(
        normalize(pl.col("t")).str.replace_all(r"\W+", "_").str.replace_all(r"(.)", "$1 ").alias("t"))["t"]
    return tokenize(chars)


def shingles(texts: pl.Series, cfg: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes of each text: (uint64 ``[S]``, int64 text offsets ``[D + 1]``), not deduplicated."""
    tok = _tokens(texts, cfg)
    h, doc, _ = window_hashes(tok, cfg.ngram)
    return h, np.searchsorted(doc, np.arange(len(texts) + 1), side="left").astype(np.int64)


def minhash(h: np.ndarray, offsets: np.ndarray, cfg: MinHashConfig) -> np.ndarray:
    """Signatures uint32 ``[D, num_perm]`` of the shingle hash runs ``h[offsets[d]:offsets[d+1]]``.

    The 32-bit input of a shingle is the top half of its 64-bit hash; texts without
    shingles get all ``2^32 - 1``. Matches ``datasketch.MinHash(num_perm, seed,
    scheme='affine32', hashfunc=identity).update_batch(h32)`` bit for bit.
    """
    a, b = datasketch.MinHash(num_perm=cfg.num_perm, seed=cfg.seed, scheme=cfg.scheme).permutations
    sig = np.full((len(offsets) - 1, cfg.num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
    has = np.flatnonzero(np.diff(offsets) > 0)
    if len(has) == 0:
        return sig
    x = _fmix32((h >> np.uint64(32)).astype(np.uint32))
    buf = np.empty_like(x)
    for k in range(cfg.num_perm):  # one contiguous pass per permutation: ~40x faster than [S, P] blocks
        np.multiply(x, a[k], out=buf)
        buf += b[k]
        sig[has, k] = np.minimum.reduceat(buf, offsets[has])
    return sig


def map_batches(batches: Batches, fn: Callable[..., pl.DataFrame], workers: int = 1,
                **shared: Any) -> Iterator[pl.DataFrame]:
    """``fn(frame, **shared)`` on every frame of ``batches``, in order: on the stream's executor
    when it has one (:class:`common.executor.ParquetBatches`, e.g. Ray Data), else on
    ``workers`` threads. ``fn`` must be a pure per-batch function returning a frame."""
    if hasattr(batches, "map"):
        return batches.map(fn, **shared)
    return ordered_map(partial(call_with, fn, shared), iter(batches()), workers)


def release_workers(batches: Batches) -> None:
    """Stop the stream's executor's idle workers until its next map (:meth:`common.executor.Executor.release`),
    when it has one: 2 workers held ~1 GB through dedup's driver-only phases at 64x the default data."""
    if hasattr(batches, "release"):
        batches.release()


def signature_batch(frame: pl.DataFrame, cfg: MinHashConfig) -> pl.DataFrame:
    """Map of pass 1: ``uuid``, ``signature`` (Array[u32, num_perm], see :func:`minhash`),
    ``short_key`` (md5 hex of the normalized text when it has no shingle, else null) and
    ``length`` (i64 characters) of each row of ``frame`` (``uuid``, ``text``)."""
    h, off = shingles(frame["text"], cfg)
    short = np.flatnonzero(np.diff(off) == 0)  # few: only these texts are normalized and hashed
    keys = pl.Series("short_key", [None] * len(frame), pl.Utf8)
    if len(short):
        normed = frame[short].select(normalize(pl.col("text").fill_null("")))["text"]
        keys = keys.scatter(short, md5_hex(normed))
    return pl.DataFrame({
        "uuid": frame["uuid"], "signature": minhash(h, off, cfg), "short_key": keys,
        "length": frame["text"].str.len_chars().fill_null(0).cast(pl.Int64)},
        schema={"uuid": pl.Utf8, "signature": pl.Array(pl.UInt32, cfg.num_perm), "short_key": pl.Utf8,
                "length": pl.Int64})


def band_keys(values: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """LSH key uint64 ``[N, bands]`` of each signature (uint32 ``[N, bands * rows]``) in each band:
    fmix64 of the band's values weighted by fmix64(1..rows), plus the band number; equal band
    values give equal keys. A row with no shingle (all ``2^32 - 1``) gets all-zero keys."""
    mult = fmix64(np.arange(1, rows + 1, dtype=np.uint64))
    keys = np.zeros((len(values), bands), np.uint64)
    has = ~(values == np.iinfo(np.uint32).max).all(axis=1)
    for band in range(bands):
        keys[has, band] = fmix64((values[has, band * rows:(band + 1) * rows].astype(np.uint64) * mult).sum(axis=1)
                                 + np.uint64(band))
    return keys


def compute_signatures(batches: Batches, cfg: MinHashConfig, meta: pl.Series | Path, label: str = "rows",
                       out: Path | None = None, spill: Path | None = None
                       ) -> tuple[BandKeys, pl.DataFrame, np.ndarray | None]:
    """Pass 1 over ``batches`` (:func:`signature_batch` on each, see :func:`map_batches`): each text's
    :func:`band_keys` (:class:`BandKeys`, a quarter of the signature's bytes at 16 x 8), the md5 of the
    normalized text of the texts with no shingle (a frame of ``i``, the text's position, Int64, and ``k``,
    Utf8: only those texts), and every text's length in characters (int64 ``[N]``). The result depends
    neither on the executor nor on its workers. With ``out``, the signatures themselves are streamed to that
    parquet file (``uuid``, ``signature``, the settings in the metadata key ``minhash``).

    ``meta`` lists the texts in stream order: their uuids (a Series), or a parquet file with a ``uuid``
    column, read beside the stream a batch at a time (:class:`common.io.RowCursor`). With ``spill`` (a
    parquet file path), nothing is held per text: each batch's rows are written there as they come, the
    meta file's columns, then ``has`` (bool), ``length`` (int64) and the band keys ``k0``..``k<bands-1>``
    (uint64); the keys returned read it (:attr:`BandKeys.path`) and the lengths returned are None.

    Raises:
        ValueError: the batches do not stream ``meta``'s uuids, in that order.
    """
    settings = cfg.settings()
    bands, rows = settings["bands"], settings["rows"]
    if isinstance(meta, pl.Series):
        meta_schema = pa.schema({"uuid": pa.string()})
        cursor = RowCursor(meta.cast(pl.Utf8).rename("uuid").to_frame().to_arrow().to_batches(), label)
        n = len(meta)
    else:
        meta_schema = pq.ParquetFile(meta).schema_arrow
        cursor, n = RowCursor(parquet_batches(meta, cfg.batch_rows), label), n_rows(meta)
    spilled = pa.schema([*meta_schema, pa.field("has", pa.bool_()), pa.field("length", pa.int64()),
                         *(pa.field(f"k{b}", pa.uint64()) for b in range(bands))])
    parts, lengths, short = [], [np.zeros(0, np.int64)], []
    writer = pq.ParquetWriter(spill, spilled) if spill else None
    bar = tqdm(total=n, desc=f"minhash {label}", unit="rows", disable=None, file=sys.stderr)
    schema = pl.DataFrame(schema={"uuid": pl.Utf8, "signature": pl.Array(pl.UInt32, cfg.num_perm)}
                          ).to_arrow().schema.with_metadata({"minhash": json.dumps(settings)})
    done = 0
    different = f"{label}: batches and meta list different rows"

    def stream() -> Iterator[pl.DataFrame]:
        nonlocal done
        for frame in map_batches(batches, signature_batch, cfg.workers, cfg=cfg):
            if not len(frame):
                continue
            try:
                listed = cursor.take(len(frame))
            except ValueError:
                raise ValueError(different) from None
            if not frame["uuid"].equals(listed["uuid"].cast(pl.Utf8)):
                raise ValueError(different)
            values = frame["signature"].to_numpy().reshape(-1, cfg.num_perm).astype(np.uint32)
            keys = band_keys(values, bands, rows)
            if writer:
                cols = {"has": keys.any(axis=1), "length": frame["length"].to_numpy(),
                        **{f"k{b}": keys[:, b] for b in range(bands)}}
                arrays = [*listed.to_arrow().columns, *(pa.array(c) for c in cols.values())]
                writer.write_table(pa.Table.from_arrays(arrays, names=spilled.names).cast(spilled))
            else:
                parts.append(keys)
                lengths.append(frame["length"].to_numpy())
            at = frame["short_key"].is_not_null().arg_true()
            short.append(pl.DataFrame({"i": (at + done).cast(pl.Int64), "k": frame["short_key"].gather(at)}))
            done += len(frame)
            bar.update(len(frame))
            yield frame.select("uuid", "signature")

    try:
        if out:
            write_frames(stream(), out, schema)
        else:
            for _ in stream():
                pass
        try:
            cursor.finish()
        except ValueError:
            raise ValueError(different) from None
    finally:
        if writer:
            writer.close()
    bar.close()
    keys = (BandKeys(settings, path=spill) if spill else
            BandKeys(settings, np.concatenate(parts or [np.zeros((0, bands), np.uint64)])))
    short_keys = pl.concat([pl.DataFrame(schema={"i": pl.Int64, "k": pl.Utf8}), *short])
    return keys, short_keys, None if spill else np.concatenate(lengths)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard |A & B| / |A | B| of two sorted unique uint64 shingle sets (0 if both empty)."""
    inter = len(np.intersect1d(a, b, assume_unique=True))
    union = len(a) + len(b) - inter
    return inter / union if union else 0.0


def shingle_batch(frame: pl.DataFrame, cfg: MinHashConfig, wanted: pl.Series) -> pl.DataFrame:
    """Map of pass 2: ``uuid``, ``shingles`` (sorted unique u64 shingle hashes) and ``snippet``
    (first 120 characters) of the rows of ``frame`` (``uuid``, ``text``) whose uuid is in ``wanted`` (sorted:
    :func:`common.take.member`)."""
    frame = frame.filter(member(wanted, frame["uuid"]))
    h, off = shingles(frame["text"], cfg)
    return pl.DataFrame({"uuid": frame["uuid"],
                         "shingles": [np.unique(h[off[d]:off[d + 1]]) for d in range(len(frame))],
                         "snippet": [(t or "")[:120].replace("\n", " ") for t in frame["text"]]},
                        schema={"uuid": pl.Utf8, "shingles": pl.List(pl.UInt64), "snippet": pl.Utf8})


def shingle_sets(batches: Batches, cfg: MinHashConfig, wanted: Iterable[str]
                 ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Pass 2 (:func:`shingle_batch`): sorted unique shingle sets and a text snippet of the rows in ``wanted``."""
    uuids = wanted if isinstance(wanted, pl.Series) else pl.Series("uuid", list(wanted), pl.Utf8)
    return _set_dicts(map_batches(batches, shingle_batch, cfg.workers, cfg=cfg, wanted=uuids.unique().sort()))


def _set_dicts(frames: Iterable[pl.DataFrame]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    sets: dict[str, np.ndarray] = {}
    snippets: dict[str, str] = {}
    for frame in frames:
        for u, sh, t in zip(frame["uuid"], frame["shingles"], frame["snippet"], strict=True):
            sets[u] = sh.to_numpy().astype(np.uint64)
            snippets[u] = t
    return sets, snippets


def spill_shingle_sets(batches: Batches, cfg: MinHashConfig, chunks: pl.DataFrame, directory: Path) -> None:
    """Pass 2 in one streamed read (:func:`shingle_batch`): the shingle sets and snippets of the rows of
    ``chunks`` (``uuid``, ``chunk`` int) written to ``directory/<chunk>.parquet``, one file per chunk, to be
    read back a chunk at a time (:func:`read_shingle_sets`). One read of the table, however many chunks
    (a pass per chunk read the table rows x chunks times)."""
    writers: dict[int, pq.ParquetWriter] = {}
    chunks = chunks.sort("uuid")
    chunk_of = chunks["chunk"].to_numpy()
    try:
        for frame in map_batches(batches, shingle_batch, cfg.workers, cfg=cfg, wanted=chunks["uuid"]):
            rows, at = matches(chunks["uuid"], frame["uuid"])
            for (chunk,), part in frame[rows].with_columns(pl.Series("chunk", chunk_of[at])).group_by("chunk"):
                table = part.drop("chunk").to_arrow()
                if chunk not in writers:
                    writers[chunk] = pq.ParquetWriter(directory / f"{chunk}.parquet", table.schema)
                writers[chunk].write_table(table)
    finally:
        for writer in writers.values():
            writer.close()


def read_shingle_sets(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The shingle sets and snippets of one chunk written by :func:`spill_shingle_sets`."""
    return _set_dicts([pl.read_parquet(path)])


def verify(pairs: np.ndarray, uuids: Iterable[str], sets: dict[str, np.ndarray], threshold: float) -> pl.DataFrame:
    """Exact Jaccard of every candidate pair (rows ``i``, ``j`` of ``uuids``): ``i``, ``j``, ``jaccard``, ``edge``
    (J >= threshold)."""
    ids = pl.Series("uuid", uuids, pl.Utf8)
    js = [jaccard(sets[a], sets[b]) for a, b in zip(ids.gather(pairs[:, 0]), ids.gather(pairs[:, 1]), strict=True)]
    return pl.DataFrame({"i": pairs[:, 0], "j": pairs[:, 1], "jaccard": np.asarray(js, dtype=np.float64)},
                        schema={"i": pl.Int64, "j": pl.Int64, "jaccard": pl.Float64}
                        ).with_columns((pl.col("jaccard") >= threshold).alias("edge"))


def exact_edges(short_keys: pl.DataFrame) -> np.ndarray:
    """Edges int64 ``[E, 2]`` joining each shingle-less text to the first text of its group
    with the same normalized-text md5 (the short-text fallback). ``short_keys``: ``i`` (Int64, the text's
    position, ascending), ``k`` (the md5) and ``group`` (the scope) of the shingle-less texts
    (:func:`compute_signatures`)."""
    f = short_keys.with_columns(pl.col("i").first().over("group", "k").alias("first")).filter(pl.col("i") != pl.col("first"))
    return f.select("first", "i").to_numpy().astype(np.int64).reshape(-1, 2)


def components(n: int, edges: np.ndarray) -> np.ndarray:
    """Connected-component label int32 ``[n]`` of the undirected graph ``edges`` ``[E, 2]`` (scipy)."""
    graph = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def survivors(meta: pl.DataFrame, labels: np.ndarray) -> pl.DataFrame:
    """One survivor per cluster: the smallest (``priority``, -``length``, ``uuid``).

    ``meta`` has ``uuid``, ``priority`` (int), ``length`` (int, characters) in text order; returns
    ``meta`` plus ``cluster`` (int) and ``survivor`` (uuid of the cluster's survivor).
    """
    m = meta.with_columns(pl.Series("cluster", labels, dtype=pl.Int64))
    best = (m.sort("priority", pl.col("length"), "uuid", descending=[False, True, False])
            .group_by("cluster", maintain_order=True).first().select("cluster", pl.col("uuid").alias("survivor")))
    return m.join(best, on="cluster", how="left", maintain_order="left")


def check_alarms(removed: pl.DataFrame, clustered: pl.DataFrame, sources: pl.DataFrame, snippets: dict[str, str],
                 alarms: AlarmParams, label: str) -> list[str]:
    """Alarm messages: clusters with more than ``max_cluster_size`` members (shown: uuids
    and text), sources losing more than ``max_source_loss`` (a fraction) of their rows.
    ``clustered``: ``uuid``, ``cluster`` and ``survivor`` of at least every row of a cluster of two or
    more; ``sources``: ``source`` and ``len``, the rows of each source.
    Raises DedupAlarm with the messages when ``on_alarm`` is ``fail``."""
    out = []
    sizes = clustered.group_by("cluster").agg(pl.len().alias("n"), pl.col("uuid"), pl.col("survivor").first())
    for row in sizes.filter(pl.col("n") > alarms.max_cluster_size).sort("n", descending=True).iter_rows(named=True):
        shown = "\n    ".join(f"{u}: {snippets.get(u, '')!r}" for u in sorted(row["uuid"])[:8])
        out.append(f"{label}: near-duplicate cluster of {row['n']} rows > max_cluster_size "
                   f"{alarms.max_cluster_size} (survivor {row['survivor']}):\n    {shown}")
    per = (sources.with_columns(pl.col("source").cast(pl.Utf8))
           .join(removed.group_by("source").len().rename({"len": "lost"}), on="source", how="left")
           .fill_null(0).sort("source"))
    for row in per.iter_rows(named=True):
        if row["lost"] > alarms.max_source_loss * row["len"]:
            out.append(f"{label}: source {row['source']} loses {row['lost']}/{row['len']} rows to near-dedup "
                       f"> max_source_loss {alarms.max_source_loss}")
    if out and alarms.on_alarm == "fail":
        raise DedupAlarm("near-dedup alarm (set dedup.near.alarms.on_alarm: warn to continue):\n" + "\n".join(out))
    for msg in out:
        print(f"WARNING {msg}", file=sys.stderr)
    return out


class UnionFind:
    """Disjoint sets over ``n`` items (int64 parent array, union by smaller root); vectorized finds."""

    def __init__(self, n: int) -> None:
        self.parent = np.arange(n, dtype=np.int64)

    def roots(self, x: np.ndarray) -> np.ndarray:
        """Root of each item of ``x`` (int64), compressing the paths it walks."""
        r = self.parent[x]
        while True:
            up = self.parent[r]
            if (up == r).all():
                self.parent[x] = r
                return r
            r = up

    def union(self, a: int, bs: np.ndarray) -> None:
        """Join item ``a`` with every item of ``bs`` (the smallest root becomes the set's root)."""
        r = np.unique(self.roots(np.append(bs, a)))
        self.parent[r] = r[0]


def lsh_buckets(rows: Path, bands: int) -> pl.DataFrame:
    """Band collisions: one row per bucket of >= 2 texts of one group with equal keys in one band,
    ``band`` (i32) and ``members`` (list[i64], ascending positions in ``rows``), in (band, first member) order.
    ``rows``: the parquet file :func:`compute_signatures` spills, with ``group`` (the scope), ``has`` and the
    keys ``k0``..``k<bands-1>``; texts with no shingle (``has`` false) are in no bucket. Grouped by DuckDB
    a band at a time under its memory limit (:func:`common.spill.spill_db`), so memory holds the buckets,
    not a key per text."""
    frames = [pl.DataFrame(schema={"band": pl.Int32, "members": pl.List(pl.Int64)})]
    with spill_db(ordered=False) as db:
        for band in range(bands):
            frames.append(pl.from_arrow(db.sql(
                f"""SELECT {band}::INTEGER AS band, list(i) AS members
                    FROM (SELECT "group" AS g, k{band} AS k, file_row_number AS i
                          FROM read_parquet($rows, file_row_number = true) WHERE has)
                    GROUP BY g, k HAVING count(*) > 1""", params={"rows": str(rows)}).to_arrow_table()))
    return (pl.concat(frames).with_columns(pl.col("members").list.sort())
            .with_columns(pl.col("members").list.first().alias("first"))
            .sort("band", "first").select("band", "members"))


def jaccard_many(a: np.ndarray, others: list[np.ndarray]) -> np.ndarray:
    """Exact Jaccard (float64 ``[len(others)]``) of the sorted unique uint64 set ``a`` with each of
    ``others`` in one vectorized pass (0 where both are empty)."""
    sizes = np.fromiter((len(o) for o in others), np.int64, len(others))
    if not len(others):
        return np.zeros(0)
    x = np.concatenate(others)
    pos = np.minimum(np.searchsorted(a, x), max(len(a) - 1, 0))
    hit = (a[pos] == x) if len(a) else np.zeros(len(x), bool)
    inter = np.bincount(np.repeat(np.arange(len(others)), sizes), weights=hit, minlength=len(others))
    union = len(a) + sizes - inter
    return np.divide(inter, union, out=np.zeros(len(others)), where=union > 0)


def resolve_bucket(members: np.ndarray, sets: list[np.ndarray], uf: UnionFind, threshold: float,
                   rejected: set[tuple[int, int]]) -> tuple[int, int]:
    """Join the rows of one LSH bucket whose exact Jaccard is >= ``threshold``, verifying only the
    pairs not already in one set: each member in turn against the later members of other sets,
    until all are one set. The sets left equal the connected components of the bucket's verified
    pairs (a skipped pair joins nothing new), in O(members) checks when they are near-copies.
    ``sets[k]`` is the shingle set of ``members[k]``; ``rejected`` caches pairs below the threshold
    (a pair shares several bands). Returns (pairs verified, pairs joined)."""
    verified = joined = 0
    ids = members.tolist()
    for t in range(len(members) - 1):
        r = uf.roots(members)
        if (r == r[0]).all():
            break
        later = np.flatnonzero(r[t + 1:] != r[t]) + t + 1
        later = np.array([k for k in later.tolist() if (ids[t], ids[k]) not in rejected], np.int64)
        if not len(later):
            continue
        js = jaccard_many(sets[t], [sets[k] for k in later])
        verified += len(later)
        ok = js >= threshold
        rejected.update((ids[t], ids[k]) for k in later[~ok].tolist())
        if ok.any():
            uf.union(members[t], members[later[ok]])
            joined += int(ok.sum())
    return verified, joined


def near_dedup(batches: Batches, meta: pl.DataFrame | Path, cfg: MinHashConfig, alarms: AlarmParams,
               label: str = "rows", verify_chars: int = 300_000_000, signatures: Path | None = None
               ) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Near-duplicates of the texts streamed by ``batches``.

    Candidates are resolved per candidate cluster (rows joined by any band collision, or by the
    short-text md5), never as a list of pairs: a union-find over the verified pairs of each LSH
    bucket (:func:`resolve_bucket`, exact Jaccard vectorized by :func:`jaccard_many`). The clusters
    are the connected components of the verified candidate pairs, exactly.

    Memory holds the candidates, not the rows: the first pass writes each text's meta, length and band
    keys to a file in the step's scratch (:func:`compute_signatures` with ``spill``); DuckDB finds the
    buckets from it a band at a time (:func:`lsh_buckets`); the union-find, the candidate clusters and the
    meta read back (:func:`common.take.take_rows`) are over the candidate texts only (those in a bucket or
    with a short-text twin). Shingle sets are held for texts of at most ``verify_chars`` characters at a
    time (chunks of candidate clusters; a larger cluster is one chunk): one streamed pass writes every
    candidate's set to its chunk's file in scratch (:func:`spill_shingle_sets`), then chunks are read back
    one by one.

    Args:
        batches: re-iterable stream of frames with ``uuid`` and ``text``, read twice (signatures, shingle sets).
        meta: one row per streamed text, same order (a frame, or a parquet file read a batch at a time):
            ``uuid``, ``source``, ``group`` (the scope: texts of different groups are never compared),
            ``priority`` (int, lower survives; then the longer text, then the smaller uuid).
        alarms: :class:`AlarmParams`.
        verify_chars: characters of text whose shingle sets are held at once (``dedup.near.verify_chars``;
            a word 5-gram set takes ~1.5 bytes a character).
        signatures: stream the signatures to this parquet file too (:func:`compute_signatures`).

    Returns:
        (removed, stats): ``removed`` has
        ``uuid``, ``source`` and ``reason`` (``near_duplicate: of <survivor> J=<exact Jaccard to it>``);
        ``stats`` counts LSH buckets, candidate clusters, verified pairs (Jaccard computed), joining pairs
        (verified >= threshold between two sets), clusters and removals.

    Raises:
        DedupAlarm: an alarm fired and ``on_alarm`` is ``fail``.
    """
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="near-dedup-") as tmp:
        spill = Path(tmp)
        if isinstance(meta, pl.DataFrame):
            meta.write_parquet(spill / "meta.parquet")
            meta = spill / "meta.parquet"
        texts = spill / "texts.parquet"  # a row per text: its meta, length and band keys
        _, short_keys, _ = compute_signatures(batches, cfg, meta, label, signatures, texts)
        release_workers(batches)  # banding and clustering are the driver's
        n = n_rows(texts)
        buckets = lsh_buckets(texts, cfg.settings()["bands"])
        groups = _rows(texts, short_keys["i"].to_numpy().astype(np.int64), ["group"])["group"]
        short = exact_edges(short_keys.with_columns(groups))
        flat = buckets["members"].explode().to_numpy().astype(np.int64)
        lens = buckets["members"].list.len().to_numpy().astype(np.int64)
        starts = np.cumsum(lens) - lens
        band_of = buckets["band"].to_numpy()
        ids = np.unique(np.concatenate([flat, short.ravel()]))  # the candidates' positions; from here on,
        flat, short = np.searchsorted(ids, flat), np.searchsorted(ids, short)  # a candidate is its number
        n_candidates = len(ids)
        others = np.ones(len(flat), bool)
        others[starts] = False
        star = np.stack([np.repeat(flat[starts], lens - 1), flat[others]], axis=1)
        candidate = components(n_candidates, np.concatenate([star, short]).astype(np.int64))
        del star, others
        cmeta = _rows(texts, ids, ["uuid", "source", "priority", "length"])
        uf = UnionFind(n_candidates)
        for a, b in short:
            uf.union(int(a), np.array([b]))
        sizes = np.bincount(candidate)  # every candidate cluster has two or more members
        chars = np.bincount(candidate, weights=cmeta["length"].to_numpy() + 1)
        chunk_of = np.cumsum(chars).astype(np.int64) // max(verify_chars, 1)  # each candidate cluster's chunk
        first = flat[starts]
        order = np.argsort(candidate[first], kind="stable")  # buckets by candidate cluster
        bucket_chunk = chunk_of[candidate[first][order]]
        rows_of = chunk_of[candidate]  # each candidate's
        verified = joined = 0
        js: dict[str, float] = {}
        snippets: dict[str, str] = {}
        spill_shingle_sets(batches, cfg, pl.DataFrame({"uuid": cmeta["uuid"], "chunk": rows_of}), spill)
        release_workers(batches)  # so is verification
        for chunk in np.unique(rows_of):
            rows = np.flatnonzero(rows_of == chunk)
            wanted = cmeta["uuid"].gather(rows)
            sets_u, snips = read_shingle_sets(spill / f"{chunk}.parquet")
            sets = {i: sets_u.get(u, np.zeros(0, np.uint64)) for i, u in zip(rows.tolist(), wanted, strict=True)}
            rejected: set[tuple[int, int]] = set()  # a chunk's pairs: its clusters are no other chunk's
            lo, hi = np.searchsorted(bucket_chunk, [chunk, chunk + 1])
            todo_all = np.sort(order[lo:hi])  # band by band: a bucket whose rows an earlier band joined is skipped
            for band in np.unique(band_of[todo_all]):
                todo = todo_all[band_of[todo_all] == band]
                seg = np.concatenate([[0], np.cumsum(lens[todo])[:-1]]).astype(np.int64)
                pos = np.repeat(starts[todo] - seg, lens[todo]) + np.arange(int(lens[todo].sum()))
                roots = uf.roots(flat[pos])
                todo = todo[np.minimum.reduceat(roots, seg) != np.maximum.reduceat(roots, seg)]
                for b in todo:
                    m = flat[starts[b]:starts[b] + lens[b]]
                    v, j = resolve_bucket(m, [sets[i] for i in m], uf, cfg.threshold, rejected)
                    verified, joined = verified + v, joined + j
            part = survivors(cmeta[rows], uf.roots(rows))
            size = part.group_by("cluster").len()
            big = set(size.filter(pl.col("len") > alarms.max_cluster_size)["cluster"].to_list())
            index = dict(zip(wanted.to_list(), rows.tolist(), strict=True))
            for u, s in part.filter(pl.col("uuid") != pl.col("survivor")).select("uuid", "survivor").iter_rows():
                a, b = sets[index[u]], sets[index[s]]
                js[u] = 1.0 if len(a) == 0 else jaccard(a, b)
            for u, c in part.select("uuid", "cluster").iter_rows():
                if c in big:
                    snippets[u] = snips.get(u, "")
        sources = pl.scan_parquet(texts).group_by("source").len().collect(engine="streaming")
    m = survivors(cmeta, uf.roots(np.arange(n_candidates)))
    dup = m.filter(pl.col("uuid") != pl.col("survivor"))
    removed = (dup.with_columns(pl.Series("j", [js[u] for u in dup["uuid"]], dtype=pl.Float64).round(2))
               .with_columns(pl.format("near_duplicate: of {} J={}", "survivor", "j").alias("reason"))
               .select("uuid", pl.col("source").cast(pl.Utf8), "reason"))
    fired = check_alarms(removed, m, sources, snippets, alarms, label)
    n_clusters = n - n_candidates + m["cluster"].n_unique()
    stats = {"settings": cfg.settings(), "rows": n, "lsh_buckets": len(buckets),
             "candidate_clusters": len(sizes), "largest_candidate_cluster": int(sizes.max(initial=min(n, 1))),
             "verified_pairs": verified, "joining_pairs": joined, "short_text_edges": len(short),
             "clusters": n_clusters, "removed": len(removed),
             "largest_cluster": int(m.group_by("cluster").len()["len"].max() or min(n, 1)), "alarms": fired}
    if len(removed) != n - n_clusters:
        raise AssertionError(f"{label}: removed {len(removed)} != rows {n} - clusters {n_clusters}")
    return removed, stats


def _rows(path: Path, positions: np.ndarray, columns: list[str]) -> pl.DataFrame:
    """``columns`` of the rows of the parquet file ``path`` at ``positions`` (int64, ascending), in that order."""
    if not len(positions):
        return pl.read_parquet(path, columns=columns, n_rows=0)
    return pl.concat(take_rows(path, rows=positions, columns=columns))


def cross_dedup(ref: Batches, ref_meta: pl.DataFrame | Path, query: Batches, query_meta: pl.DataFrame | Path,
                cfg: MinHashConfig, label: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Query texts that near-duplicate a reference text (e.g. RL prompts vs SFT prompts).

    Only reference-query pairs are compared and only query rows are removed: each
    query row with a verified edge (or, without shingles, an equal normalized-text
    md5: J = 1) gets ``near_duplicate: of <ref uuid> J=<J> (<label>)`` naming its
    most similar reference row (ties: smallest uuid). ``*_meta`` have ``uuid`` and
    ``source`` in stream order (a frame, or a parquet file read a batch at a time). Like
    :func:`near_dedup`, memory holds the candidates, not the rows: each side's band keys go to a file in
    the step's scratch and DuckDB joins them a band at a time (:func:`cross_pairs`). Returns (removed, stats).
    """
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="cross-dedup-") as tmp:
        files, shorts, n = [], [], 0
        for side, batches, meta in (("ref", ref, ref_meta), ("query", query, query_meta)):
            if isinstance(meta, pl.DataFrame):
                meta.select("uuid", "source").write_parquet(Path(tmp) / f"{side}-meta.parquet")
                meta = Path(tmp) / f"{side}-meta.parquet"
            files.append(Path(tmp) / f"{side}.parquet")
            shorts.append(compute_signatures(batches, cfg, meta, label, spill=files[-1])[1])
            n += n_rows(files[-1])
        short = shorts[1].join(shorts[0], on="k", suffix="_ref").select("i_ref", "i")
        pairs = np.concatenate([cross_pairs(files[0], files[1], cfg.settings()["bands"]),
                                short.to_numpy().astype(np.int64).reshape(-1, 2)])
        ref_ids, query_ids = np.unique(pairs[:, 0]), np.unique(pairs[:, 1])  # the candidates of each side
        rows = pl.concat([_rows(files[0], ref_ids, ["uuid", "source"]), _rows(files[1], query_ids, ["uuid", "source"])])
    n_pairs, n_short = len(pairs) - len(short), len(short)
    pairs = np.stack([np.searchsorted(ref_ids, pairs[:, 0]), len(ref_ids) + np.searchsorted(query_ids, pairs[:, 1])], 1)
    uuids = rows["uuid"].cast(pl.Utf8)
    wanted = uuids.gather(np.unique(pairs[:n_pairs]))
    sets = {**shingle_sets(ref, cfg, wanted)[0], **shingle_sets(query, cfg, wanted)[0]}
    exact = pl.DataFrame({"i": pairs[n_pairs:, 0], "j": pairs[n_pairs:, 1], "jaccard": np.ones(n_short), "edge": True},
                         schema={"i": pl.Int64, "j": pl.Int64, "jaccard": pl.Float64, "edge": pl.Boolean})
    checked = pl.concat([verify(pairs[:n_pairs], uuids, sets, cfg.threshold), exact])
    edges = checked.filter("edge")
    hits = (pl.DataFrame({"uuid": uuids.gather(edges["j"]), "ref": uuids.gather(edges["i"]),
                          "jaccard": edges["jaccard"]}, schema={"uuid": pl.Utf8, "ref": pl.Utf8, "jaccard": pl.Float64})
            .sort("uuid", "jaccard", "ref", descending=[False, True, False]).group_by("uuid", maintain_order=True).first())
    removed = (hits.join(rows.with_columns(pl.col("source").cast(pl.Utf8)), on="uuid", how="left")
               .with_columns(pl.format("near_duplicate: of {} J={} ({})", "ref", pl.col("jaccard").round(2),
                                       pl.lit(label)).alias("reason")).select("uuid", "source", "reason"))
    return removed, {"settings": cfg.settings(), "rows": n, "candidate_pairs": n_pairs,
                     "verified_edges": int(checked["edge"].sum()), "removed": len(removed)}


def cross_pairs(ref: Path, query: Path, bands: int) -> np.ndarray:
    """Candidate pairs int64 ``[C, 2]`` (position in ``ref``, position in ``query``; unique, sorted) of texts
    whose band keys are equal in at least one band: a DuckDB join of the two files
    :func:`compute_signatures` spills (``has``, ``k0``..``k<bands-1>``), a band at a time under its memory
    limit. Texts with no shingle are in no pair."""
    side = "SELECT k{b} AS k, file_row_number AS i FROM read_parquet(${f}, file_row_number = true) WHERE has"
    frames = [pl.DataFrame(schema={"i": pl.Int64, "j": pl.Int64})]
    with spill_db(ordered=False) as db:
        for b in range(bands):
            frames.append(pl.from_arrow(db.sql(
                f"SELECT r.i, q.i AS j FROM ({side.format(b=b, f='ref')}) r JOIN ({side.format(b=b, f='query')}) q "
                "USING (k)", params={"ref": str(ref), "query": str(query)}).to_arrow_table()))
    return pl.concat(frames).unique().sort("i", "j").to_numpy().astype(np.int64).reshape(-1, 2)

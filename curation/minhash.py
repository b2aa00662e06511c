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
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from tqdm import tqdm

from common.executor import call_with, ordered_map, write_frames
from common.io import scratch
from common.take import matches, member
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
    ``directory`` (what :func:`compute_signatures` writes with ``spill``), in one raw file per band
    (``band<b>.u64``), so banding holds one band (8 bytes a text) instead of all of them.
    ``has``: bool ``[N]``, the texts with a shingle (non-zero keys); the others are in no bucket."""

    has: np.ndarray
    settings: dict[str, Any]
    values: np.ndarray | None = None
    directory: Path | None = None

    def __len__(self) -> int:
        return len(self.has)

    def band(self, band: int) -> np.ndarray:
        """The keys uint64 ``[N]`` of every text in ``band``."""
        if self.values is not None:
            return self.values[:, band]
        return np.fromfile(self.directory / f"band{band}.u64", np.uint64)

    @classmethod
    def concat(cls, parts: list[BandKeys]) -> BandKeys:
        """Stack the keys of several passes (in memory); raises ValueError when their settings differ
        (keys of different settings never collide meaningfully)."""
        if not parts:
            raise ValueError("no band keys to concatenate")
        for p in parts[1:]:
            if p.settings != parts[0].settings:
                diff = {k: (parts[0].settings.get(k), p.settings.get(k))
                        for k in parts[0].settings.keys() | p.settings.keys()
                        if parts[0].settings.get(k) != p.settings.get(k)}
                raise ValueError(f"refusing to mix MinHash signatures made with different settings: {diff}")
        bands = parts[0].settings["bands"]
        values = np.stack([np.concatenate([p.band(b) for p in parts]) for b in range(bands)], axis=1)
        return cls(np.concatenate([p.has for p in parts]), parts[0].settings, values)


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


def compute_signatures(batches: Batches, cfg: MinHashConfig, uuids: pl.Series, label: str = "rows",
                       out: Path | None = None, spill: Path | None = None
                       ) -> tuple[BandKeys, pl.DataFrame, np.ndarray]:
    """Pass 1 over ``batches`` (:func:`signature_batch` on each, see :func:`map_batches`): each text's
    :func:`band_keys` (:class:`BandKeys`, a quarter of the signature's bytes at 16 x 8; with ``spill``, a
    directory, written there band by band instead of held), the md5 of the normalized text of the texts
    with no shingle (a frame of ``i``, the text's position, Int64, and ``k``, Utf8: only those texts), and
    every text's length in characters (int64 ``[N]``). The result depends neither on the executor nor on
    its workers. With ``out``, the signatures themselves are streamed to that parquet file (``uuid``,
    ``signature``, the settings in the metadata key ``minhash``).

    Raises:
        ValueError: the batches do not stream ``uuids`` (the texts' meta), in that order.
    """
    settings = cfg.settings()
    bands, rows = settings["bands"], settings["rows"]
    parts, has, lengths, short = [], [np.zeros(0, bool)], [np.zeros(0, np.int64)], []
    files = [open(spill / f"band{b}.u64", "wb") for b in range(bands)] if spill else []  # noqa: SIM115
    bar = tqdm(total=len(uuids), desc=f"minhash {label}", unit="rows", disable=None, file=sys.stderr)
    schema = pl.DataFrame(schema={"uuid": pl.Utf8, "signature": pl.Array(pl.UInt32, cfg.num_perm)}
                          ).to_arrow().schema.with_metadata({"minhash": json.dumps(settings)})
    done = 0

    def stream() -> Iterator[pl.DataFrame]:
        nonlocal done
        for frame in map_batches(batches, signature_batch, cfg.workers, cfg=cfg):
            if not frame["uuid"].equals(uuids.slice(done, len(frame)).cast(pl.Utf8).rename("uuid")):
                raise ValueError(f"{label}: batches and meta list different rows")
            values = frame["signature"].to_numpy().reshape(-1, cfg.num_perm).astype(np.uint32)
            keys = band_keys(values, bands, rows)
            for band, f in enumerate(files):
                f.write(np.ascontiguousarray(keys[:, band]).tobytes())
            if not spill:
                parts.append(keys)
            has.append(keys.any(axis=1))
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
    finally:
        for f in files:
            f.close()
    bar.close()
    if done != len(uuids):
        raise ValueError(f"{label}: batches and meta list different rows")
    keys = BandKeys(np.concatenate(has), settings, None if spill else np.concatenate(
        parts or [np.zeros((0, bands), np.uint64)]), spill)
    short_keys = pl.concat([pl.DataFrame(schema={"i": pl.Int64, "k": pl.Utf8}), *short])
    return keys, short_keys, np.concatenate(lengths)


def lsh_candidates(keys: BandKeys, groups: np.ndarray) -> np.ndarray:
    """Candidate pairs int64 ``[C, 2]`` (i < j, sorted, unique): rows of the same group whose
    :class:`BandKeys` are equal in at least one band. Rows with no shingle are
    skipped. Lists every pair: for the cross-table pass, whose pairs are not near-copies of each other.
    Memory: one band's colliding rows and pairs at a time, then the pairs."""
    idx = np.flatnonzero(keys.has)
    pairs = []
    for band in range(keys.settings["bands"]):
        multi = pl.DataFrame({"g": groups[idx], "k": keys.band(band)[idx], "i": idx}).filter(pl.len().over("g", "k") > 1)
        pairs.append(multi.join(multi, on=["g", "k"], suffix="_j").filter(pl.col("i") < pl.col("i_j"))
                     .select("i", "i_j"))
    return pl.concat(pairs).unique().sort("i", "i_j").to_numpy().astype(np.int64).reshape(-1, 2)


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
    import pyarrow.parquet as pq

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


def exact_edges(short_keys: pl.DataFrame, groups: np.ndarray) -> np.ndarray:
    """Edges int64 ``[E, 2]`` joining each shingle-less text to the first text of its group
    with the same normalized-text md5 (the short-text fallback). ``short_keys``: ``i`` (Int64, the text's
    position, ascending) and ``k`` (the md5) of the shingle-less texts (:func:`compute_signatures`)."""
    f = short_keys.select("k", pl.Series("g", groups[short_keys["i"].to_numpy()]), "i")
    f = f.with_columns(pl.col("i").first().over("g", "k").alias("first")).filter(pl.col("i") != pl.col("first"))
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


def check_alarms(removed: pl.DataFrame, clustered: pl.DataFrame, sources: pl.Series, snippets: dict[str, str],
                 alarms: AlarmParams, label: str) -> list[str]:
    """Alarm messages: clusters with more than ``max_cluster_size`` members (shown: uuids
    and text), sources losing more than ``max_source_loss`` (a fraction) of their rows.
    ``clustered``: ``uuid``, ``cluster`` and ``survivor`` of at least every row of a cluster of two or
    more; ``sources``: the source of every row.
    Raises DedupAlarm with the messages when ``on_alarm`` is ``fail``."""
    out = []
    sizes = clustered.group_by("cluster").agg(pl.len().alias("n"), pl.col("uuid"), pl.col("survivor").first())
    for row in sizes.filter(pl.col("n") > alarms.max_cluster_size).sort("n", descending=True).iter_rows(named=True):
        shown = "\n    ".join(f"{u}: {snippets.get(u, '')!r}" for u in sorted(row["uuid"])[:8])
        out.append(f"{label}: near-duplicate cluster of {row['n']} rows > max_cluster_size "
                   f"{alarms.max_cluster_size} (survivor {row['survivor']}):\n    {shown}")
    per = (sources.rename("source").to_frame().group_by("source").len().with_columns(pl.col("source").cast(pl.Utf8))
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


def lsh_buckets(keys: BandKeys, groups: np.ndarray) -> pl.DataFrame:
    """Band collisions: one row per bucket of >= 2 rows of one group with equal keys in one band,
    ``band`` (i32) and ``members`` (list[i64], ascending row indices), in (band, first member) order.
    ``groups``: a code per row (any integer dtype); rows with no shingle (``keys.has`` false) are in none.
    Memory: one band's keys at a time (from :class:`BandKeys`' files when spilled) and the buckets, not pairs."""
    idx = np.flatnonzero(keys.has)
    frames = []
    for band in range(keys.settings["bands"]):
        f = pl.DataFrame({"g": groups[idx], "k": keys.band(band)[idx], "i": idx}).filter(pl.len().over("g", "k") > 1)
        frames.append(f.group_by("g", "k").agg(pl.col("i").sort().alias("members"))
                      .select(pl.lit(band, pl.Int32).alias("band"), "members"))
    return (pl.concat(frames).with_columns(pl.col("members").list.first().alias("first"))
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


def near_dedup(batches: Batches, meta: pl.DataFrame, cfg: MinHashConfig, alarms: AlarmParams,
               label: str = "rows", verify_chars: int = 300_000_000, signatures: Path | None = None
               ) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Near-duplicates of the texts streamed by ``batches``.

    Candidates are resolved per candidate cluster (rows joined by any band collision, or by the
    short-text md5), never as a list of pairs: a union-find over the verified pairs of each LSH
    bucket (:func:`resolve_bucket`, exact Jaccard vectorized by :func:`jaccard_many`). The clusters
    are the connected components of the verified candidate pairs, exactly. Shingle sets are held for
    rows of at most ``verify_chars`` characters at a time (chunks of candidate clusters; a larger cluster
    is one chunk), so memory does not grow with the corpus: one streamed pass writes every candidate row's
    set to its chunk's file in the step's scratch (:func:`spill_shingle_sets`), then chunks are read back one by one.
    The band keys go to that scratch too (:class:`BandKeys`, read a band at a time); what stays per row is
    ``meta`` (with ``group`` dropped once coded), a union-find parent and a chunk number (16 bytes).

    Args:
        batches: re-iterable stream of frames with ``uuid`` and ``text``, read twice (signatures, shingle sets).
        meta: one row per streamed text, same order: ``uuid``, ``source``, ``group`` (the
            scope: texts of different groups are never compared), ``priority`` (int,
            lower survives; then the longer text, then the smaller uuid).
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
    n = len(meta)
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="near-dedup-") as tmp:
        spill = Path(tmp)
        (spill / "bands").mkdir()
        keys, short_keys, lengths = compute_signatures(batches, cfg, meta["uuid"], label, signatures, spill / "bands")
        release_workers(batches)  # banding and clustering are the driver's
        meta = meta.with_columns(pl.Series("length", lengths, dtype=pl.Int64))
        groups = meta["group"].cast(pl.Utf8).rank("dense").to_numpy()  # a code per group
        meta = meta.drop("group")
        buckets = lsh_buckets(keys, groups)
        short = exact_edges(short_keys, groups)
        del keys, groups, lengths  # per-row state from here: meta, the union-find and each row's chunk
        first = buckets["members"].list.first().to_numpy()
        star = buckets.select(pl.col("members").list.first().alias("a"), pl.col("members").list.slice(1).alias("b")
                              ).explode("b").select("a", "b").to_numpy().reshape(-1, 2)
        candidate = components(n, np.concatenate([star, short]).astype(np.int64))
        del star
        uf = UnionFind(n)
        for a, b in short:
            uf.union(int(a), np.array([b]))
        counts = np.bincount(candidate, minlength=n)
        largest, clusters = int(counts.max(initial=0)), np.flatnonzero(counts > 1)
        del counts
        chunk_of = np.full(n, -1, np.int64)
        chars = np.bincount(candidate, weights=meta["length"].to_numpy() + 1, minlength=n)
        chunk_of[clusters] = np.cumsum(chars[clusters]).astype(np.int64) // max(verify_chars, 1)
        del chars
        order = np.argsort(candidate[first], kind="stable")  # buckets by candidate cluster
        bucket_chunk = chunk_of[candidate[first][order]]
        rows_of = chunk_of[candidate]  # each row's chunk (-1: in no candidate cluster of two or more)
        del candidate, chunk_of
        flat = buckets["members"].explode().to_numpy().astype(np.int64)
        lens = buckets["members"].list.len().to_numpy().astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        band_of = buckets["band"].to_numpy()
        verified = joined = 0
        js: dict[str, float] = {}
        snippets: dict[str, str] = {}
        clustered = np.flatnonzero(rows_of >= 0)  # rows of candidate clusters of two or more
        spill_shingle_sets(batches, cfg, pl.DataFrame({"uuid": meta["uuid"].gather(clustered),
                                                       "chunk": rows_of[clustered]}), spill)
        release_workers(batches)  # so is verification
        for chunk in np.unique(rows_of[clustered]):
            rows = np.flatnonzero(rows_of == chunk)
            wanted = meta["uuid"].gather(rows)
            sets_u, snips = read_shingle_sets(spill / f"{chunk}.parquet")
            sets = {i: sets_u.get(u, np.zeros(0, np.uint64)) for i, u in zip(rows.tolist(), wanted, strict=True)}
            rejected: set[tuple[int, int]] = set()  # a chunk's pairs: its clusters are no other chunk's
            lo, hi = np.searchsorted(bucket_chunk, [chunk, chunk + 1])
            ids = np.sort(order[lo:hi])  # band by band: a bucket whose rows an earlier band joined is skipped
            for band in np.unique(band_of[ids]):
                todo = ids[band_of[ids] == band]
                seg = np.concatenate([[0], np.cumsum(lens[todo])[:-1]]).astype(np.int64)
                pos = np.repeat(starts[todo] - seg, lens[todo]) + np.arange(int(lens[todo].sum()))
                roots = uf.roots(flat[pos])
                todo = todo[np.minimum.reduceat(roots, seg) != np.maximum.reduceat(roots, seg)]
                for b in todo:
                    m = flat[starts[b]:starts[b] + lens[b]]
                    v, j = resolve_bucket(m, [sets[i] for i in m], uf, cfg.threshold, rejected)
                    verified, joined = verified + v, joined + j
            part = survivors(meta[rows], uf.roots(rows))
            size = part.group_by("cluster").len()
            big = set(size.filter(pl.col("len") > alarms.max_cluster_size)["cluster"].to_list())
            index = dict(zip(wanted.to_list(), rows.tolist(), strict=True))
            for u, s in part.filter(pl.col("uuid") != pl.col("survivor")).select("uuid", "survivor").iter_rows():
                a, b = sets[index[u]], sets[index[s]]
                js[u] = 1.0 if len(a) == 0 else jaccard(a, b)
            for u, c in part.select("uuid", "cluster").iter_rows():
                if c in big:
                    snippets[u] = snips.get(u, "")
    m = survivors(meta[clustered], uf.roots(clustered))
    dup = m.filter(pl.col("uuid") != pl.col("survivor"))
    removed = (dup.with_columns(pl.Series("j", [js[u] for u in dup["uuid"]], dtype=pl.Float64).round(2))
               .with_columns(pl.format("near_duplicate: of {} J={}", "survivor", "j").alias("reason"))
               .select("uuid", pl.col("source").cast(pl.Utf8), "reason"))
    fired = check_alarms(removed, m, meta["source"], snippets, alarms, label)
    n_clusters = n - len(clustered) + m["cluster"].n_unique()
    stats = {"settings": cfg.settings(), "rows": n, "lsh_buckets": len(buckets),
             "candidate_clusters": len(clusters), "largest_candidate_cluster": largest,
             "verified_pairs": verified, "joining_pairs": joined, "short_text_edges": len(short),
             "clusters": n_clusters, "removed": len(removed),
             "largest_cluster": int(m.group_by("cluster").len()["len"].max() or min(n, 1)), "alarms": fired}
    if len(removed) != n - n_clusters:
        raise AssertionError(f"{label}: removed {len(removed)} != rows {n} - clusters {n_clusters}")
    return removed, stats


def cross_dedup(ref: Batches, ref_meta: pl.DataFrame, query: Batches, query_meta: pl.DataFrame,
                cfg: MinHashConfig, label: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Query texts that near-duplicate a reference text (e.g. RL prompts vs SFT prompts).

    Only reference-query pairs are compared and only query rows are removed: each
    query row with a verified edge (or, without shingles, an equal normalized-text
    md5: J = 1) gets ``near_duplicate: of <ref uuid> J=<J> (<label>)`` naming its
    most similar reference row (ties: smallest uuid). ``*_meta`` have ``uuid`` and
    ``source`` in stream order. Returns (removed, stats).
    """
    n_ref = len(ref_meta)
    meta = pl.concat([ref_meta.select("uuid", "source"), query_meta.select("uuid", "source")])
    passes = [compute_signatures(src, cfg, m["uuid"], label) for src, m in ((ref, ref_meta), (query, query_meta))]
    keys = BandKeys.concat([p[0] for p in passes])
    short_keys = pl.concat([passes[0][1], passes[1][1].with_columns(pl.col("i") + n_ref)])
    uuids = meta["uuid"].cast(pl.Utf8)
    pairs = lsh_candidates(keys, np.zeros(len(meta), dtype=np.int64))
    pairs = pairs[(pairs[:, 0] < n_ref) & (pairs[:, 1] >= n_ref)]
    wanted = uuids.gather(np.unique(pairs))
    sets = {**shingle_sets(ref, cfg, wanted)[0], **shingle_sets(query, cfg, wanted)[0]}
    exact = (short_keys.filter(pl.col("i") >= n_ref).join(short_keys.filter(pl.col("i") < n_ref), on="k", suffix="_ref")
             .select(pl.col("i_ref").alias("i"), pl.col("i").alias("j"), pl.lit(1.0).alias("jaccard"),
                     pl.lit(True).alias("edge")))
    checked = pl.concat([verify(pairs, uuids, sets, cfg.threshold), exact])
    edges = checked.filter("edge")
    hits = (pl.DataFrame({"uuid": uuids.gather(edges["j"]), "ref": uuids.gather(edges["i"]),
                          "jaccard": edges["jaccard"]}, schema={"uuid": pl.Utf8, "ref": pl.Utf8, "jaccard": pl.Float64})
            .sort("uuid", "jaccard", "ref", descending=[False, True, False]).group_by("uuid", maintain_order=True).first())
    removed = (hits.join(meta, on="uuid", how="left")
               .with_columns(pl.format("near_duplicate: of {} J={} ({})", "ref", pl.col("jaccard").round(2),
                                       pl.lit(label)).alias("reason")).select("uuid", "source", "reason"))
    return removed, {"settings": cfg.settings(), "rows": len(meta), "candidate_pairs": len(pairs),
                     "verified_edges": int(checked["edge"].sum()), "removed": len(removed)}

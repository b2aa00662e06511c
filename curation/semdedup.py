"""Semantic deduplication in the SemDeDup manner (Abbas et al. 2023, arXiv 2303.09540), on CPU.

Per table and scope group (a domain, or the whole table), rows that survived exact and near dedup are embedded
(:mod:`curation.embed`), clustered by seeded k-means (centroids fitted on a seeded sample, then every row
assigned to its nearest one, as faiss does), and compared by cosine similarity within their cluster only.
Inside a cluster, rows are visited in the near-dedup survivor order (:func:`curation.minhash.survivors`: source
priority, then longer text, then uuid); a row whose cosine to an already *kept* row is at or above
``threshold`` is removed as a duplicate of the most similar kept row, so every removal names a survivor and
the similarity to it (``semantic_duplicate: of <uuid> cos=<c>``), and a chain A≈B≈C whose ends differ keeps C.

SemDeDup instead drops a row whose cosine to *any* earlier row (kept or not) exceeds ``1 - eps``, with rows
ordered by distance to the centroid, as NeMo-Curator's GPU implementation does (docs/semdedup.md compares
the two). ``clusters: 1`` turns the clustering off: the exhaustive baseline, every pair of a group compared.
Rows whose sets of numbers differ are never duplicates (:func:`numbers_key`).

Cost: k-means assignment ``rows × k × dim``, within-cluster cosines ``Σ cluster² × dim`` in blocks of
``block_rows`` rows (memory ``block_rows × cluster``), both as float32 BLAS products; deterministic for a
given machine (seeded sample and init, fixed iteration count, ties broken by index).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from common.executor import Executor
    from curation.params import SemDedupParams

NUMBER = r"\d+(?:[.,]\d+)*"


def numbers_key(text: pl.Expr) -> pl.Expr:
    """The numbers guard: a UInt64 hash of the set of numbers (digit runs, with inner ``.``/``,``) in ``text``.
    A paraphrase keeps its problem's numbers; static embeddings barely see them ("prime factorization of 554"
    and "of 231" have cosine 0.95), so rows whose number sets differ are never semantic duplicates."""
    return text.str.extract_all(NUMBER).list.unique().list.sort().list.join(" ").fill_null("").hash(seed=0)


def kmeans(x: np.ndarray, k: int, seed: int, iterations: int = 20, sample: int = 50_000) -> np.ndarray:
    """Cluster labels (int64 ``[n]``) of the unit rows of ``x`` (float32 ``[n, dim]``) under spherical k-means
    (cosine): k-means++ init and ``iterations`` Lloyd steps on a seeded sample of at most ``sample`` rows, then
    every row assigned to its most similar centroid. ``k`` is clamped to ``[1, n]``."""
    n = len(x)
    k = max(1, min(k, n))
    if k == 1:
        return np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    fit = x[np.sort(rng.choice(n, size=min(n, sample), replace=False))]
    centroids = _plus_plus(fit, k, rng)
    for _ in range(iterations):
        labels = np.argmax(fit @ centroids.T, axis=1)
        sums = np.zeros_like(centroids)
        np.add.at(sums, labels, fit)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        centroids = np.where(norms > 0, sums / np.maximum(norms, 1e-12), centroids)
    return _assign(x, centroids)


def _plus_plus(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii 2007) with the cosine distance ``1 - cos``."""
    chosen = [int(rng.integers(len(x)))]
    dist = 1.0 - x @ x[chosen[0]]
    for _ in range(1, k):
        weights = np.clip(dist, 0.0, None).astype(np.float64)
        total = weights.sum()
        nxt = int(rng.choice(len(x), p=weights / total)) if total > 0 else int(rng.integers(len(x)))
        chosen.append(nxt)
        dist = np.minimum(dist, 1.0 - x @ x[nxt])
    return x[chosen].copy()


def _assign(x: np.ndarray, centroids: np.ndarray, block: int = 65_536) -> np.ndarray:
    return np.concatenate([np.argmax(x[i:i + block] @ centroids.T, axis=1)
                           for i in range(0, len(x), block)]).astype(np.int64)


def greedy_duplicates(x: np.ndarray, threshold: float, key: np.ndarray | None = None,
                      block_rows: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """The removals among rows ``x`` (unit float32 ``[n, dim]``, in survivor order: earlier rows win):
    ``(of, cos)``, int64 and float32 ``[n]``; ``of[i]`` is the index of the kept row that row ``i`` duplicates
    (the most similar kept row with cosine ≥ ``threshold``, the earliest on a tie), ``-1`` when row ``i`` is kept.
    ``key`` (int64 ``[n]``, optional): only rows of equal key can duplicate each other (the numbers guard).
    """
    n = len(x)
    key = np.zeros(n, dtype=np.int64) if key is None else key
    of = np.full(n, -1, dtype=np.int64)
    cos = np.zeros(n, dtype=np.float32)
    kept = np.zeros(0, dtype=np.int64)
    for start in range(0, n, block_rows):
        rows = np.arange(start, min(n, start + block_rows))
        if len(kept):
            sims = x[rows] @ x[kept].T
            sims[key[rows][:, None] != key[kept][None, :]] = -np.inf
            best = np.argmax(sims, axis=1)
            top = sims[np.arange(len(rows)), best]
            hit = top >= threshold
            of[rows[hit]], cos[rows[hit]] = kept[best[hit]], top[hit]
            rows = rows[~hit]
        inner = x[rows] @ x[rows].T
        inner[np.tril_indices(len(rows))] = -np.inf
        inner[key[rows][:, None] != key[rows][None, :]] = -np.inf  # only earlier rows of the block count
        block_kept: list[int] = []
        for i in range(len(rows)):
            if block_kept:
                col = inner[block_kept, i]
                j = int(np.argmax(col))
                if col[j] >= threshold:
                    of[rows[i]], cos[rows[i]] = rows[block_kept[j]], col[j]
                    continue
            block_kept.append(i)
        kept = np.concatenate([kept, rows[block_kept]])
    return of, cos


def semantic_duplicates(meta: pl.DataFrame, x: np.ndarray, threshold: float, rows_per_cluster: int, seed: int,
                        clusters: int | None = None, block_rows: int = 2048) -> tuple[pl.DataFrame, dict]:
    """Removals of one group: ``meta`` has ``uuid``, ``priority`` (int), ``length`` (int) per row of ``x``, and
    optionally ``key`` (UInt64, :func:`numbers_key`: rows of different keys are never duplicates).

    Returns ``(removed, stats)``: ``removed`` has ``uuid``, ``of`` (the survivor), ``cos`` and ``reason``
    (``semantic_duplicate: of <uuid> cos=<c>``, c to 3 decimals); ``stats`` the cluster count and the largest
    cluster. ``clusters`` overrides ``ceil(rows / rows_per_cluster)`` (1: exhaustive).
    """
    n = len(meta)
    k = clusters if clusters is not None else -(-n // max(1, rows_per_cluster))
    labels = kmeans(x, k, seed)
    order = (meta.with_row_index("i").with_columns(pl.Series("cluster", labels))
             .sort("cluster", "priority", pl.col("length"), "uuid", descending=[False, False, True, False]))
    uuids = meta["uuid"].to_numpy()
    parts, largest = [pl.DataFrame(schema={"uuid": pl.Utf8, "of": pl.Utf8, "cos": pl.Float32})], 0
    for _, part in order.group_by("cluster", maintain_order=True):
        idx = part["i"].to_numpy()
        largest = max(largest, len(idx))
        key = part["key"].to_numpy().view(np.int64) if "key" in part.columns else None
        of, cos = greedy_duplicates(x[idx], threshold, key, block_rows)
        gone = of >= 0
        parts.append(pl.DataFrame({"uuid": uuids[idx[gone]], "of": uuids[idx[of[gone]]], "cos": cos[gone]},
                                  schema=parts[0].schema))
    removed = pl.concat(parts)
    removed = removed.with_columns(
        pl.format("semantic_duplicate: of {} cos={}", "of", pl.col("cos").round(3)).alias("reason"))
    return removed, {"rows": n, "clusters": int(labels.max()) + 1 if n else 0, "largest_cluster": largest,
                     "removed": len(removed)}


def embed_rows(frame: pl.DataFrame, kind: str, dim: int, max_tokens: int) -> pl.DataFrame:
    """Map of the step: per row ``uuid``, ``source``, ``domain``, ``length`` (characters of its row text,
    :func:`common.text.row_text`), ``key`` (:func:`numbers_key`) and ``embedding`` (:mod:`curation.embed`)."""
    from common.text import row_text
    from curation.embed import embed_texts

    text = frame.select("uuid", "source", "domain", row_text(kind).fill_null("").alias("text"))
    meta = text.select("uuid", "source", "domain", pl.col("text").str.len_chars().cast(pl.Int64).alias("length"),
                       numbers_key(pl.col("text")).alias("key"))
    vectors = embed_texts(text["text"].to_list(), dim, max_tokens)
    return meta.with_columns(pl.Series("embedding", vectors, dtype=pl.Array(pl.Float32, dim)))


def run_semdedup(p: SemDedupParams, priority: dict[str, int], src: str | Path, out: str | Path,
                 root: str | Path = ".", executor: Executor | None = None) -> dict[str, Any]:
    """The ``semdedup`` step over ``src/{sft,rl}.parquet`` (a :class:`curation.params.SemDedupParams` ``p``):
    writes ``out/{kind}.parquet`` (the kept rows, input order; a table whose ``enabled`` is false is copied
    whole), ``metrics/semdedup.json`` and ``rejects/semdedup.parquet``. ``priority`` maps a source to its
    registry position (lower survives, as in near dedup)."""
    from common.executor import LocalExecutor, gather
    from common.io import Rejects, finish_step
    from curation.kept import by_source_and_reason, write_kept

    ex = executor or LocalExecutor()
    src, out = Path(src), Path(out)
    rejects, stats, rows_in, rows_out = Rejects("semdedup"), {}, 0, 0
    for kind in ("sft", "rl"):
        path = src / f"{kind}.parquet"
        removed = pl.DataFrame(schema={"uuid": pl.Utf8, "reason": pl.Utf8})
        table: dict = {"enabled": p.enabled.get(kind, False)}
        if table["enabled"]:
            empty = pl.DataFrame(schema={"uuid": pl.Utf8, "source": pl.Utf8, "domain": pl.Utf8, "length": pl.Int64,
                                         "key": pl.UInt64, "embedding": pl.Array(pl.Float32, p.dim)})
            rows = gather(ex, path, embed_rows, p.batch_rows, {"kind": kind, "dim": p.dim, "max_tokens": p.max_tokens},
                          empty)
            rows = rows.filter(~pl.col("source").is_in(p.exempt_sources)).with_columns(
                pl.col("source").replace_strict(priority, default=len(priority), return_dtype=pl.Int64).alias("priority"),
                (pl.col("domain") if p.scope == "within_domain" else pl.lit("all")).alias("group"))
            if not p.same_numbers:
                rows = rows.with_columns(pl.lit(0, dtype=pl.UInt64).alias("key"))
            vectors = rows["embedding"].to_numpy()
            parts, table["groups"] = [], {}
            for (group,), part in rows.with_row_index("at").group_by("group", maintain_order=True):
                found, st = semantic_duplicates(part.select("uuid", "priority", "length", "key"),
                                                vectors[part["at"].to_numpy()], p.threshold, p.rows_per_cluster,
                                                p.seed, p.clusters)
                parts.append(found.select("uuid", "reason"))
                table["groups"][group] = st
            removed = pl.concat([removed, *parts])
        before = rejects.counts()
        n_in, n_out = write_kept(path, out / f"{kind}.parquet", kind, removed, rejects, p.batch_rows)
        rows_in, rows_out = rows_in + n_in, rows_out + n_out
        stats[kind] = {**table, "rows_in": n_in, "rows_out": n_out,
                       "removed_by_source": by_source_and_reason(rejects.counts() - before)}
    return finish_step("semdedup", rows_in, rows_out, rejects, root=root, per_table=stats,
                       threshold=p.threshold, same_numbers=p.same_numbers)

"""Benchmark decontamination by hashed word n-gram overlap.

Index (built once per benchmark set, a DVC output): every word n-gram, for each
n in ``decontaminate.ngrams`` (8 and 13 by default), of two fields of every
``benchmark`` row: ``question`` (:func:`curation.text.item_text`: the item's own
text without our instruction template) and ``answer`` (``ground_truth.answer``,
else ``metadata.canonical_solution``). Questions shorter than the largest n are
also indexed by the hash of their whole token sequence (exact-match fallback);
shorter answers ("B", "42") are not, as they identify no item.

Matching: the item text of each training row (all user turns joined, or
``metadata.question``), tokenized as in :mod:`curation.ngrams` (NFKC, lowercase,
punctuation and line breaks ignored), is hashed window by window for every n and
looked up exhaustively in the index; a row whose whole token sequence equals a
short question matches too. This is the GPT-3 practice (Brown et al. 2020,
appendix C; 13-grams) with an 8-gram level as in Llama 2's contamination study.

Short n-grams such as 8 also occur in unrelated text ("1 2 3 4 5 6 7 8", "what
is the probability that exactly two of"), so per n a row must share at least a
fraction ``min_coverage`` of an item's n-grams (0: any one, the 13-gram rule).

Boilerplate guard: an n-gram shared by more than ``max_train_doc_freq`` training
rows is a formula of the training corpus ("please answer the following question
...") and does not count (counted in the stats). Removing contaminated rows
lowers those frequencies, so detection repeats on the remaining rows until a pass
finds nothing: running detection again on the output finds 0 by construction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from curation.io import write_json, write_parquet
from curation.ngrams import TOKENIZER, sequence_hashes, tokenize, window_hashes
from curation.text import item_text

CHUNK_ROWS = 2_000


def benchmark_fields(bench: pl.DataFrame) -> pl.DataFrame:
    """``benchmark_uuid``, ``benchmark`` (source), ``field`` (question | answer), ``text``: one row
    per non-empty field of each benchmark row, sorted."""
    answer = pl.coalesce(pl.col("ground_truth").str.json_path_match("$.answer"),
                         pl.col("metadata").str.json_path_match("$.canonical_solution"))
    base = bench.select(pl.col("uuid").alias("benchmark_uuid"), pl.col("source").alias("benchmark"),
                        item_text("rl").alias("question"), answer.alias("answer"))
    return (base.unpivot(["question", "answer"], index=["benchmark_uuid", "benchmark"],
                         variable_name="field", value_name="text")
            .filter(pl.col("text").str.strip_chars() != "").sort("benchmark", "benchmark_uuid", "field"))


@dataclass
class NgramIndex:
    """Hashed n-gram index of the benchmark fields.

    Attributes:
        items: :func:`benchmark_fields` frame with an ``item`` (int64) row number.
        grams: ``n`` (u8), ``h`` (u64 n-gram hash), ``item``, ``pos`` (token position, i32); sorted.
        exact: ``key`` (u64 whole-sequence hash), ``item``: questions shorter than ``max(ngrams)`` tokens.
        meta: ``ngrams``, ``tokenizer``, items per benchmark.
    """

    items: pl.DataFrame
    grams: pl.DataFrame
    exact: pl.DataFrame
    meta: dict[str, Any]


def build_index(bench: pl.DataFrame, ngrams: list[int]) -> NgramIndex:
    """Index every benchmark row of ``bench`` (RL schema) for the word n-gram lengths ``ngrams``."""
    ngrams = sorted({int(n) for n in ngrams})
    items = benchmark_fields(bench).with_row_index("item").with_columns(pl.col("item").cast(pl.Int64))
    tok = tokenize(items["text"])
    grams = []
    for n in ngrams:
        h, doc, pos = window_hashes(tok, n)
        grams.append(pl.DataFrame({"n": np.full(len(h), n, np.uint8), "h": h, "item": doc, "pos": pos.astype(np.int32)}))
    short = (tok.counts < max(ngrams)) & (tok.counts > 0) & (items["field"] == "question").to_numpy()
    exact = pl.DataFrame({"key": sequence_hashes(tok)[short], "item": np.flatnonzero(short).astype(np.int64)})
    per = items.group_by("benchmark").agg(pl.col("benchmark_uuid").n_unique()).sort("benchmark")
    meta = {"ngrams": ngrams, "tokenizer": TOKENIZER,
            "benchmark_items": dict(zip(per["benchmark"], per["benchmark_uuid"], strict=True)),
            "indexed_ngrams": {str(g["n"][0]): len(g) for g in grams if len(g)}}
    return NgramIndex(items, pl.concat(grams).unique(maintain_order=True).sort("n", "h", "item", "pos"), exact, meta)


def write_index(index: NgramIndex, root: str | Path) -> None:
    """Write the index as ``items``/``grams``/``exact`` parquet files and ``meta.json`` under ``root``."""
    root = Path(root)
    for name in ("items", "grams", "exact"):
        write_parquet(getattr(index, name), root / f"{name}.parquet")
    write_json(index.meta, root / "meta.json")


def read_index(root: str | Path, ngrams: list[int]) -> NgramIndex:
    """Read an index written by :func:`write_index`.

    Raises:
        FileNotFoundError: the index is missing (run ``cascade decontam_index``).
        ValueError: it was built with other n-gram lengths or another tokenizer.
    """
    root = Path(root)
    if not (root / "meta.json").exists():
        raise FileNotFoundError(f"missing n-gram index {root}: run `cascade decontam_index` (dvc repro)")
    meta = json.loads((root / "meta.json").read_text())
    want = {"ngrams": sorted({int(n) for n in ngrams}), "tokenizer": TOKENIZER}
    got = {k: meta.get(k) for k in want}
    if got != want:
        raise ValueError(f"n-gram index {root} was built with {got}, params ask for {want}: rebuild it")
    return NgramIndex(*(pl.read_parquet(root / f"{n}.parquet") for n in ("items", "grams", "exact")), meta)


def _train_hits(train: pl.DataFrame, kind: str, index: NgramIndex) -> tuple[pl.DataFrame, pl.DataFrame]:
    """All index hits of the training rows: n-gram hits (``row``, ``n``, ``h``) and exact
    hits (``row``, ``item``); ``row`` is the row number in ``train``."""
    by_n = {int(n): g["h"].unique().sort().to_numpy() for (n,), g in index.grams.group_by("n")}
    exact_keys = index.exact["key"].to_numpy()
    hits, exact = [], []
    for start in range(0, len(train), CHUNK_ROWS):
        chunk = train.slice(start, CHUNK_ROWS)
        tok = tokenize(chunk.select(item_text(kind).alias("t"))["t"])
        for n, keys in by_n.items():
            h, doc, _ = window_hashes(tok, n)
            found = keys[np.minimum(np.searchsorted(keys, h), len(keys) - 1)] == h
            hits.append(pl.DataFrame({"row": doc[found] + start, "n": np.full(int(found.sum()), n, np.uint8), "h": h[found]}))
        seq = sequence_hashes(tok)
        hit = np.isin(seq, exact_keys) & (tok.counts > 0)
        exact.append(pl.DataFrame({"row": np.flatnonzero(hit).astype(np.int64) + start, "key": seq[hit]}))
    empty = pl.DataFrame(schema={"row": pl.Int64, "n": pl.UInt8, "h": pl.UInt64})
    hits_f = pl.concat([empty, *[h.cast(empty.schema) for h in hits]]).unique()
    exact_f = pl.concat([pl.DataFrame(schema={"row": pl.Int64, "key": pl.UInt64}), *exact])
    return hits_f, exact_f.join(index.exact, on="key").select("row", "item")


def find_contamination(train: pl.DataFrame, kind: str, index: NgramIndex, max_train_doc_freq: int,
                       min_coverage: dict[int, float] | None = None) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Contaminated rows of ``train`` (schema ``kind``).

    A row is contaminated by a benchmark item when it shares, for some n, at least
    ``max(1, ceil(min_coverage[n] * m))`` of the item's ``m`` distinct n-grams
    (boilerplate n-grams excluded), or equals a short question exactly. ``min_coverage``
    defaults to 0 (any one n-gram, the GPT-3 rule); short n such as 8 need a
    coverage (e.g. 0.5), else generic phrases ("what is the probability that exactly
    two of") count.

    Returns (matches, stats): ``matches`` has one row per contaminated training row,
    sorted by uuid: ``uuid``, ``benchmark``, ``benchmark_uuid``, ``field``, ``how``
    (``"13-gram"`` ... or ``"exact"``), ``match`` (the first shared n-gram's tokens or
    the whole question). When a row matches several items, the longest n wins, then
    the smallest (benchmark, benchmark_uuid, field). ``stats``: ``passes``,
    ``boilerplate_ngrams_ignored`` per n (in the final pass).
    """
    cov = pl.DataFrame({"n": list((min_coverage or {}).keys()), "cov": list((min_coverage or {}).values())},
                       schema={"n": pl.UInt8, "cov": pl.Float64})
    need = (index.grams.group_by("n", "item").agg(pl.col("h").n_unique().alias("m"))
            .join(cov, on="n", how="left").with_columns(pl.col("cov").fill_null(0.0))
            .select("n", "item", pl.max_horizontal(pl.lit(1), (pl.col("cov") * pl.col("m")).ceil()).alias("need")))
    hits, exact = _train_hits(train, kind, index)
    removed = pl.Series("row", [], dtype=pl.Int64)
    found: list[pl.DataFrame] = []
    passes = 0
    while True:
        passes += 1
        live = hits.filter(~pl.col("row").is_in(removed.implode()))
        freq = live.group_by("n", "h").agg(pl.col("row").n_unique().alias("df"))
        boiler = freq.filter(pl.col("df") > max_train_doc_freq)
        shared = (live.join(boiler, on=["n", "h"], how="anti").join(index.grams, on=["n", "h"])
                  .group_by("row", "n", "item").agg(pl.len().alias("k"), pl.col("pos").min())
                  .join(need, on=["n", "item"]).filter(pl.col("k") >= pl.col("need")))
        new = shared["row"].append(exact.filter(~pl.col("row").is_in(removed.implode()))["row"]).unique()
        if new.is_empty():
            break
        removed = removed.append(new)
        found.append(shared)
    gram_hits = pl.concat([shared, *found]).with_columns(pl.format("{}-gram", "n").alias("how"))
    exact_hits = exact.filter(pl.col("row").is_in(removed.implode())).with_columns(
        pl.lit(0, pl.UInt8).alias("n"), pl.lit(0, pl.Int32).alias("pos"), pl.lit("exact").alias("how"))
    cols = ["row", "item", "n", "pos", "how"]
    best = (pl.concat([gram_hits.select(cols), exact_hits.select(cols)])
            .join(index.items.select("item", "benchmark", "benchmark_uuid", "field", "text"), on="item")
            .sort(pl.col("n"), "benchmark", "benchmark_uuid", "field", "pos",
                  descending=[True, False, False, False, False])
            .group_by("row", maintain_order=True).first())
    best = best.with_columns(pl.Series("match", _match_texts(best), dtype=pl.Utf8),
                             train["uuid"].gather(best["row"]).alias("uuid"))
    stats = {"passes": passes, "boilerplate_ngrams_ignored": {
        f"{n}-gram": int((boiler["n"] == n).sum()) for n in index.meta["ngrams"]}}
    matches = best.select("uuid", "benchmark", "benchmark_uuid", "field", "how", "match").sort("uuid")
    return matches, stats


def _match_texts(best: pl.DataFrame) -> list[str]:
    """The matched tokens of each chosen hit (the whole item text for exact hits)."""
    if best.is_empty():
        return []
    tok = tokenize(best["text"])
    return [tok.text(d, pos, n if n else int(tok.counts[d]))
            for d, (n, pos) in enumerate(zip(best["n"].to_list(), best["pos"].to_list(), strict=True))]


def decontaminate(train: pl.DataFrame, kind: str, index: NgramIndex, max_train_doc_freq: int,
                  min_coverage: dict[int, float] | None = None
                  ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """Split ``train`` into (clean, contaminated-with-reason, matches, stats).

    ``reason`` is ``contaminated: <benchmark> item <uuid> <field> <how> '<match>'``;
    ``matches`` is :func:`find_contamination`'s frame; ``stats["contaminated_by_benchmark"]``
    counts rows per benchmark (each row once, under its reported match).
    """
    matches, stats = find_contamination(train, kind, index, max_train_doc_freq, min_coverage)
    bad = matches.with_columns(pl.format("contaminated: {} item {} {} {} '{}'", "benchmark", "benchmark_uuid", "field",
                                         "how", pl.col("match").str.slice(0, 200)).alias("reason"))
    dirty = train.join(bad.select("uuid", "reason"), on="uuid", how="inner", maintain_order="left")
    clean = train.join(bad.select("uuid"), on="uuid", how="anti", maintain_order="left")
    per = matches.group_by("benchmark").len().sort("benchmark")
    stats["contaminated_by_benchmark"] = dict(zip(per["benchmark"], per["len"], strict=True))
    return clean, dirty, matches, stats

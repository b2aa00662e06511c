"""Benchmark decontamination by word n-gram overlap.

A training row is contaminated when its user content (all user turns joined,
normalized as in :mod:`curation.text`) shares a word n-gram with the text of
any ``benchmark`` item: its ``metadata.question`` when the adapter wrapped it
in an instruction template, else its user content. Words are ``\\w+`` runs of the normalized
text, so re-casing, re-punctuation and line breaks inside a question do not
hide it. Benchmark items shorter than ``n`` words fall back to an exact match
of their whole word sequence.

N-grams that occur in more than ``max_train_doc_freq`` training rows are
treated as boilerplate of the training corpus (chat formulas such as "please
answer the following question...") and do not count; how many were ignored is
reported. This follows the common n-gram decontamination practice (GPT-3
appendix C; 13-gram default) with the boilerplate guard that chat data needs.

Only the benchmark side materializes n-gram strings (for the report); the
training side is hashed: each word gets a 64-bit hash and an n-gram is the
polynomial combination ``sum_j h(w_{i+j}) * P^(n-1-j) mod 2^64`` of its words'
hashes, computed with column shifts over the exploded words, one chunk of
rows at a time so memory stays bounded.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from curation.text import normalize, user_text

_P = 1_099_511_628_211  # FNV-64 prime: odd, so the combination is a bijection per position
CHUNK_ROWS = 2_000


def benchmark_text() -> pl.Expr:
    """What a benchmark item is matched by: its own text (``metadata.question``, set by
    adapters that wrap the item in an instruction template) or else its user turns."""
    return pl.coalesce(pl.col("metadata").str.json_path_match("$.question"), user_text("rl"))


def words(text: pl.Expr) -> pl.Expr:
    """The ``\\w+`` words of the normalized ``text``, as a list."""
    return normalize(text).str.extract_all(r"\w+")


def ngram_hashes(df: pl.DataFrame, text: pl.Expr, n: int, with_text: bool = False) -> pl.DataFrame:
    """Distinct word n-grams of ``text`` per row: columns ``uuid``, ``h`` (u64) [, ``ngram`` (str)].

    Rows with fewer than ``n`` words contribute none.
    """
    words_ = (df.select("uuid", words(text).alias("w"))
             .with_columns(pl.col("w").list.len().alias("n_words"))
             .filter(pl.col("n_words") >= n)
             .explode("w")
             .with_columns(pl.int_range(pl.len()).over("uuid").alias("pos"),
                           pl.col("w").hash(seed=0).alias("wh")))
    h = pl.lit(0, dtype=pl.UInt64)
    for j in range(n):  # wrapping u64 arithmetic
        h = h + pl.col("wh").shift(-j) * pl.lit(pow(_P, n - 1 - j, 1 << 64), dtype=pl.UInt64)
    cols = [h.alias("h")]
    if with_text:
        cols.append(pl.concat_str([pl.col("w").shift(-j) for j in range(n)], separator=" ").alias("ngram"))
    # shift before filtering: the window of a kept position must see the unfiltered words
    grams = (words_.with_columns(cols).filter(pl.col("pos") + n <= pl.col("n_words"))
             .select("uuid", *[c.meta.output_name() for c in cols]))
    return grams.unique(subset=["uuid", "h"], maintain_order=True)


def short_items(df: pl.DataFrame, text: pl.Expr, n: int) -> pl.DataFrame:
    """Rows whose ``text`` has fewer than ``n`` words: ``uuid``, ``text`` (the words, space-joined)."""
    t = df.select("uuid", words(text).list.join(" ").alias("text"))
    return t.filter((pl.col("text").str.count_matches(" ") + 1 < n) & (pl.col("text") != ""))


def find_contamination(train: pl.DataFrame, kind: str, benchmarks: pl.DataFrame, n: int,
                       max_train_doc_freq: int) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Match ``train`` rows (schema ``kind``) against ``benchmarks`` (RL rows).

    Returns (matches, stats): ``matches`` has one row per contaminated training
    row: ``uuid``, ``benchmark`` (source), ``benchmark_uuid``, ``how``
    (``"13-gram"`` or ``"exact"``), ``match`` (the n-gram or the whole text).
    ``stats`` counts ignored boilerplate n-grams.
    """
    bench_grams = ngram_hashes(benchmarks, benchmark_text(), n, with_text=True).rename({"uuid": "benchmark_uuid"})
    bench_set = bench_grams["h"].unique().implode()
    train_text = user_text(kind)
    hits = pl.concat([ngram_hashes(train.slice(i, CHUNK_ROWS), train_text, n).filter(pl.col("h").is_in(bench_set))
                      for i in range(0, max(len(train), 1), CHUNK_ROWS)])
    doc_freq = hits.group_by("h").agg(pl.col("uuid").n_unique().alias("df"))
    boiler = doc_freq.filter(pl.col("df") > max_train_doc_freq)["h"]
    gram_hits = (hits.filter(~pl.col("h").is_in(boiler.implode()))
                 .join(bench_grams, on="h", how="inner")
                 .select("uuid", "benchmark_uuid", pl.lit(f"{n}-gram").alias("how"), pl.col("ngram").alias("match")))

    short = short_items(benchmarks, benchmark_text(), n).rename({"uuid": "benchmark_uuid"})
    full = train.select("uuid", words(train_text).list.join(" ").alias("text"))
    exact_hits = full.join(short, on="text", how="inner").select(
        "uuid", "benchmark_uuid", pl.lit("exact").alias("how"), pl.col("text").alias("match"))

    src = benchmarks.select(pl.col("uuid").alias("benchmark_uuid"), pl.col("source").alias("benchmark"))
    matches = (pl.concat([gram_hits, exact_hits])
               .join(src, on="benchmark_uuid", how="left")
               .sort("uuid", "benchmark", "benchmark_uuid", "match")
               .unique("uuid", keep="first", maintain_order=True))
    return matches, {"boilerplate_ngrams_ignored": boiler.len()}


def decontaminate(train: pl.DataFrame, kind: str, benchmarks: pl.DataFrame, n: int,
                  max_train_doc_freq: int) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """Split ``train`` into (clean, contaminated-with-reason, stats).

    ``stats["contaminated_by_benchmark"]`` counts contaminated training rows per
    benchmark source (a row is counted once, under the first benchmark matched).
    """
    matches, stats = find_contamination(train, kind, benchmarks, n, max_train_doc_freq)
    bad = matches.with_columns(
        pl.format("contaminated: {} item {} {} '{}'", "benchmark", "benchmark_uuid",
                  "how", pl.col("match").str.slice(0, 200)).alias("reason"))
    dirty = train.join(bad.select("uuid", "reason"), on="uuid", how="inner", maintain_order="left")
    clean = train.join(bad.select("uuid"), on="uuid", how="anti", maintain_order="left")
    per = matches.group_by("benchmark").len().sort("benchmark")
    stats["contaminated_by_benchmark"] = dict(zip(per["benchmark"], per["len"], strict=True))
    stats["contaminated_uuids"] = sorted(matches["uuid"].to_list())
    return clean, dirty, stats

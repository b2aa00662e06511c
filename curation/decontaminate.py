"""Benchmark decontamination by hashed word n-gram overlap.

Index (built once per benchmark set, a DVC output): every word n-gram, for each
n in ``decontaminate.ngrams`` (8 and 13 by default), of two fields of every
``benchmark`` row: ``question`` (:func:`common.text.item_texts`: the item's own
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

Speed: the item texts are read once into one UTF-8 buffer and tokenized in chunks of ~8 MB
(:func:`curation.ngrams.tokenize_utf8`, compiled loops, work arrays reused between chunks and
calls); every window sum of the smallest n is tested against two bit sets of the index and then
searched in its sorted keys (galloping over sorted needles); longer n-grams are hashed only where
the smallest one hit (an indexed 13-gram starts with an indexed 8-gram); the passes below run on
numpy arrays. ``benchmarks/dedup.py --only decontam`` measures it.

Boilerplate guard: an n-gram shared by more than ``max_train_doc_freq`` training
rows is a formula of the training corpus ("please answer the following question
...") and does not count (counted in the stats). Removing contaminated rows
lowers those frequencies, so detection repeats on the remaining rows until a pass
finds nothing, or stops early when no ignored n-gram falls to the bound (the next pass
would find nothing): running detection again on the output finds 0 by construction.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from common.io import write_json, write_parquet
from common.text import item_texts
from curation import ngram_kernels as kernels
from curation.ngrams import (
    TOKENIZER,
    Scratch,
    sequence_hashes,
    tokenize,
    tokenize_utf8,
    unfmix64,
    utf8_buffer,
    window_hashes,
    window_sums,
)

CHUNK_BYTES = 8 << 20  # text bytes tokenized at a time: per-chunk overheads matter below a few MB


def benchmark_fields(bench: pl.DataFrame) -> pl.DataFrame:
    """``benchmark_uuid``, ``benchmark`` (source), ``field`` (question | answer), ``text``: one row
    per non-empty field of each benchmark row, sorted."""
    answer = pl.coalesce(pl.col("ground_truth").str.json_path_match("$.answer"),
                         pl.col("metadata").str.json_path_match("$.canonical_solution"))
    base = bench.select(pl.col("uuid").alias("benchmark_uuid"), pl.col("source").alias("benchmark"),
                        item_texts(bench, "rl").alias("question"), answer.alias("answer"))
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

    @cached_property
    def lookup(self) -> _Lookup:
        """Membership structures for matching (:class:`_Lookup`), built on first use (~1 s, ~60 MB) and
        kept on this object; build it before pickling the index to workers so they receive it."""
        return _build_lookup(self)


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


@dataclass
class _Lookup:
    """Membership structures of an :class:`NgramIndex` (built once per index: ``NgramIndex.lookup``).

    Per n: ``sums[n]`` the sorted distinct unfinished window sums (:func:`curation.ngrams.unfmix64`
    of the hashes, uint64 ``[K]``; a training window's sum is looked up without finishing it),
    ``first[n]`` (int64 ``[K + 1]``) and ``item[n]``, ``pos[n]``: the index entries of key ``k`` are
    ``first[n][k]:first[n][k+1]``. ``bitmaps``: bit sets of the smallest n's sums (:data:`_BITMAPS`),
    a pre-filter: a 2^22-bit set (512 KiB, stays in a core's L2 cache) over bits 42..63 passes ~20 %
    of absent windows, a 2^26-bit set over bits 12..37 ~1.5 % of those. ``m``: int64
    ``[max(ngrams) + 1, items]``, the distinct n-grams of each item (``m[n, item]``).
    """

    ngrams: list[int]
    sums: dict[int, np.ndarray]
    first: dict[int, np.ndarray]
    item: dict[int, np.ndarray]
    pos: dict[int, np.ndarray]
    bitmaps: tuple[np.ndarray, np.ndarray]
    m: np.ndarray


_BITMAPS = ((42, 22), (12, 26))  # (shift, log2 bits) of each bit set: slot = (sum >> shift) % 2^bits


def _build_lookup(index: NgramIndex) -> _Lookup:
    ngrams = [int(n) for n in index.meta["ngrams"]]
    look = _Lookup(ngrams, {}, {}, {}, {}, (np.zeros(0, np.uint8), np.zeros(0, np.uint8)),
                   np.zeros((max(ngrams) + 1, len(index.items)), np.int64))
    distinct = index.grams.group_by("n", "item").agg(pl.col("h").n_unique().alias("m"))
    look.m[distinct["n"].to_numpy(), distinct["item"].to_numpy()] = distinct["m"].to_numpy()
    for n in ngrams:
        part = index.grams.filter(pl.col("n") == n)
        sums = unfmix64(part["h"].to_numpy())
        order = np.argsort(sums, kind="stable")
        look.sums[n], first = np.unique(sums[order], return_index=True)
        look.first[n] = np.append(first, len(sums)).astype(np.int64)
        look.item[n], look.pos[n] = part["item"].to_numpy()[order], part["pos"].to_numpy()[order]
    bitmaps = []
    for shift, size in _BITMAPS:
        slots = np.zeros(1 << size, dtype=bool)
        slots[((look.sums[ngrams[0]] >> np.uint64(shift)) & np.uint64((1 << size) - 1)).astype(np.intp)] = True
        bitmaps.append(np.packbits(slots, bitorder="little"))
    look.bitmaps = (bitmaps[0], bitmaps[1])
    return look


def _find(sorted_keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found bool, position int64) of each value in ``sorted_keys``. The values are searched in
    sorted order (numpy starts each binary search from the previous result: 2x fewer cache misses)."""
    at = np.zeros(len(values), dtype=np.int64)
    if not len(sorted_keys):
        return np.zeros(len(values), dtype=bool), at
    order = np.argsort(values)
    at[order] = np.minimum(np.searchsorted(sorted_keys, values[order]), len(sorted_keys) - 1)
    return sorted_keys[at] == values, at


def _chunk_hits(data: np.ndarray, offsets: np.ndarray, look: _Lookup, exact_keys: np.ndarray, scratch: Scratch
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Index hits of a batch of texts (:func:`curation.ngrams.tokenize_utf8`'s ``data``, ``offsets``):
    n-gram hits as (doc int64, n uint8, key int64: position in ``look.sums[n]``) arrays, and exact
    hits as (doc, key uint64): texts whose whole token sequence hashes to an exact key.

    Every indexed n-gram's first ``ngrams[0]`` tokens are an indexed n-gram too (same item, same
    position), so longer n are looked up only where the shortest one hit.
    """
    tok = tokenize_utf8(data, offsets, scratch)
    n0, ends = look.ngrams[0], tok.offsets[1:]
    doc, at = scratch.array("doc", len(tok.hashes), np.int64), scratch.array("at", len(tok.hashes), np.int64)
    sums = scratch.array("sums", len(tok.hashes), np.uint64)
    (bits0, bits1), ((shift0, size0), (shift1, size1)) = look.bitmaps, _BITMAPS
    c = kernels.window_candidates(tok.hashes, tok.offsets, n0, bits0, shift0, size0, bits1, shift1, size1, doc, at, sums)
    found, key = _find(look.sums[n0], sums[:c])
    doc, at, key = doc[:c][found], at[:c][found], key[found]
    out = [[doc], [np.full(len(at), n0, np.uint8)], [key]]
    for n in look.ngrams[1:]:
        fits = at + n <= ends[doc]
        found, key = _find(look.sums[n], window_sums(tok, n, at[fits]))
        for acc, arr in zip(out, (doc[fits][found], np.full(int(found.sum()), n, np.uint8), key[found]), strict=True):
            acc.append(arr)
    counts = tok.counts
    short = np.flatnonzero((counts > 0) & (counts < max(look.ngrams)))
    seq = sequence_hashes(tok, short)
    hit = np.isin(seq, exact_keys)
    return [np.concatenate(a) for a in out], [short[hit], seq[hit]]


def _chunks(lengths: np.ndarray, max_bytes: int) -> list[tuple[int, int]]:
    """Consecutive row ranges (start, stop) of about ``max_bytes`` text bytes (at least one row each)."""
    bounds = np.searchsorted(np.cumsum(lengths), np.arange(max_bytes, int(lengths.sum()) + max_bytes, max_bytes),
                             side="right")
    bounds = np.unique(np.concatenate([[0], bounds, [len(lengths)]]))
    stops = np.maximum(bounds[1:], bounds[:-1] + 1)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], stops, strict=True) if a < b]


_THREAD = threading.local()


def _scratch() -> Scratch:
    """This thread's tokenizing work arrays, kept between calls (a batch after the first touches no
    fresh memory); they grow to the largest chunk seen: ~100 MB resident (~200 MB reserved) at
    ``CHUNK_BYTES``."""
    if not hasattr(_THREAD, "scratch"):
        _THREAD.scratch = Scratch()
    return _THREAD.scratch


@dataclass
class _Hits:
    """Index hits of the training rows, as arrays.

    ``row``, ``nk`` (int64 ``[H]``, unique pairs): training row number and n-gram key
    ``key * 256 + n`` (``key``: position in ``_Lookup.sums[n]``). ``exact_row``, ``exact_item``
    (int64 ``[E]``): rows whose whole token sequence equals a short question.
    """

    row: np.ndarray
    nk: np.ndarray
    exact_row: np.ndarray
    exact_item: np.ndarray


def _train_hits(train: pl.DataFrame, kind: str, index: NgramIndex) -> _Hits:
    """All index hits of the rows of ``train`` (``row`` is the row number in ``train``)."""
    data, offsets = utf8_buffer(item_texts(train, kind).fill_null(""))
    exact_keys = index.exact["key"].to_numpy()
    out: list[list[np.ndarray]] = [[np.zeros(0, t)] for t in (np.int64, np.uint8, np.int64, np.int64, np.uint64)]
    scratch = _scratch()
    for start, stop in _chunks(np.diff(offsets), CHUNK_BYTES):
        (doc, n, key), (ex_doc, ex_key) = _chunk_hits(data[offsets[start]:offsets[stop]],
                                                      offsets[start:stop + 1] - offsets[start], index.lookup,
                                                      exact_keys, scratch)
        for acc, arr in zip(out, (doc + start, n, key, ex_doc + start, ex_key), strict=True):
            acc.append(arr)
    row, n, key, ex_row, ex_key = (np.concatenate(a) for a in out)
    row, nk = _unique_pairs(row, key * 256 + n)
    exact = pl.DataFrame({"row": ex_row, "key": ex_key}).join(index.exact, on="key")
    return _Hits(row, nk, exact["row"].to_numpy(), exact["item"].to_numpy())


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct pairs ``(a[i], b[i])`` of non-negative int64 arrays, sorted by ``a`` then ``b``."""
    span = int(b.max()) + 1 if len(b) else 1
    if not len(a) or int(a.max()) < (1 << 62) // span:  # one int64 code per pair: a sort of numbers
        code = np.unique(a * span + b)
        return code // span, code % span
    pairs = np.unique(np.stack([a, b], axis=1), axis=0)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _index_entries(hits: _Hits, look: _Lookup) -> dict[str, np.ndarray]:
    """Every index entry under each hit: ``row``, ``nk`` (the hit's), ``item``, ``pos`` (int64 ``[N]``)."""
    cols: dict[str, list[np.ndarray]] = {c: [np.zeros(0, np.int64)] for c in ("row", "nk", "item", "pos")}
    n_of = hits.nk & 255
    for n in look.ngrams:
        part = np.flatnonzero(n_of == n)
        first, key = look.first[n], hits.nk[part] >> 8
        count = first[key + 1] - first[key]
        src = np.repeat(first[key] - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
        for name, values in (("row", np.repeat(hits.row[part], count)), ("nk", np.repeat(hits.nk[part], count)),
                             ("item", look.item[n][src]), ("pos", look.pos[n][src])):
            cols[name].append(values.astype(np.int64))
    return {name: np.concatenate(parts) for name, parts in cols.items()}


def _boilerplate(hits: _Hits, live: np.ndarray, max_train_doc_freq: int) -> np.ndarray:
    """The n-gram keys (``nk``, sorted) of more than ``max_train_doc_freq`` live training rows."""
    keys, rows = np.unique(hits.nk[live], return_counts=True)
    return keys[rows > max_train_doc_freq]


def _shared(entries: dict[str, np.ndarray], live: np.ndarray, need: np.ndarray) -> pl.DataFrame:
    """(``row``, ``n``, ``item``, ``k``, ``pos``): live training rows sharing ``k >= need[n, item]``
    n-grams with an item (``pos``: the first shared one's position in the item), sorted."""
    row, n, item = entries["row"][live], entries["nk"][live] & 255, entries["item"][live]
    group = (row * need.shape[0] + n) * need.shape[1] + item
    order = np.argsort(group, kind="stable")
    group = group[order]
    first = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]])) if len(group) else group
    k = np.diff(np.append(first, len(group)))
    pos = np.minimum.reduceat(entries["pos"][live][order], first) if len(group) else first
    row, n, item = row[order][first], n[order][first], item[order][first]
    keep = k >= need[n, item]
    return pl.DataFrame({"row": row[keep], "n": n[keep].astype(np.uint8), "item": item[keep], "k": k[keep],
                         "pos": pos[keep].astype(np.int32)})


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
    the smallest (benchmark, benchmark_uuid, field). ``stats``: ``passes`` (detection passes run:
    one more runs only while removing rows can turn a boilerplate n-gram back into evidence),
    ``boilerplate_ngrams_ignored`` per n (in the final pass).
    """
    look = index.lookup
    cov = np.zeros(len(look.m))
    for n, c in (min_coverage or {}).items():
        if int(n) < len(cov):
            cov[int(n)] = c
    need = np.maximum(1, np.ceil(cov[:, None] * look.m)).astype(np.int64)
    hits = _train_hits(train, kind, index)
    entries = _index_entries(hits, look)
    gone = np.zeros(len(train), dtype=bool)
    found: list[pl.DataFrame] = []
    passes = 0
    while True:
        passes += 1
        boiler = _boilerplate(hits, ~gone[hits.row], max_train_doc_freq)
        live = ~gone[entries["row"]]
        if len(boiler):
            live &= ~np.isin(entries["nk"], boiler)
        shared = _shared(entries, live, need)
        new = np.union1d(shared["row"].to_numpy(), hits.exact_row[~gone[hits.exact_row]])
        if not len(new):
            break
        gone[new] = True
        found.append(shared)
        # A row left out counts the same n-grams against the same items in the next pass unless an
        # ignored (boilerplate) n-gram falls to the bound once these rows are gone: else stop here.
        live_boiler = ~gone[hits.row] & np.isin(hits.nk, boiler)
        if not len(boiler) or len(_boilerplate(hits, live_boiler, max_train_doc_freq)) == len(boiler):
            break
    gram_hits = pl.concat([shared.clear(), *found]).with_columns(pl.format("{}-gram", "n").alias("how"))
    exact_hits = pl.DataFrame({"row": hits.exact_row, "item": hits.exact_item}).with_columns(  # all gone in pass 1
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
        f"{n}-gram": int(((boiler & 255) == n).sum()) for n in index.meta["ngrams"]}}
    matches = best.select("uuid", "benchmark", "benchmark_uuid", "field", "how", "match").sort("uuid")
    return matches, stats


def _match_texts(best: pl.DataFrame) -> list[str]:
    """The matched tokens of each chosen hit (the whole item text for exact hits)."""
    if best.is_empty():
        return []
    tok = tokenize(best["text"])
    n = best["n"].cast(pl.Int64).to_numpy()
    return tok.texts(np.arange(len(best)), best["pos"].to_numpy(), np.where(n > 0, n, tok.counts))


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


def contaminated_by_benchmark(matches: pl.DataFrame) -> dict[str, int]:
    """``{benchmark: contaminated training rows}`` of the decontamination matches (sorted by name)."""
    totals = matches.group_by("benchmark").len().sort("benchmark")
    return dict(zip(totals["benchmark"], totals["len"], strict=True))


def contamination_report(matches: pl.DataFrame, meta: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """``metrics/decontamination.json``: the settings (``params.yaml`` ``decontaminate`` block ``p``)
    and, per benchmark of the index (``meta``), its item count and every contaminated training row
    with its match (one dict per row of ``matches``)."""
    return {"ngrams": meta["ngrams"], "min_coverage": p.get("min_coverage"),
            "max_train_doc_freq": int(p["max_train_doc_freq"]),
            "benchmarks": {b: {"items": n, "contaminated_rows": matches.filter(pl.col("benchmark") == b).to_dicts()}
                           for b, n in meta["benchmark_items"].items()}}

"""The hashed word n-gram index of the benchmark items, and its scan over training texts.

Index (built once per benchmark set, a DVC output: ``cascade decontam_index``): every word n-gram,
for each n in ``decontaminate.ngrams`` (8 and 13 by default), of the fields of every ``benchmark``
row (:func:`benchmark_fields`): ``question`` (:func:`common.text.item_texts`: the item's own text
without our instruction template) and ``solution`` (the reference solution: MATH and GSM8K worked
solutions, HumanEval canonical solutions). Questions shorter than the largest n are also indexed by
the hash of their whole token sequence (exact-match fallback). Texts are tokenized as in
:mod:`curation.ngrams` (NFKC, lowercase, punctuation and line breaks ignored).

Speed (:func:`scan`): the texts are read once into one UTF-8 buffer and tokenized in chunks of ~8 MB
(:func:`curation.ngrams.tokenize_utf8`, compiled loops, work arrays reused between chunks and
calls); every window sum of the smallest n is tested against two bit sets of the index and then
searched in its sorted keys (galloping over sorted needles); longer n-grams are hashed only where
the smallest one hit (an indexed 13-gram starts with an indexed 8-gram). ``benchmarks/dedup.py
--only decontam`` measures it. :mod:`curation.decontaminate` decides what the hits mean.
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
    """``benchmark_uuid``, ``benchmark`` (source), ``field`` (question | solution), ``text``: one row
    per non-empty field of each benchmark row, sorted. ``solution`` is the reference solution
    (``metadata.solution``: MATH, GSM8K; else ``metadata.canonical_solution``: HumanEval). A bare
    final answer ("42", a matrix, a polynomial) is not indexed: it identifies no item, and it
    occurs in unrelated solutions."""
    meta = pl.col("metadata")
    base = bench.select(pl.col("uuid").alias("benchmark_uuid"), pl.col("source").alias("benchmark"),
                        item_texts(bench, "rl").alias("question"),
                        pl.coalesce(meta.str.json_path_match("$.solution"),
                                    meta.str.json_path_match("$.canonical_solution")).alias("solution"))
    return (base.unpivot(["question", "solution"], index=["benchmark_uuid", "benchmark"],
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
    def lookup(self) -> Lookup:
        """Membership structures for matching (:class:`Lookup`), built on first use (~1 s, ~60 MB) and
        kept on this object; build it before pickling the index to workers so they receive it."""
        return _build_lookup(self)


def build_index(bench: pl.DataFrame, ngrams: list[int]) -> NgramIndex:
    """Index every benchmark row of ``bench`` (RL schema) for the word n-gram lengths ``ngrams``.

    Questions shorter than ``max(ngrams)`` tokens are also indexed whole (exact match); solutions
    that short (HumanEval's ``return number % 1.0``, Euclid's ``while b: a, b = b, a % b``) are not
    indexed at all: a textbook line identifies no item. Nor is an n-gram of one-character tokens
    only (``0 1 2 3 4 5 6 7 8 9 a b c``, ``x 8 x 7 x 6 ...``): enumerations and variable lists occur
    in any code or algebra.
    """
    ngrams = sorted({int(n) for n in ngrams})
    items = benchmark_fields(bench).with_row_index("item").with_columns(pl.col("item").cast(pl.Int64))
    tok = tokenize(items["text"])
    question = (items["field"] == "question").to_numpy()
    indexed = question | (tok.counts >= max(ngrams))
    singles = np.concatenate([[0], np.cumsum((tok.ends - tok.starts) == 1)])  # one-byte tokens up to each token
    grams = []
    for n in ngrams:
        h, doc, pos = window_hashes(tok, n)
        first = tok.offsets[doc] + pos
        keep = indexed[doc] & (singles[first + n] - singles[first] < n)
        grams.append(pl.DataFrame({"n": np.full(int(keep.sum()), n, np.uint8), "h": h[keep], "item": doc[keep],
                                   "pos": pos[keep].astype(np.int32)}))
    short = (tok.counts < max(ngrams)) & (tok.counts > 0) & question
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
class Lookup:
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


def _build_lookup(index: NgramIndex) -> Lookup:
    ngrams = [int(n) for n in index.meta["ngrams"]]
    look = Lookup(ngrams, {}, {}, {}, {}, (np.zeros(0, np.uint8), np.zeros(0, np.uint8)),
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


def _chunk_hits(data: np.ndarray, offsets: np.ndarray, look: Lookup, exact_keys: np.ndarray, scratch: Scratch
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


def scan(texts: pl.Series, index: NgramIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every index hit of ``texts`` (Utf8 without nulls): (``doc`` int64, ``n`` uint8, ``key`` int64:
    position in ``index.lookup.sums[n]``) per n-gram hit, and (``exact_doc``, ``exact_item``) int64
    for texts whose whole token sequence equals a short question."""
    data, offsets = utf8_buffer(texts)
    exact_keys = index.exact["key"].to_numpy()
    out: list[list[np.ndarray]] = [[np.zeros(0, t)] for t in (np.int64, np.uint8, np.int64, np.int64, np.uint64)]
    scratch = _scratch()
    for start, stop in _chunks(np.diff(offsets), CHUNK_BYTES):
        (doc, n, key), (ex_doc, ex_key) = _chunk_hits(data[offsets[start]:offsets[stop]],
                                                      offsets[start:stop + 1] - offsets[start], index.lookup,
                                                      exact_keys, scratch)
        for acc, arr in zip(out, (doc + start, n, key, ex_doc + start, ex_key), strict=True):
            acc.append(arr)
    doc, n, key, ex_doc, ex_key = (np.concatenate(a) for a in out)
    exact = pl.DataFrame({"doc": ex_doc, "key": ex_key}).join(index.exact, on="key")
    return doc, n, key, exact["doc"].to_numpy(), exact["item"].to_numpy()

"""Word tokens and hashed n-grams shared by near-dedup and decontamination.

Tokens: the text is normalized as in :mod:`curation.text` (NFKC, lowercase)
and cut into maximal runs of word characters (``\\w``: letters, digits and
``_`` of any script); every CJK ideograph or kana is a token of its own, so
unspaced Chinese or Japanese text still has n-grams. Punctuation, markup and
line breaks separate tokens and are otherwise ignored, so a question that is
re-cased, re-punctuated or split across lines has the same tokens.

Hashing is vectorized over the UTF-8 bytes of a whole batch (numpy, no
per-token Python): a token's hash is the polynomial ``sum_k (b_k + 1) * P^k mod 2^64``
of its bytes ``b_k`` (Karp-Rabin 1987, summed by prefix sums), plus its length,
finished with the MurmurHash3 64-bit finalizer; an n-gram's hash is
``fmix64(sum_j t_j * P^(n-1-j) mod 2^64)`` over its tokens' hashes. Hashes are
stable across runs, machines and library versions (they depend only on numpy
uint64 arithmetic). Pure-ASCII rows (most of the corpus) skip the Unicode
normalization, which is the identity on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl

from curation.text import normalize

TOKENIZER = "word-v1"  # recorded next to every stored hash; bump when tokens or hashes change
_P = np.uint64(1_099_511_628_211)  # FNV-64 prime: odd, so invertible mod 2^64
_CJK = r"([\p{Han}\p{Hiragana}\p{Katakana}])"

# byte classes: ASCII word bytes and every non-ASCII byte (those survive only inside
# Unicode word characters, see clean_text) are token bytes; ASCII is lowercased
_TOKEN = np.zeros(256, dtype=bool)
for _c in b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_":
    _TOKEN[_c] = True
_TOKEN[0x80:] = True
_LOWER = np.arange(256, dtype=np.uint64)
_LOWER[65:91] += 32


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (Appleby), an avalanching bijection on uint64 arrays."""
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


@lru_cache(maxsize=8)
def _powers(base: int, length: int) -> np.ndarray:
    out = np.full(length, base, dtype=np.uint64)
    out[0] = 1
    return np.cumprod(out, dtype=np.uint64)  # wraps mod 2^64


def _powers_upto(length: int) -> np.ndarray:
    """``P^0 .. P^(length-1)`` mod 2^64, uint64 (cached at power-of-two sizes)."""
    size = 1 << max(10, int(length).bit_length())
    return _powers(int(_P), size)[:length]


def clean_text(texts: pl.Series) -> pl.Series:
    """Texts whose token bytes :func:`tokenize` reads, as a Utf8 series of the same length.

    Pure-ASCII rows are returned unchanged (lowercasing happens per byte); other
    rows are normalized (NFKC, lowercase), CJK characters are spaced apart and
    every run of non-word characters becomes one space. Nulls become ``""``.
    """
    texts = texts.fill_null("").alias("t")
    frame = pl.DataFrame({"t": texts}).with_row_index("i")
    ascii_ = frame["t"].str.len_bytes() == frame["t"].str.len_chars()
    if bool(ascii_.all()):
        return texts
    other = frame.filter(~ascii_).with_columns(
        normalize(pl.col("t")).str.replace_all(_CJK, " $1 ").str.replace_all(r"\W+", " "))
    return pl.concat([frame.filter(ascii_), other]).sort("i")["t"]


def _utf8_buffer(texts: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    arr = texts.to_arrow(compat_level=pl.CompatLevel.oldest())
    if hasattr(arr, "combine_chunks"):
        arr = arr.combine_chunks()
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    return data[offsets[0]: offsets[-1]], offsets - offsets[0]


@dataclass
class Tokens:
    """Tokens of a batch of texts.

    Attributes:
        hashes: uint64 ``[T]``, one hash per token, texts one after another.
        offsets: int64 ``[D + 1]``; the tokens of text ``d`` are ``hashes[offsets[d]:offsets[d+1]]``.
        data: uint8 bytes of the cleaned texts; ``starts``/``ends`` (int64 ``[T]``) locate each token
            in it (for showing matched n-grams).
    """

    hashes: np.ndarray
    offsets: np.ndarray
    data: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """Tokens per text, int64 ``[D]``."""
        return np.diff(self.offsets)

    def text(self, doc: int, pos: int, n: int) -> str:
        """Tokens ``pos .. pos+n-1`` of text ``doc`` joined by single spaces (lowercased)."""
        first = self.offsets[doc] + pos
        return " ".join(bytes(self.data[s:e]).decode("utf-8").lower()
                        for s, e in zip(self.starts[first:first + n], self.ends[first:first + n], strict=True))


def tokenize(texts: pl.Series) -> Tokens:
    """Tokenize and hash a Utf8 series (see the module docstring); memory ~20 bytes per text byte."""
    data, offsets = _utf8_buffer(clean_text(texts))
    n_bytes = len(data)
    is_tok = _TOKEN[data]
    boundary = np.zeros(n_bytes + 1, dtype=bool)  # a token never spans two texts
    boundary[offsets] = True
    prev_tok = np.concatenate([[False], is_tok[:-1]]) & ~boundary[:-1]
    next_tok = np.concatenate([is_tok[1:], [False]]) & ~boundary[1:]
    starts = np.flatnonzero(is_tok & ~prev_tok)
    ends = np.flatnonzero(is_tok & ~next_tok) + 1
    # position of each byte inside its token: byte k of a token weighs P^k
    pos = np.arange(n_bytes, dtype=np.int64)
    token_start = np.zeros(n_bytes, dtype=np.int64)
    token_start[starts] = starts
    pos -= np.maximum.accumulate(token_start)
    prefix = np.zeros(n_bytes + 1, dtype=np.uint64)
    np.cumsum((_LOWER[data] + np.uint64(1)) * _powers_upto(int(pos.max(initial=0)) + 1)[pos], out=prefix[1:])
    hashes = fmix64(prefix[ends] - prefix[starts] + (ends - starts).astype(np.uint64))
    return Tokens(hashes, np.searchsorted(starts, offsets).astype(np.int64), data, starts, ends)


def window_hashes(tokens: Tokens, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hashes of every window of ``n`` consecutive tokens inside one text.

    Returns (hashes uint64 ``[W]``, doc int64 ``[W]``, pos int64 ``[W]``) in text order;
    texts with fewer than ``n`` tokens contribute no window. Windows are not deduplicated.
    """
    th, total = tokens.hashes, len(tokens.hashes)
    if total < n:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    acc = np.zeros(total - n + 1, dtype=np.uint64)
    pw = _powers_upto(n)
    for j in range(n):
        acc += th[j: total - n + 1 + j] * pw[n - 1 - j]
    counts = tokens.counts
    doc = np.repeat(np.arange(len(counts), dtype=np.int64), counts)[: total - n + 1]
    pos = np.arange(total - n + 1, dtype=np.int64) - tokens.offsets[doc]
    valid = pos + n <= counts[doc]
    return fmix64(acc[valid]), doc[valid], pos[valid]


def sequence_hashes(tokens: Tokens) -> np.ndarray:
    """One uint64 hash of each text's whole token sequence ``[D]`` (equal token lists, equal hash)."""
    counts = tokens.counts
    doc = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    pos = np.arange(len(tokens.hashes), dtype=np.int64) - tokens.offsets[doc]
    terms = tokens.hashes * _powers_upto(max(int(counts.max(initial=0)), 1))[pos]
    prefix = np.zeros(len(terms) + 1, dtype=np.uint64)
    np.cumsum(terms, out=prefix[1:])
    return fmix64(prefix[tokens.offsets[1:]] - prefix[tokens.offsets[:-1]] + counts.astype(np.uint64))

"""Word tokens and hashed n-grams shared by near-dedup and decontamination.

Tokens: the text is normalized as in :mod:`common.text` (NFKC, lowercase)
and cut into maximal runs of word characters (``\\w``: letters, digits and
``_`` of any script); every CJK ideograph or kana is a token of its own, so
unspaced Chinese or Japanese text still has n-grams. Punctuation, markup and
line breaks separate tokens and are otherwise ignored, so a question that is
re-cased, re-punctuated or split across lines has the same tokens.

Hashing in one compiled pass over the UTF-8 bytes of a whole batch
(:mod:`curation.ngram_kernels`, numba; no per-token Python): a token's hash is the
polynomial ``sum_k (b_k + 1) * P^k mod 2^64`` of its lowercased bytes ``b_k``
(Karp-Rabin 1987), plus its length, finished with the MurmurHash3 64-bit finalizer;
an n-gram's hash is ``fmix64(sum_j t_j * P^(n-1-j) mod 2^64)`` over its tokens'
hashes (a rolling hash along the text). Hashes are stable across runs, machines and
library versions (they depend only on uint64 arithmetic).

Normalization without normalizing every string: pure-ASCII text needs none (lowercasing
happens per byte). Each other code point is classified once per process by polars' own
NFKC, lowercase and ``\\w`` (:func:`_classify`), and the texts are then edited by compiled loops:
most characters are their own normalized form or normalize to punctuation only (nothing
to do); context-free ones (``Ё``, ``ﬁ``, fullwidth forms) are replaced by their normalized
bytes; only the short segments around characters whose normalization depends on their
neighbours (combining marks, characters that compose with the previous one, unassigned
code points; the word around a capital sigma) go through polars as strings. The tokens
are exactly those of normalizing each whole text (``tests/test_ngrams.py``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from curation import ngram_kernels as kernels

TOKENIZER = "word-v1"  # recorded next to every stored hash; bump when tokens or hashes change
_CJK = r"[\p{Han}\p{Hiragana}\p{Katakana}]"


# per code point: how it tokenizes (_SEP, _WORD, _CJK_TOKEN) as it stands (_OWN) and, for _KEEP
# characters, once normalized (_NORMED); what normalizing it takes (_FATE, 0 = not classified
# yet): nothing (_KEEP: it is its own normalized form, or that is all punctuation), its own
# normalized form (_SUBSTITUTE, bytes in _SUB), the normalization of its segment (_SEGMENT: it
# combines with its neighbours) or of its word (_WORD_CASE: capital sigma, lowercased by context)
_SEP, _WORD, _CJK_TOKEN = kernels.SEP, kernels.WORD, kernels.CJK
_KEEP, _SUBSTITUTE, _SEGMENT, _WORD_CASE = 1, 2, 3, 4
_OWN = np.zeros(0x110000, dtype=np.uint8)
_NORMED = np.zeros(0x110000, dtype=np.uint8)
_FATE = np.zeros(0x110000, dtype=np.uint8)
_SUB: dict[int, bytes] = {}
# Starters (combining class 0) that canonically compose with the character before them (the
# second half of a primary composite in UnicodeData 14: Indic length marks and vowel signs, and
# Hangul medial vowels and final consonants). Characters added later are unassigned to Python's
# unicodedata and so normalized with their segment anyway. tests/test_ngrams.py re-derives this set.
_COMPOSES_WITH_PREVIOUS = frozenset([
    0x09BE, 0x09D7, 0x0B3E, 0x0B56, 0x0B57, 0x0BBE, 0x0BD7, 0x0CC2, 0x0CD5, 0x0CD6, 0x0D3E, 0x0D57,
    0x0DCF, 0x0DDF, 0x0FB5, 0x0FB7, 0x102E, 0x1B35, 0x11127, 0x1133E, 0x11357, 0x114B0, 0x114BA,
    0x114BD, 0x115AF, 0x11930, *range(0x1161, 0x1176), *range(0x11A8, 0x11C3)])


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (Appleby), an avalanching bijection on uint64 arrays (a new array)."""
    h = h ^ (h >> np.uint64(33))
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


def unfmix64(h: np.ndarray) -> np.ndarray:
    """The inverse of :func:`fmix64` (``x ^ x >> 33`` is its own inverse; odd factors invert mod 2^64)."""
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(pow(0xC4CEB9FE1A85EC53, -1, 1 << 64))
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(pow(0xFF51AFD7ED558CCD, -1, 1 << 64))
    return h ^ (h >> np.uint64(33))


def _classify(cps: np.ndarray) -> None:
    """Fill the code point tables for the non-ASCII code points ``cps`` (unique, not yet classified)
    with polars' own NFKC, lowercase and regex classes (those of :func:`clean_text`). ``_FATE`` is
    written last: it marks a code point classified (tokenizing threads may read concurrently)."""
    chars = pl.Series([chr(c) for c in cps.tolist()])
    nfkc = chars.str.normalize("NFKC")
    normed = pl.DataFrame({"c": chars, "n": nfkc.str.to_lowercase()}).select(
        own_word=pl.col("c").str.contains(r"^\w$"), own_cjk=pl.col("c").str.contains(f"^{_CJK}$"),
        same=pl.col("n") == pl.col("c"), all_sep=pl.col("n").str.contains(r"^\W+$"), n=pl.col("n"))
    own = np.where(normed["own_word"], np.where(normed["own_cjk"], _CJK_TOKEN, _WORD), _SEP)  # CJK symbols: \W
    fate = np.zeros(len(cps), dtype=np.uint8)
    for i, (cp, full, row) in enumerate(zip(cps.tolist(), nfkc.to_list(), normed.iter_rows(named=True), strict=True)):
        if any(unicodedata.combining(ch) or ord(ch) in _COMPOSES_WITH_PREVIOUS or unicodedata.category(ch) == "Cn"
               for ch in (chr(cp), full[0])):
            fate[i] = _SEGMENT
        elif "\u03a3" in full:
            fate[i] = _WORD_CASE
        elif row["same"] or row["all_sep"]:
            fate[i], _NORMED[cp] = _KEEP, _SEP if row["all_sep"] else own[i]
        else:
            fate[i], _SUB[cp] = _SUBSTITUTE, row["n"].encode()
    _OWN[cps] = own
    _FATE[cps] = fate


def utf8_buffer(texts: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes of a Utf8 series without nulls (uint8 ``[B]``, read-only) and its text
    offsets (int64 ``[D + 1]``, from 0): text ``d`` is ``data[offsets[d]:offsets[d+1]]``."""
    arr = texts.to_arrow(compat_level=pl.CompatLevel.oldest())
    if hasattr(arr, "combine_chunks"):
        arr = arr.combine_chunks()
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    return data[offsets[0]: offsets[-1]], offsets - offsets[0]


def _chars(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Non-ASCII characters of a UTF-8 buffer: (lead byte positions int64, code points int32, byte
    lengths int32), classified."""
    lead, cp, length = kernels.utf8_chars(data)
    new = np.unique(cp[_FATE[cp] == 0])
    if len(new):
        _classify(new)
    return lead, cp, length


def clean_text(texts: pl.Series) -> pl.Series:
    """The texts normalized (NFKC, then lowercase) as :func:`tokenize` reads them, a Utf8 series of
    the same length; pure-ASCII rows are returned unchanged (lowercasing happens per byte). Nulls
    become ``""``. Word boundaries are not marked: :func:`tokenize` finds them."""
    texts = texts.fill_null("")
    other = np.flatnonzero((texts.str.len_bytes() != texts.str.len_chars()).to_numpy())
    if not len(other):
        return texts
    return texts.scatter(other, texts.gather(other).str.normalize("NFKC").str.to_lowercase())


def _segments(data: np.ndarray, offsets: np.ndarray, lead: np.ndarray, length: np.ndarray, fate: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted disjoint byte ranges ``[a, b)`` whose normalization must be computed as a whole.

    Around a run of ``_SEGMENT`` characters: from the character before it (ASCII and ``_KEEP``/
    ``_SUBSTITUTE`` characters start a normalization segment, UAX #15 section 9) to the next
    character. Around a ``_WORD_CASE`` character: the text between ASCII whitespace (which ends the
    final-sigma context of Unicode's lowercasing, section 3.13). Never across two texts.
    """
    idx = np.flatnonzero(fate == _SEGMENT)  # rare: only these characters and their neighbours are read
    prev = np.maximum(idx - 1, 0)
    row = np.searchsorted(offsets, lead[idx], side="right") - 1
    after = ((idx > 0) & (lead[prev] + length[prev] == lead[idx])  # directly after the previous character
             & (np.searchsorted(offsets, lead[prev], side="right") - 1 == row))
    first = ~(after & (fate[prev] == _SEGMENT))
    last = ~np.append(after[1:] & (idx[1:] == idx[:-1] + 1), False)[:len(idx)]
    seg_a = [np.where(after[first], lead[prev[first]], np.maximum(lead[idx[first]] - 1, offsets[row[first]]))]
    seg_b = [lead[idx[last]] + length[idx[last]]]
    cased = np.flatnonzero(fate == _WORD_CASE)
    if len(cased):
        rows = np.searchsorted(offsets, lead[cased], side="right") - 1
        for p, lo, hi in zip(lead[cased].tolist(), offsets[rows].tolist(), offsets[rows + 1].tolist(), strict=True):
            raw = data[lo:hi].tobytes()
            seg_a.append(np.array([lo + (max(raw.rfind(c, 0, p - lo) + 1 for c in b" \t\n\r") or 0)]))
            seg_b.append(np.array([lo + min((i for i in (raw.find(c, p - lo) for c in b" \t\n\r") if i >= 0),
                                            default=hi - lo)]))
    seg_a, seg_b = np.concatenate(seg_a), np.concatenate(seg_b)
    if not len(seg_a):
        return seg_a, seg_b
    order = np.argsort(seg_a, kind="stable")
    seg_a, reach = seg_a[order], np.maximum.accumulate(seg_b[order])
    first = np.flatnonzero(np.concatenate([[True], seg_a[1:] >= reach[:-1]]))  # overlapping ranges merge
    return seg_a[first], reach[np.append(first[1:] - 1, len(seg_a) - 1)]


def _normalize(data: np.ndarray, offsets: np.ndarray, lead: np.ndarray, cp: np.ndarray, length: np.ndarray,
               kind: np.ndarray, alloc: Callable[[str, int, type], np.ndarray]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NFKC + lowercase of a UTF-8 buffer of texts: :func:`_segments` through polars
    (:func:`clean_text`), ``_SUBSTITUTE`` characters elsewhere by their table bytes.

    ``kind``: the token class of each non-ASCII character (uint8, ``_NORMED``). Returns (data,
    offsets, kind) of the normalized texts; the rewritten characters take their own class
    (``_OWN``: they are normalized). The new data is an ``alloc("data", ...)`` array.
    """
    fate = _FATE[cp]
    seg_a, seg_b = _segments(data, offsets, lead, length, fate)
    view = memoryview(data)
    normed = clean_text(pl.Series([str(view[a:b], "utf-8") for a, b in zip(seg_a.tolist(), seg_b.tolist(), strict=True)],
                                  dtype=pl.Utf8))
    seg_data, seg_off = utf8_buffer(normed)
    sub = np.flatnonzero(fate == _SUBSTITUTE)
    at = np.searchsorted(seg_a, lead[sub], side="right") - 1
    if len(seg_a):
        sub = sub[~((at >= 0) & (lead[sub] < seg_b[np.maximum(at, 0)]))]  # not inside a segment
    uniq, inv = np.unique(cp[sub], return_inverse=True)
    table = [_SUB[c] for c in uniq.tolist()]
    sub_len = np.array([len(t) for t in table], dtype=np.int64)
    pool = np.concatenate([seg_data, np.frombuffer(b"".join(table), np.uint8)])
    starts = np.concatenate([seg_a, lead[sub]])
    ends = np.concatenate([seg_b, lead[sub] + length[sub]])
    src = np.concatenate([seg_off[:-1], len(seg_data) + (np.cumsum(sub_len) - sub_len)[inv]])
    size = np.concatenate([np.diff(seg_off), sub_len[inv]])
    order = np.argsort(starts)
    starts, ends, src, size = starts[order], ends[order], src[order], size[order]
    shift = np.concatenate([[0], np.cumsum(size - (ends - starts))])
    new_data = alloc("data", len(data) + int(shift[-1]), np.uint8)
    kernels.splice(data, starts, ends, pool, src, size, new_data)
    pool_lead, pool_cp, _ = _chars(pool)
    kind = kernels.spliced_kinds(lead, kind, starts, ends, pool_lead, _OWN[pool_cp], src, size)
    return new_data, offsets + shift[np.searchsorted(ends, offsets, side="right")], kind


@dataclass
class Tokens:
    """Tokens of a batch of texts.

    Attributes:
        hashes: uint64 ``[T]``, one hash per token, texts one after another.
        offsets: int64 ``[D + 1]``; the tokens of text ``d`` are ``hashes[offsets[d]:offsets[d+1]]``.
        data: uint8 bytes of the texts (normalized where needed); ``starts``/``ends`` (int64 ``[T]``)
            locate each token in it (for showing matched n-grams).
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

    def texts(self, docs: np.ndarray, pos: np.ndarray, n: np.ndarray) -> list[str]:
        """For each ``i``: tokens ``pos[i] .. pos[i]+n[i]-1`` of text ``docs[i]`` joined by single
        spaces (ASCII lowercased; the rest is lowercase already once normalized); int arrays ``[K]``."""
        n = np.asarray(n, dtype=np.int64)
        first = self.offsets[np.asarray(docs, dtype=np.int64)] + np.asarray(pos, dtype=np.int64)
        idx = np.repeat(first - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
        raw, starts, ends = self.data.tobytes(), self.starts[idx].tolist(), self.ends[idx].tolist()
        out, k = [], 0
        for m in n.tolist():
            out.append(b" ".join([raw[starts[j]:ends[j]] for j in range(k, k + m)]).lower().decode("utf-8"))
            k += m
        return out


class Scratch:
    """Work arrays reused by successive :func:`tokenize` calls of one thread.

    Fresh memory costs a page fault per 4 KiB page on first touch (1-12 us on this project's VMs,
    more than tokenizing the bytes it holds), and the allocator returns large freed arrays to the
    OS, so a loop over chunks that allocates anew pays it every chunk. Arrays handed out by :meth:`array`
    (and a :class:`Tokens` made with a scratch) are views, valid until the next use of the scratch.
    """

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def array(self, name: str, size: int, dtype: type) -> np.ndarray:
        """A ``size``-element view of the work array ``name`` (grown by 1.5x when too small; not zeroed)."""
        have = self._arrays.get(name)
        if have is None or len(have) < size or have.dtype != dtype:
            have = self._arrays[name] = np.empty(max(size, 3 * len(have) // 2 if have is not None else 0), dtype)
        return have[:size]


def _fresh(name: str, size: int, dtype: type) -> np.ndarray:
    return np.empty(size, dtype)


def tokenize(texts: pl.Series, scratch: Scratch | None = None) -> Tokens:
    """Tokenize and hash a Utf8 series (see the module docstring); memory ~14 bytes per text byte
    at the peak (token arrays sized for the worst case, then trimmed). With a ``scratch`` the token
    arrays are views into it instead (no trimming copy; valid until the scratch's next use)."""
    return tokenize_utf8(*utf8_buffer(texts.fill_null("")), scratch)


def tokenize_utf8(data: np.ndarray, offsets: np.ndarray, scratch: Scratch | None = None) -> Tokens:
    """:func:`tokenize` of the texts of a :func:`utf8_buffer` (or of a slice of one: ``data``
    from a text's start, ``offsets`` rebased to 0), e.g. chunk by chunk without copying."""
    alloc = scratch.array if scratch is not None else _fresh
    lead, cp, length = _chars(data)
    kind = _NORMED[cp]
    if len(lead) and bool((_FATE[cp] != _KEEP).any()):
        data, offsets, kind = _normalize(data, offsets, lead, cp, length, kind, alloc)
    bound = min(len(data), len(data) // 2 + len(offsets) + len(kind))  # separators between ASCII words
    starts, ends = alloc("starts", bound, np.int64), alloc("ends", bound, np.int64)
    hashes = alloc("hashes", bound, np.uint64)
    token_offsets = np.empty(len(offsets), np.int64)
    t = kernels.scan_tokens(data, offsets, kind, starts, ends, hashes, token_offsets)
    starts, ends, hashes = starts[:t], ends[:t], hashes[:t]
    if scratch is None:
        starts, ends, hashes = starts.copy(), ends.copy(), hashes.copy()
    return Tokens(hashes, token_offsets, data, starts, ends)


def window_sums(tokens: Tokens, n: int, at: np.ndarray) -> np.ndarray:
    """Unfinished n-gram hashes ``sum_j t_j * P^(n-1-j)`` (uint64 ``[len(at)]``) of the windows of
    ``n`` tokens starting at the global token positions ``at`` (int64, each ``<= T - n``);
    :func:`fmix64` of one is the n-gram's hash."""
    out = np.empty(len(at), np.uint64)
    kernels.sums_at(tokens.hashes, np.ascontiguousarray(at, dtype=np.int64), n, out)
    return out


def window_hashes(tokens: Tokens, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hashes of every window of ``n`` consecutive tokens inside one text.

    Returns (hashes uint64 ``[W]``, doc int64 ``[W]``, pos int64 ``[W]``) in text order;
    texts with fewer than ``n`` tokens contribute no window. Windows are not deduplicated.
    """
    total = int(np.maximum(tokens.counts - (n - 1), 0).sum())
    doc, at, sums = np.empty(total, np.int64), np.empty(total, np.int64), np.empty(total, np.uint64)
    kernels.all_window_sums(tokens.hashes, tokens.offsets, n, doc, at, sums)
    return fmix64(sums), doc, at - tokens.offsets[doc]


def sequence_hashes(tokens: Tokens, docs: np.ndarray | None = None) -> np.ndarray:
    """One uint64 hash ``fmix64(sum_j t_j * P^j + count)`` of the whole token sequence of each text
    ``[D]`` (of the texts ``docs``, int64, when given): equal token lists, equal hash."""
    first = tokens.offsets[:-1] if docs is None else tokens.offsets[docs]
    counts = tokens.counts if docs is None else tokens.counts[docs]
    out = np.empty(len(first), np.uint64)
    kernels.sequence_hashes(tokens.hashes, np.ascontiguousarray(first), np.ascontiguousarray(counts), out)
    return out

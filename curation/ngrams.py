"""Word tokens and hashed n-grams shared by near-dedup and decontamination.

Tokens: the text is normalized as in :mod:`curation.text` (NFKC, lowercase)
and cut into maximal runs of word characters (``\\w``: letters, digits and
``_`` of any script); every CJK ideograph or kana is a token of its own, so
unspaced Chinese or Japanese text still has n-grams. Punctuation, markup and
line breaks separate tokens and are otherwise ignored, so a question that is
re-cased, re-punctuated or split across lines has the same tokens.

Hashing is vectorized over the UTF-8 bytes of a whole batch (numpy, no
per-token Python): a token's hash is the polynomial ``sum_k (b_k + 1) * P^k mod 2^64``
of its bytes ``b_k`` (Karp-Rabin 1987), plus its length, finished with the
MurmurHash3 64-bit finalizer; an n-gram's hash is ``fmix64(sum_j t_j * P^(n-1-j) mod 2^64)``
over its tokens' hashes. Both sums are read off one prefix sum over the batch:
with ``S_i = sum_{k<i} x_k P^k``, ``sum_{k=s}^{e-1} x_k P^(k-s) = (S_e - S_s) * P^-s``
(``P`` is odd, hence invertible mod 2^64). Hashes are stable across runs, machines
and library versions (they depend only on numpy uint64 arithmetic).

Normalization without normalizing every string: pure-ASCII text needs none (lowercasing
happens per byte). Each other code point is classified once per process by polars' own
NFKC, lowercase and ``\\w`` (:func:`_classify`), and the texts are then edited in numpy:
most characters are their own normalized form or normalize to punctuation only (nothing
to do); context-free ones (``Ё``, ``ﬁ``, fullwidth forms) are replaced by their normalized
bytes; only the short segments around characters whose normalization depends on their
neighbours (combining marks, characters that compose with the previous one, unassigned
code points; the word around a capital sigma) go through polars as strings. The tokens
are exactly those of normalizing each whole text (``tests/test_ngrams.py``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field

import numpy as np
import polars as pl

TOKENIZER = "word-v1"  # recorded next to every stored hash; bump when tokens or hashes change
_P = 1_099_511_628_211  # FNV-64 prime: odd, so invertible mod 2^64
_CJK = r"[\p{Han}\p{Hiragana}\p{Katakana}]"
_CACHED_POWERS = 1 << 22  # power tables up to this length stay cached (2 x 32 MiB)

# the token hash reads each byte lowercased (ASCII), plus one
_LOWER1 = np.arange(1, 257, dtype=np.uint64)
_LOWER1[65:91] += 32

# per code point: how it tokenizes (_SEP, _WORD, _CJK_TOKEN) as it stands (_OWN) and, for _KEEP
# characters, once normalized (_NORMED); what normalizing it takes (_FATE, 0 = not classified
# yet): nothing (_KEEP: it is its own normalized form, or that is all punctuation), its own
# normalized form (_SUBSTITUTE, bytes in _SUB), the normalization of its segment (_SEGMENT: it
# combines with its neighbours) or of its word (_WORD_CASE: capital sigma, lowercased by context)
_SEP, _WORD, _CJK_TOKEN = 1, 2, 3
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


_POWERS: dict[bool, np.ndarray] = {}


def _powers(length: int, inverse: bool = False) -> np.ndarray:
    """``P^0 .. P^(length-1)`` (or of ``P^-1``) mod 2^64, uint64; tables up to ``_CACHED_POWERS`` are cached."""
    table = _POWERS.get(inverse)
    if table is None or len(table) < length:
        size = max(1 << 16, 1 << int(length - 1).bit_length())
        table = np.full(size, pow(_P, -1, 1 << 64) if inverse else _P, dtype=np.uint64)
        table[0] = 1
        np.cumprod(table, out=table)  # wraps mod 2^64
        if size <= _CACHED_POWERS:
            _POWERS[inverse] = table
    return table[:length]


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


def _utf8_buffer(texts: pl.Series) -> tuple[np.ndarray, np.ndarray]:
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
    lead = np.flatnonzero(data >= 0xC0)
    if not len(lead):
        return lead, lead.astype(np.int32), lead.astype(np.int32)
    b0 = data.take(lead).astype(np.int32)
    length = (2 + (b0 >= 0xE0) + (b0 >= 0xF0)).astype(np.int32)
    cp = b0 & np.where(length == 2, 0x1F, np.where(length == 3, 0x0F, 0x07))
    last = len(data) - 1
    for k in (1, 2, 3):
        cont = data.take(np.minimum(lead + k, last)).astype(np.int32) & 0x3F
        cp = np.where(length > k, (cp << 6) | cont, cp)
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
    row = np.searchsorted(offsets, lead, side="right") - 1
    ctx = np.concatenate([fate == _SEGMENT, [False]])
    after = np.concatenate([[False], (lead[:-1] + length[:-1] == lead[1:]) & (row[:-1] == row[1:]), [False]])
    first = np.flatnonzero(ctx[:-1] & ~(after[:-1] & ctx[np.arange(-1, len(lead) - 1)]))
    last = np.flatnonzero(ctx[:-1] & ~(after[1:] & ctx[1:]))
    seg_a = [np.where(after[first], lead[first - 1], np.maximum(lead[first] - 1, offsets[row[first]]))]
    seg_b = [lead[last] + length[last]]
    cased = np.flatnonzero(fate == _WORD_CASE)
    if len(cased):
        raw = data.tobytes()
        for p, lo, hi in zip(lead[cased].tolist(), offsets[row[cased]].tolist(), offsets[row[cased] + 1].tolist(),
                             strict=True):
            seg_a.append(np.array([max(raw.rfind(c, lo, p) + 1 for c in b" \t\n\r") or lo]))
            seg_b.append(np.array([min((i for i in (raw.find(c, p, hi) for c in b" \t\n\r") if i >= 0), default=hi)]))
    seg_a, seg_b = np.concatenate(seg_a), np.concatenate(seg_b)
    if not len(seg_a):
        return seg_a, seg_b
    order = np.argsort(seg_a, kind="stable")
    seg_a, reach = seg_a[order], np.maximum.accumulate(seg_b[order])
    first = np.flatnonzero(np.concatenate([[True], seg_a[1:] >= reach[:-1]]))  # overlapping ranges merge
    return seg_a[first], reach[np.append(first[1:] - 1, len(seg_a) - 1)]


def _normalize(data: np.ndarray, offsets: np.ndarray, lead: np.ndarray, cp: np.ndarray, length: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """NFKC + lowercase of a UTF-8 buffer of texts: :func:`_segments` through polars
    (:func:`clean_text`), ``_SUBSTITUTE`` characters elsewhere by their table bytes.

    Returns (data, offsets, (starts, ends) of the rewritten byte ranges in the new data).
    """
    fate = _FATE[cp]
    seg_a, seg_b = _segments(data, offsets, lead, length, fate)
    view = memoryview(data)
    normed = clean_text(pl.Series([str(view[a:b], "utf-8") for a, b in zip(seg_a.tolist(), seg_b.tolist(), strict=True)],
                                  dtype=pl.Utf8))
    seg_data, seg_off = _utf8_buffer(normed)
    at = np.searchsorted(seg_a, lead, side="right") - 1
    inside = (at >= 0) & (lead < seg_b[np.maximum(at, 0)]) if len(seg_a) else np.zeros(len(lead), dtype=bool)
    sub = np.flatnonzero((fate == _SUBSTITUTE) & ~inside)
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
    parts, prev = [], 0
    for a, b, s, n in zip(starts.tolist(), ends.tolist(), src.tolist(), size.tolist(), strict=True):
        parts += [data[prev:a], pool[s:s + n]]
        prev = b
    parts.append(data[prev:])
    shift = np.concatenate([[0], np.cumsum(size - (ends - starts))])
    new_starts = starts + shift[:-1]
    new_offsets = offsets + shift[np.searchsorted(ends, offsets, side="right")]
    return np.concatenate(parts), new_offsets, (new_starts, new_starts + size)


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
    _prefix: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def counts(self) -> np.ndarray:
        """Tokens per text, int64 ``[D]``."""
        return np.diff(self.offsets)

    def text(self, doc: int, pos: int, n: int) -> str:
        """Tokens ``pos .. pos+n-1`` of text ``doc`` joined by single spaces (lowercased)."""
        first = self.offsets[doc] + pos
        starts, ends = self.starts[first:first + n].tolist(), self.ends[first:first + n].tolist()
        if not starts:
            return ""
        raw = self.data[starts[0]:ends[-1]].tobytes()
        return " ".join(raw[s - starts[0]:e - starts[0]].decode("utf-8").lower() for s, e in zip(starts, ends, strict=True))

    def prefix(self) -> np.ndarray:
        """``C[i] = sum_{k<i} hashes[k] * P^-k`` mod 2^64, uint64 ``[T + 1]`` (cached)."""
        if self._prefix is None:
            self._prefix = np.zeros(len(self.hashes) + 1, dtype=np.uint64)
            np.cumsum(self.hashes * _powers(len(self.hashes), inverse=True), out=self._prefix[1:])
        return self._prefix


def tokenize(texts: pl.Series) -> Tokens:
    """Tokenize and hash a Utf8 series (see the module docstring); memory ~30 bytes per text byte
    (plus power tables cached up to 4 Mi entries, 64 MiB)."""
    data, offsets = _utf8_buffer(texts.fill_null(""))
    lead, cp, length = _chars(data)
    if len(lead):
        kind = _NORMED[cp]
        if bool((_FATE[cp] != _KEEP).any()):
            data, offsets, (new_a, new_b) = _normalize(data, offsets, lead, cp, length)
            lead, cp, length = _chars(data)
            at = np.searchsorted(new_a, lead, side="right") - 1
            rewritten = (at >= 0) & (lead < new_b[np.maximum(at, 0)])
            kind = np.where(rewritten, _OWN[cp], _NORMED[cp])
    run = _token_bytes(data).view(np.int8)  # run class per byte: 0 separator, 1 word, 2/3 CJK
    classes = 1
    if len(lead):
        for k in range(4):
            more = length > k
            run[lead[more & (kind == _SEP)] + k] = 0
            cjk = np.flatnonzero(more & (kind == _CJK_TOKEN))
            run[lead[cjk] + k] = 2 + (cjk & 1)  # consecutive CJK characters alternate 2, 3
        classes = 3 if bool((kind == _CJK_TOKEN).any()) else 1
    starts, ends = _runs(run, offsets, classes)
    prefix = np.empty(len(data) + 1, dtype=np.uint64)  # S_i = sum_{k<i} (lower(b_k) + 1) P^k
    prefix[0] = 0
    upper = ((data - np.uint8(65)) < np.uint8(26)).view(np.uint8)
    np.add(data | (upper << np.uint8(5)), np.uint64(1), out=prefix[1:])
    prefix[1:] *= _powers(len(data))
    np.cumsum(prefix[1:], out=prefix[1:])
    poly = prefix.take(ends) - prefix.take(starts)
    poly *= _powers(len(data), inverse=True).take(starts)
    poly += (ends - starts).astype(np.uint64)
    return Tokens(fmix64(poly), np.searchsorted(starts, offsets).astype(np.int64), data, starts, ends)


def _token_bytes(data: np.ndarray) -> np.ndarray:
    """bool ``[B]``: ASCII letters, digits and ``_``, and every non-ASCII byte."""
    folded = data | np.uint8(0x20)
    return (((folded - np.uint8(97)) < np.uint8(26)) | ((data - np.uint8(48)) < np.uint8(10))
            | (data == np.uint8(95)) | (data >= np.uint8(0x80)))


def _runs(run: np.ndarray, offsets: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) int64 of the tokens: maximal runs of equal non-zero class in ``run`` (int8
    ``[B]``, ``classes`` distinct non-zero values), also cut at the text boundaries ``offsets``."""
    if not len(run):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    edges = np.flatnonzero(run[1:] != run[:-1]) + 1  # alternately a start and an end ...
    edges = np.concatenate([[0] if run[0] else [], edges, [len(run)] if run[-1] else []]).astype(np.int64)
    at, values = [], []
    cut = offsets[1:-1]
    cut = cut[(cut > 0) & (cut < len(run))]
    before = run.take(cut - 1)
    cut = np.unique(cut[(before != 0) & (before == run.take(cut))])  # a text boundary inside a run
    if len(cut):
        at.append(np.repeat(np.searchsorted(edges, cut), 2))
        values.append(np.repeat(cut, 2))
    if classes > 1:  # ... or both, between two classes
        inner = edges[(edges > 0) & (edges < len(run))]
        both = np.flatnonzero((run.take(inner - 1) != 0) & (run.take(inner) != 0))
        at.append(np.searchsorted(edges, inner[both]))
        values.append(inner[both])
    if at:
        edges = np.insert(edges, np.concatenate(at), np.concatenate(values))
    return edges[0::2], edges[1::2]


def window_sums(tokens: Tokens, n: int, at: np.ndarray | None = None) -> np.ndarray:
    """Unfinished n-gram hashes ``sum_j t_j * P^(n-1-j)`` (uint64) of the windows of ``n`` tokens
    starting at the global token positions ``at`` (int64; default every position ``0 .. T-n``),
    crossing text boundaries or not; :func:`fmix64` of one is the n-gram's hash."""
    prefix = tokens.prefix()
    if at is None:
        total = len(tokens.hashes)
        if total < n:
            return np.zeros(0, np.uint64)
        return (prefix[n:] - prefix[:total - n + 1]) * _powers(total)[n - 1:]
    return (prefix[at + n] - prefix[at]) * _powers(len(tokens.hashes))[at + n - 1]


def window_hashes(tokens: Tokens, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hashes of every window of ``n`` consecutive tokens inside one text.

    Returns (hashes uint64 ``[W]``, doc int64 ``[W]``, pos int64 ``[W]``) in text order;
    texts with fewer than ``n`` tokens contribute no window. Windows are not deduplicated.
    """
    sums = window_sums(tokens, n)
    if not len(sums):
        return sums, np.zeros(0, np.int64), np.zeros(0, np.int64)
    counts = tokens.counts
    doc = np.repeat(np.arange(len(counts), dtype=np.int64), counts)[: len(sums)]
    pos = np.arange(len(sums), dtype=np.int64) - tokens.offsets[doc]
    valid = pos + n <= counts[doc]
    return fmix64(sums[valid]), doc[valid], pos[valid]


def sequence_hashes(tokens: Tokens, docs: np.ndarray | None = None) -> np.ndarray:
    """One uint64 hash of the whole token sequence of each text ``[D]`` (of the texts ``docs``,
    int64, when given): equal token lists, equal hash."""
    counts = tokens.counts if docs is None else tokens.counts[docs]
    first = tokens.offsets[:-1] if docs is None else tokens.offsets[docs]
    doc = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    pos = np.arange(len(doc), dtype=np.int64) - (np.cumsum(counts) - counts)[doc]
    terms = tokens.hashes[first[doc] + pos] * _powers(max(int(counts.max(initial=0)), 1))[pos]
    prefix = np.zeros(len(terms) + 1, dtype=np.uint64)
    np.cumsum(terms, out=prefix[1:])
    ends = np.cumsum(counts)
    return fmix64(prefix[ends] - prefix[ends - counts] + counts.astype(np.uint64))

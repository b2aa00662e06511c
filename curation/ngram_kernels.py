"""Compiled byte and token loops of :mod:`curation.ngrams` (numba, ``nogil``: threads run them in parallel).

Each loop makes one pass over its input where the numpy formulation needed a dozen
(byte classes, run edges, prefix sums, power tables). The arithmetic is the one
:mod:`curation.ngrams` documents, in uint64 (wrapping mod 2^64), so the hashes equal
those of the plain-Python definitions in ``tests/test_ngrams.py``. Compiled code is
cached next to this file (``cache=True``; else in numba's user-wide cache): the first
use in a fresh environment compiles every kernel (~10 s on 2 cores), later processes load
them (~0.5 s).
"""

from __future__ import annotations

import numba as nb
import numpy as np

P = np.uint64(1_099_511_628_211)  # FNV-64 prime: odd, so invertible mod 2^64
SEP, WORD, CJK = 1, 2, 3  # token classes of a character
_ASCII_WORD = np.zeros(128, dtype=np.bool_)  # \w among ASCII: letters, digits, _
for _c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_":
    _ASCII_WORD[_c] = True
_LOWER1 = np.arange(1, 257, dtype=np.uint64)  # a byte's term: lowercased (ASCII), plus one
_LOWER1[65:91] += 32


@nb.njit(nogil=True, cache=True, inline="always")
def fmix(h: np.uint64) -> np.uint64:
    """MurmurHash3's 64-bit finalizer (Appleby) of one uint64."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


@nb.njit(nogil=True, cache=True)
def scan_tokens(data, offsets, kind, starts, ends, hashes, token_offsets):  # pragma: no cover - compiled
    """Cut UTF-8 texts into tokens and hash them; returns the token count ``T``.

    Args:
        data: uint8 ``[B]``, the texts' bytes (valid UTF-8), text ``d`` at ``offsets[d]:offsets[d+1]``.
        offsets: int64 ``[D + 1]``.
        kind: uint8, the class (``SEP``, ``WORD``, ``CJK``) of each non-ASCII character in order.
        starts, ends, hashes: int64, int64, uint64 outputs of at least ``T`` entries.
        token_offsets: int64 output ``[D + 1]``: the tokens of text ``d`` are ``token_offsets[d]:token_offsets[d+1]``.

    A token is a maximal run of word characters (ASCII letters, digits, ``_`` and ``WORD``
    characters) inside one text, or one ``CJK`` character. Its hash is
    ``fmix(sum_k (lower(b_k) + 1) * P^k + len)`` over its bytes ``b_k``.
    """
    t = 0
    j = 0
    for d in range(len(offsets) - 1):
        token_offsets[d] = t
        i, end = offsets[d], offsets[d + 1]
        while i < end:
            b = data[i]
            if b < 128:
                if not _ASCII_WORD[b]:
                    i += 1
                    continue
                step = 1
            else:
                step = 2 if b < 0xE0 else (3 if b < 0xF0 else 4)
                c = kind[j]
                j += 1
                if c != WORD:
                    if c == CJK:
                        starts[t], ends[t], hashes[t] = i, i + step, _bytes_hash(data, i, i + step)
                        t += 1
                    i += step
                    continue
            start = i  # a word token: its first character is `step` bytes at i
            h = np.uint64(0)
            pw = np.uint64(1)
            while True:
                if step == 1:  # a run of ASCII word bytes, in a tight loop
                    h += _LOWER1[b] * pw
                    pw *= P
                    i += 1
                    while i < end:
                        b = data[i]
                        if b >= 128 or not _ASCII_WORD[b]:
                            break
                        h += _LOWER1[b] * pw
                        pw *= P
                        i += 1
                else:
                    for k in range(i, i + step):
                        h += _LOWER1[data[k]] * pw
                        pw *= P
                    i += step
                if i >= end:
                    break
                b = data[i]
                if b < 128:
                    if not _ASCII_WORD[b]:
                        break
                    step = 1
                elif kind[j] == WORD:
                    j += 1
                    step = 2 if b < 0xE0 else (3 if b < 0xF0 else 4)
                else:  # left for the outer loop, which reads its class again
                    break
            starts[t], ends[t], hashes[t] = start, i, fmix(h + np.uint64(i - start))
            t += 1
    token_offsets[len(offsets) - 1] = t
    return t


@nb.njit(nogil=True, cache=True, inline="always")
def _bytes_hash(data, a, b):
    h = np.uint64(0)
    pw = np.uint64(1)
    for k in range(a, b):
        h += _LOWER1[data[k]] * pw
        pw *= P
    return fmix(h + np.uint64(b - a))


@nb.njit(nogil=True, cache=True)
def utf8_chars(data):  # pragma: no cover - compiled
    """The non-ASCII characters of UTF-8 bytes ``data`` (uint8 ``[B]``): (lead byte positions int64,
    code points int32, byte lengths int32)."""
    n = len(data)
    n8 = n // 8 * 8
    words = data[:n8].view(np.uint64)  # 8 bytes at a time through ASCII
    high = np.uint64(0x8080808080808080)
    count = 0
    for i in range(n):
        if data[i] >= 0xC0:
            count += 1
    lead = np.empty(count, np.int64)
    cp = np.empty(count, np.int32)
    length = np.empty(count, np.int32)
    c = 0
    i = 0
    while c < count:
        if (i & 7) == 0 and i < n8 and (words[i >> 3] & high) == 0:
            i += 8
            continue
        b = data[i]
        if b >= 0xC0:
            size = 2 if b < 0xE0 else (3 if b < 0xF0 else 4)
            v = np.int32(b & (0x1F if size == 2 else (0x0F if size == 3 else 0x07)))
            for k in range(i + 1, min(i + size, n)):
                v = (v << 6) | np.int32(data[k] & 0x3F)
            lead[c], cp[c], length[c] = i, v, size
            c += 1
            i += size
        else:
            i += 1
    return lead, cp, length


@nb.njit(nogil=True, cache=True)
def all_window_sums(hashes, offsets, n, doc_out, at_out, sums_out):  # pragma: no cover - compiled
    """Unfinished hashes ``sum_j t_j * P^(n-1-j)`` of every window of ``n`` tokens inside one text
    (rolling, Karp-Rabin), in text order, with their text ``doc`` and global start token ``at``
    (int64); returns the window count (outputs need ``sum(max(0, count - n + 1))`` entries)."""
    top = np.uint64(1)
    for _ in range(n - 1):
        top *= P
    w = 0
    for d in range(len(offsets) - 1):
        a, b = offsets[d], offsets[d + 1]
        if b - a < n:
            continue
        s = np.uint64(0)
        for k in range(a, a + n):
            s = s * P + hashes[k]
        for p in range(a, b - n + 1):
            if p > a:
                s = (s - hashes[p - 1] * top) * P + hashes[p + n - 1]
            doc_out[w], at_out[w], sums_out[w] = d, p, s
            w += 1
    return w


@nb.njit(nogil=True, cache=True)
def window_candidates(hashes, offsets, n, bits0, shift0, size0, bits1, shift1, size1, doc_out, at_out, sums_out
                      ):  # pragma: no cover - compiled
    """The windows of :func:`all_window_sums` whose sum ``s`` passes two bit sets (bit ``(s >> shift) %
    2^size`` of ``bits0`` and of ``bits1``, uint8 little-endian); returns their count (outputs need
    one entry per token). All sums first (a tight loop), then the tests."""
    w = all_window_sums(hashes, offsets, n, doc_out, at_out, sums_out)
    sh0, sh1 = np.uint64(shift0), np.uint64(shift1)
    mask0, mask1 = (np.uint64(1) << np.uint64(size0)) - np.uint64(1), (np.uint64(1) << np.uint64(size1)) - np.uint64(1)
    c = 0
    for k in range(w):
        s = sums_out[k]
        x = (s >> sh0) & mask0
        if (np.uint64(bits0[x >> np.uint64(3)]) >> (x & np.uint64(7))) & np.uint64(1):
            y = (s >> sh1) & mask1
            if (np.uint64(bits1[y >> np.uint64(3)]) >> (y & np.uint64(7))) & np.uint64(1):
                doc_out[c], at_out[c], sums_out[c] = doc_out[k], at_out[k], s
                c += 1
    return c


@nb.njit(nogil=True, cache=True)
def splice(data, starts, ends, pool, src, size, out):  # pragma: no cover - compiled
    """``out`` = ``data`` with each byte range ``starts[r]:ends[r]`` (sorted, disjoint) replaced by
    ``pool[src[r]:src[r] + size[r]]``; ``out`` has ``len(data) + sum(size - (ends - starts))`` bytes."""
    o = 0
    prev = 0
    for r in range(len(starts)):
        o = _copy(data, prev, starts[r], out, o)
        o = _copy(pool, src[r], src[r] + size[r], out, o)
        prev = ends[r]
    _copy(data, prev, len(data), out, o)


@nb.njit(nogil=True, cache=True)
def spliced_kinds(lead, kind, starts, ends, pool_lead, pool_kind, src, size):  # pragma: no cover - compiled
    """The classes (uint8) of the non-ASCII characters of :func:`splice`'s output, in order: those of
    the characters kept (``lead`` sorted, ``kind``) and of the pool characters inserted (``pool_lead``
    sorted, ``pool_kind``) for each replaced range."""
    out = np.empty(len(kind) + size.sum(), np.uint8)  # an inserted non-ASCII character has >= 2 bytes
    o = 0
    c = 0
    for r in range(len(starts) + 1):
        stop = starts[r] if r < len(starts) else np.iinfo(np.int64).max
        while c < len(lead) and lead[c] < stop:
            out[o] = kind[c]
            o += 1
            c += 1
        if r == len(starts):
            break
        while c < len(lead) and lead[c] < ends[r]:
            c += 1
        p = np.searchsorted(pool_lead, src[r])
        while p < len(pool_lead) and pool_lead[p] < src[r] + size[r]:
            out[o] = pool_kind[p]
            o += 1
            p += 1
    return out[:o]


@nb.njit(nogil=True, cache=True, inline="always")
def _copy(a, lo, hi, out, o):
    dst, src = out[o:o + hi - lo], a[lo:hi]
    for k in range(hi - lo):  # indexed by the loop variable: vectorized (slice assignment: ~20x slower)
        dst[k] = src[k]
    return o + hi - lo


@nb.njit(nogil=True, cache=True)
def sums_at(hashes, at, n, out):  # pragma: no cover - compiled
    """The window sum of the ``n`` tokens starting at each global token position ``at``."""
    for i in range(len(at)):
        s = np.uint64(0)
        for k in range(at[i], at[i] + n):
            s = s * P + hashes[k]
        out[i] = s


@nb.njit(nogil=True, cache=True)
def sequence_hashes(hashes, first, counts, out):  # pragma: no cover - compiled
    """``fmix(sum_j t_j * P^j + count)`` of the ``counts[i]`` tokens from ``first[i]``."""
    for i in range(len(first)):
        s = np.uint64(0)
        pw = np.uint64(1)
        for k in range(first[i], first[i] + counts[i]):
            s += hashes[k] * pw
            pw *= P
        out[i] = fmix(s + np.uint64(counts[i]))

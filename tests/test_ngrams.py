import unicodedata

import numpy as np
import polars as pl

from curation.ngrams import (
    _COMPOSES_WITH_PREVIOUS,
    Scratch,
    fmix64,
    sequence_hashes,
    tokenize,
    tokenize_utf8,
    unfmix64,
    utf8_buffer,
    window_hashes,
    window_sums,
)

M64 = (1 << 64) - 1
P = 1_099_511_628_211
CJK = r"([\p{Han}\p{Hiragana}\p{Katakana}])"


def _fmix(h: int) -> int:
    h ^= h >> 33
    h = h * 0xFF51AFD7ED558CCD & M64
    h ^= h >> 33
    h = h * 0xC4CEB9FE1A85EC53 & M64
    return h ^ (h >> 33)


def _reference_tokens(texts: list[str | None]) -> list[list[str]]:
    """Whole-string normalization, the definition: NFKC, lowercase, CJK characters spaced apart,
    every run of non-word characters a separator."""
    normed = pl.Series(texts, dtype=pl.Utf8).fill_null("").str.normalize("NFKC").str.to_lowercase()
    return [t.split() for t in normed.str.replace_all(CJK, " $1 ").str.replace_all(r"\W+", " ").to_list()]


def _reference_hash(token: str) -> int:
    """A token's hash in plain Python integers: fmix64(sum_k (b_k + 1) P^k + len)."""
    data = token.encode()
    return _fmix((sum((b + 1) * pow(P, k, 1 << 64) for k, b in enumerate(data)) + len(data)) & M64)


TRICKY = [
    "Plain ASCII, re-cased: SOLVE for X!", None, "", "   ",
    "cafe\u0301 vs café",  # decomposed and composed accents normalize alike
    "ΟΔΟΣ ΟΔΟΣΑ σοφός:ΣΟΦΟΣ'",  # final sigma depends on the word around it
    "\u1100\u1161\u11a8 각 \u3131\u314f",  # conjoining and compatibility jamo compose
    "ﬁne ＡＢＣ ① ½ ℎ 𝑥 ₂ ™ Kelvin\u212a",  # compatibility forms, several changing length
    "Сколько БУДЕТ ДВА плюс ДВА? Ёлка",  # Cyrillic capitals substituted in place
    "小明有三个苹果,他又买了五个。ひらがなカタカナ⺪",  # CJK tokens; a radical is punctuation
    "İstanbul ǅ ẞ ϒ\u0301 \u03f9",  # lowercase/NFKC oddities
    "\u0628\u0651\u064e\u062a \u0645\u064e\u0651",  # Arabic shadda + fatha are reordered by NFKC
    "éé", "\u0301start of a row with a mark",  # a row ending in an accent, the next starting with a mark
    "tab\tnew\nline\r\nnbsp\u00a0ideographic\u3000space soft\u00adhyphen zero\u200bwidth",
    "\u0915\u094d\u0937 \u0b47\u0b3e \u09c7\u09be",  # Devanagari conjunct, Oriya/Bengali two-part vowels
]


def test_tokens_and_hashes_equal_whole_string_normalization():
    tok = tokenize(pl.Series(TRICKY, dtype=pl.Utf8))
    want = _reference_tokens(TRICKY)
    assert tok.counts.tolist() == [len(w) for w in want]
    shown = tok.texts(np.arange(len(want)), np.zeros(len(want)), np.array([len(w) for w in want]))
    assert [s.split(" ") if s else [] for s in shown] == want
    assert tok.texts([0, 5], [1, 2], [3, 1]) == ["ascii re cased", "σοφός"]
    assert tok.hashes.tolist() == [_reference_hash(w) for words in want for w in words]


def test_batches_do_not_change_tokens():
    one_by_one = [tokenize(pl.Series([t], dtype=pl.Utf8)).hashes for t in TRICKY]
    assert np.array_equal(tokenize(pl.Series(TRICKY, dtype=pl.Utf8)).hashes, np.concatenate(one_by_one))


def test_chunks_of_one_buffer_through_a_scratch_give_the_same_tokens():
    texts = pl.Series(TRICKY * 3, dtype=pl.Utf8).fill_null("")
    whole = tokenize(texts)
    data, offsets = utf8_buffer(texts)
    scratch, got = Scratch(), []
    for a, b in ((0, 7), (7, 8), (8, 30), (30, len(texts))):  # the scratch grows, then is reused
        tok = tokenize_utf8(data[offsets[a]:offsets[b]], offsets[a:b + 1] - offsets[a], scratch)
        assert tok.hashes.base is not None  # a view into the scratch, no copy
        got.append(tok.hashes.copy())
    assert np.array_equal(np.concatenate(got), whole.hashes)


def test_window_and_sequence_hashes_are_the_documented_polynomials():
    tok = tokenize(pl.Series(["a b c d", "e f", "g h i"]))
    t = [int(x) for x in tok.hashes]
    h, doc, pos = window_hashes(tok, 3)
    assert doc.tolist() == [0, 0, 2] and pos.tolist() == [0, 1, 0]  # no window across texts
    want = [_fmix((t[s] * P * P + t[s + 1] * P + t[s + 2]) & M64) for s in (0, 1, 6)]
    assert h.tolist() == want
    assert fmix64(window_sums(tok, 3, np.array([6]))).tolist() == [want[2]]
    seq = [_fmix((sum(t[4 + j] * pow(P, j, 1 << 64) for j in range(2)) + 2) & M64)]
    assert sequence_hashes(tok, np.array([1])).tolist() == seq == [sequence_hashes(tok)[1]]
    assert np.array_equal(unfmix64(fmix64(tok.hashes)), tok.hashes)


def test_composes_with_previous_is_derived_from_unicodedata():
    second = set()
    for cp in range(0x110000):
        dec = unicodedata.decomposition(chr(cp))
        if dec and not dec.startswith("<") and len(dec.split()) == 2:
            second.add(int(dec.split()[1], 16))
    starters = {c for c in second if unicodedata.combining(chr(c)) == 0}
    hangul = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))  # algorithmic: not in decomposition()
    assert _COMPOSES_WITH_PREVIOUS == frozenset(starters | hangul)

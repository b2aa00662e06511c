"""Gopher's repetition statistics of a text (Rae et al. 2021, "Scaling Language Models", Appendix A, Table A1),
as datatrove's ``GopherRepetitionFilter`` computes them:

- ``dup_line_frac`` / ``dup_para_frac``: the fraction of lines (split on ``\\n+``) / paragraphs (``\\n{2,}``)
  equal to an earlier one; ``dup_line_char_frac`` / ``dup_para_char_frac``: their characters over the text's;
- ``top_{2,3,4}gram_char_frac``: characters of the most frequent word n-gram (joined by spaces) times its count,
  over the text's characters (0 when no n-gram repeats);
- ``dup_{5..10}gram_char_frac``: characters (without spaces) of the words inside repeated occurrences of word
  n-grams (an occurrence equal to an earlier one; the first stays), over the text's characters. datatrove
  skips ``n`` words after each repeat it counts; here every word a repeat covers counts once, the paper's
  "fraction of characters contained within duplicate n-grams".

Word n-grams are keyed by a 64-bit polynomial hash of per-text word ids (numpy), so each statistic is a few
vector passes per text instead of a Python loop over its n-grams.
"""

from __future__ import annotations

import re

import numpy as np

TOP_NGRAMS = (2, 3, 4)
DUP_NGRAMS = (5, 6, 7, 8, 9, 10)
STATS = (["dup_line_frac", "dup_line_char_frac", "dup_para_frac", "dup_para_char_frac"]
         + [f"top_{n}gram_char_frac" for n in TOP_NGRAMS] + [f"dup_{n}gram_char_frac" for n in DUP_NGRAMS])
_LINES, _PARAS = re.compile(r"\n+"), re.compile(r"\n{2,}")
_BASE = np.uint64(1_000_003)


def _dup_parts(parts: list[str], total: int) -> tuple[float, float]:
    seen: set[str] = set()
    dup = chars = 0
    for part in parts:
        if part in seen:
            dup += 1
            chars += len(part)
        else:
            seen.add(part)
    return (dup / len(parts) if parts else 0.0), (chars / total if total else 0.0)


def _ngram_keys(ids: np.ndarray, n: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        keys = np.zeros(len(ids) - n + 1, dtype=np.uint64)
        for k in range(n):
            keys = keys * _BASE + ids[k:len(ids) - n + 1 + k]
    return keys


def repetition_stats(text: str) -> dict[str, float]:
    """The statistics of :data:`STATS` for ``text`` (each in [0, 1]; all 0 for an empty text)."""
    total = len(text)
    out = dict.fromkeys(STATS, 0.0)
    if not total:
        return out
    lines = [x for x in _LINES.split(text.strip()) if x.strip()]
    paras = [x for x in _PARAS.split(text.strip()) if x.strip()]
    out["dup_line_frac"], out["dup_line_char_frac"] = _dup_parts(lines, total)
    out["dup_para_frac"], out["dup_para_char_frac"] = _dup_parts(paras, total)
    words = text.split()
    index: dict[str, int] = {}
    ids = np.fromiter((index.setdefault(w, len(index)) for w in words), dtype=np.uint64, count=len(words))
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    for n in TOP_NGRAMS:
        if len(ids) > n:
            keys = _ngram_keys(ids, n)
            uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
            top = int(np.argmax(counts))
            if counts[top] > 1:
                start = int(first[top])
                out[f"top_{n}gram_char_frac"] = (int(lengths[start:start + n].sum()) + n - 1) * int(counts[top]) / total
    for n in DUP_NGRAMS:
        if len(ids) > n:
            keys = _ngram_keys(ids, n)
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            repeat = first[inverse] != np.arange(len(keys))
            cover = np.zeros(len(ids) + 1, dtype=np.int64)  # words inside a repeated occurrence [i, i + n)
            starts = np.flatnonzero(repeat)
            np.add.at(cover, starts, 1)
            np.add.at(cover, starts + n, -1)
            covered = np.cumsum(cover[:-1]) > 0
            out[f"dup_{n}gram_char_frac"] = int(lengths[covered].sum()) / total
    return out

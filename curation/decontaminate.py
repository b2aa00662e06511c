"""Benchmark decontamination: which training rows hold a benchmark item.

Matching: both sides of each training row (:data:`SIDES`): the prompt side (all user turns
joined, or ``metadata.question``) and the answer side (every assistant turn's reasoning and
content) are scanned exhaustively against the n-gram index of the benchmark items
(:mod:`curation.ngram_index`: questions and reference solutions); a side whose whole token
sequence equals a short question matches too. A reference solution copied into an assistant turn
is caught (the answer side needs ``answer_min_coverage`` of the field's n-grams: answers are
formulaic). This is the GPT-3 practice (Brown et al. 2020, appendix C; 13-grams) with an 8-gram
level as in Llama 2's contamination study.

Short n-grams such as 8 also occur in unrelated text ("1 2 3 4 5 6 7 8", "what is the
probability that exactly two of"), so per n a side must share at least a fraction
``min_coverage`` of an item's n-grams (0: any one, the 13-gram rule).

Boilerplate and stock phrases: an n-gram held by more than ``max_train_doc_freq`` training
problems is a formula of the training corpus ("please answer the following question ...") and
does not count (counted in the stats). One held by more than ``stock_doc_freq`` problems (1 by
default) is a stock phrase of the genre ("where m and n are relatively prime positive integers",
"enter the letter of the correct option", Asymptote preambles): alone, one such phrase is not
evidence (:func:`find_contamination_tables`). Removing contaminated rows lowers those frequencies
(the copies of an item go in the first pass, so later passes count only unrelated problems), so
detection repeats on the remaining rows until a pass finds nothing, or stops early when no n-gram
changes tier (the next pass would find nothing): running detection again on the output finds 0 by
construction. The rule and its audit on the pipeline's data: ``docs/decontamination.md``
(``benchmarks/contamination_audit.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from common.text import answer_text, item_texts, normalize
from curation.ngram_index import Lookup, NgramIndex, scan
from curation.ngrams import tokenize

if TYPE_CHECKING:
    from curation.params import DecontaminateParams

SIDES = ("prompt", "answer")  # the texts of a training row matched: its task, the assistant turns


@dataclass
class _Hits:
    """Index hits of the training texts, as arrays.

    ``doc``, ``nk`` (int64 ``[H]``, unique pairs): text number (``side * rows + row``, sides as in
    :data:`SIDES`) and n-gram key ``key * 256 + n`` (``key``: position in ``Lookup.sums[n]``).
    ``row``, ``row_nk`` (int64 ``[U]``, unique pairs): the same n-grams per training row (a row
    holding an n-gram on both sides counts once: the document frequencies). ``exact_doc``,
    ``exact_item`` (int64 ``[E]``): texts whose whole token sequence equals a short question.
    """

    doc: np.ndarray
    nk: np.ndarray
    row: np.ndarray
    row_nk: np.ndarray
    exact_doc: np.ndarray
    exact_item: np.ndarray


def side_texts(train: pl.DataFrame, kind: str, sides: tuple[str, ...] = SIDES) -> pl.Series:
    """The texts decontamination matches, ``len(sides) * len(train)`` Utf8 values, side by side:
    every row's prompt side (:func:`common.text.item_texts`) and/or every row's answer side
    (:func:`common.text.answer_text`: assistant content and reasoning), ``""`` where a row has none.

    Raises:
        ValueError: a side not in :data:`SIDES`.
    """
    texts = {"prompt": lambda: item_texts(train, kind).fill_null(""),
             "answer": lambda: train.select(answer_text(kind)).to_series()}
    unknown = sorted(set(sides) - set(SIDES))
    if unknown or not sides:
        raise ValueError(f"decontamination sides {list(sides)}: each must be one of {list(SIDES)}")
    return pl.concat([texts[side]().alias("text") for side in sides])


@dataclass
class ScannedRows:
    """The rows of training tables that hold an index hit, as detection needs them: no text.

    ``uuid`` (Utf8 ``[K]``), ``table`` (their kinds, object ``[K]``), ``problem`` (uint64 ``[K]``: hash
    of the normalized prompt side, :func:`common.text.item_texts`; rows of one problem are one training
    document) and ``number`` (int64 ``[K]``, ascending: the row's number among all ``total`` rows scanned,
    in table then file order, when these rows are one bucket of them) per row. N-gram hits: ``row``
    (position in these rows), ``side`` (position in ``sides``), ``n`` and ``key`` (position in
    ``Lookup.sums[n]``), int64 ``[H]``; exact hits of short questions: ``exact_row``, ``exact_side``,
    ``exact_item``, int64 ``[E]``.
    """

    uuid: pl.Series
    table: np.ndarray
    problem: np.ndarray
    row: np.ndarray
    side: np.ndarray
    n: np.ndarray
    key: np.ndarray
    exact_row: np.ndarray
    exact_side: np.ndarray
    exact_item: np.ndarray
    number: np.ndarray
    total: int


_HIT_LISTS = {"side": pl.UInt8, "n": pl.UInt8, "key": pl.Int64, "exact_side": pl.UInt8, "exact_item": pl.Int64}
HITS_SCHEMA = {"uuid": pl.Utf8, "problem": pl.UInt64, **{name: pl.List(t) for name, t in _HIT_LISTS.items()}}


def row_hits(frame: pl.DataFrame, kind: str, index: NgramIndex, sides: tuple[str, ...] = SIDES) -> pl.DataFrame:
    """The rows of ``frame`` (schema ``kind``) holding an index hit on one of ``sides`` (an n-gram, or the
    whole text equal to a short question), one row each in ``frame``'s order: ``uuid``, ``problem``
    (:class:`ScannedRows`) and their hits as lists (``side``, ``n``, ``key``; ``exact_side``,
    ``exact_item``). What a map over training batches returns: the hits, not the rows' text
    (:func:`scanned_rows` joins them)."""
    import pyarrow as pa

    k = max(len(frame), 1)
    doc, n, key, ex_doc, ex_item = scan(pl.concat([side_texts(frame, kind, (side,)) for side in sides]), index)
    row, ex_row = doc % k, ex_doc % k
    held = np.flatnonzero(np.bincount(np.concatenate([row, ex_row]), minlength=len(frame)))
    out = {"uuid": frame["uuid"].gather(held),
           "problem": item_texts(frame[held], kind).fill_null("").to_frame("t")
           .select(normalize(pl.col("t")).hash(seed=0))["t"]}
    for name, (at, values) in {"side": (row, doc // k), "n": (row, n), "key": (row, key),
                               "exact_side": (ex_row, ex_doc // k), "exact_item": (ex_row, ex_item)}.items():
        order = np.argsort(at, kind="stable")
        offsets = np.concatenate([[0], np.cumsum(np.bincount(at, minlength=len(frame))[held])]).astype(np.int32)
        lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[order].astype(np.int64)))
        out[name] = pl.Series(name, lists).cast(pl.List(_HIT_LISTS[name]))
    return pl.DataFrame(out)


def scanned_rows(parts: list[tuple[str, pl.DataFrame]]) -> ScannedRows:
    """:class:`ScannedRows` of the :func:`row_hits` frames ``parts`` (``(kind, frame)``, in table then file
    order): one row number over them all."""
    frames = [f.with_columns(pl.lit(kind, pl.Utf8).alias("table")) for kind, f in parts]
    whole = pl.concat([pl.DataFrame(schema={**HITS_SCHEMA, "table": pl.Utf8}), *frames])
    return hits_frame_rows(whole.with_row_index("number").with_columns(pl.col("number").cast(pl.Int64)), len(whole))


def hits_frame_rows(frame: pl.DataFrame, total: int) -> ScannedRows:
    """:class:`ScannedRows` of ``frame``: :data:`HITS_SCHEMA` plus ``table`` (Utf8: the row's kind) and
    ``number`` (Int64: its number among the ``total`` rows scanned), one row per scanned row, any order."""
    frame = frame.sort("number")
    lists = {}
    for name in _HIT_LISTS:
        counts = frame[name].list.len().to_numpy()
        lists[name] = (np.repeat(np.arange(len(frame), dtype=np.int64), counts),
                       frame[name].explode().drop_nulls().cast(pl.Int64).to_numpy())
    return ScannedRows(uuid=frame["uuid"], table=frame["table"].to_numpy().astype(object),
                       problem=frame["problem"].to_numpy(), row=lists["side"][0], side=lists["side"][1],
                       n=lists["n"][1], key=lists["key"][1], exact_row=lists["exact_side"][0],
                       exact_side=lists["exact_side"][1], exact_item=lists["exact_item"][1],
                       number=frame["number"].to_numpy(), total=total)


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct pairs ``(a[i], b[i])`` of non-negative int64 arrays, sorted by ``a`` then ``b``."""
    span = int(b.max()) + 1 if len(b) else 1
    if not len(a) or int(a.max()) < (1 << 62) // span:  # one int64 code per pair: a sort of numbers
        code = np.unique(a * span + b)
        return code // span, code % span
    pairs = np.unique(np.stack([a, b], axis=1), axis=0)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _index_entries(hits: _Hits, look: Lookup) -> dict[str, np.ndarray]:
    """Every index entry under each hit: ``doc``, ``nk`` (the hit's), ``item``, ``pos`` (int64 ``[N]``)."""
    cols: dict[str, list[np.ndarray]] = {c: [np.zeros(0, np.int64)] for c in ("doc", "nk", "item", "pos")}
    n_of = hits.nk & 255
    for n in look.ngrams:
        part = np.flatnonzero(n_of == n)
        first, key = look.first[n], hits.nk[part] >> 8
        count = first[key + 1] - first[key]
        src = np.repeat(first[key] - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
        for name, values in (("doc", np.repeat(hits.doc[part], count)), ("nk", np.repeat(hits.nk[part], count)),
                             ("item", look.item[n][src]), ("pos", look.pos[n][src])):
            cols[name].append(values.astype(np.int64))
    return {name: np.concatenate(parts) for name, parts in cols.items()}


@dataclass
class _Bucket:
    """One bucket of scanned rows as detection sweeps it: its :class:`_Hits` numbered over every bucket
    (``doc = side * total + number``, ``row = number``), ``problem`` (int64 ``[U]``: an id per distinct
    prompt-side hash, dense in the bucket, of each ``hits.row``: the rows of one problem, its SFT solution
    and RL prompt or several synthesized responses, are one training document for the frequencies),
    ``entries`` (:func:`_index_entries`), and per row ``number``, ``uuid``, ``table`` (:class:`ScannedRows`)."""

    hits: _Hits
    problem: np.ndarray
    entries: dict[str, np.ndarray]
    number: np.ndarray
    uuid: pl.Series
    table: np.ndarray
    total: int

    def local(self, docs: np.ndarray) -> np.ndarray:
        """The positions in this bucket of the rows of texts ``docs`` (int64, numbered over every bucket)."""
        return np.searchsorted(self.number, docs % self.total)


def _bucket(scanned: ScannedRows, look: Lookup) -> _Bucket:
    total = max(scanned.total, 1)
    doc, nk = _unique_pairs(scanned.side * total + scanned.number[scanned.row], scanned.key * 256 + scanned.n)
    row, row_nk = _unique_pairs(doc % total, nk)
    hits = _Hits(doc, nk, row, row_nk, scanned.exact_side * total + scanned.number[scanned.exact_row],
                 scanned.exact_item)
    at = np.searchsorted(scanned.number, row)
    problem = np.unique(scanned.problem[at], return_inverse=True)[1].reshape(-1) if len(at) else at
    return _Bucket(hits, problem, _index_entries(hits, look), scanned.number, scanned.uuid, scanned.table, total)


def _doc_freq(part: _Bucket, gone: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n-gram keys ``nk`` sorted, training problems holding each) over the rows of ``part`` not ``gone``
    (bool per row of the bucket)."""
    live = ~gone[part.local(part.hits.row)]
    _, nk = _unique_pairs(part.problem[live], part.hits.row_nk[live])
    return np.unique(nk, return_counts=True)


def _add_freq(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of two (sorted keys, counts) of :func:`_doc_freq` over buckets of disjoint problems."""
    keys, at = np.unique(np.concatenate([a[0], b[0]]), return_inverse=True)
    return keys, np.bincount(at.reshape(-1), np.concatenate([a[1], b[1]]), len(keys)).astype(np.int64)


def _tiers(freq: np.ndarray, stock_doc_freq: int, max_train_doc_freq: int) -> np.ndarray:
    """0 (evidence), 1 (stock phrase: evidence only with coverage) or 2 (boilerplate: ignored) per frequency."""
    return (freq > stock_doc_freq).astype(np.int8) + (freq > max_train_doc_freq)


_FOUND = ["doc", "item", "n", "pos", "how", "shared", "phrases", "min_doc_freq"]  # a found hit, as detection keeps it
_SHARED = {"doc": pl.Int64, "n": pl.UInt8, "item": pl.Int64, "shared": pl.Int64, "phrases": pl.Int64,
           "min_doc_freq": pl.Int64, "pos": pl.Int32}


def _shared(entries: dict[str, np.ndarray], freq: np.ndarray, tier: np.ndarray, rows: int, need: np.ndarray,
            need_stock: np.ndarray) -> pl.DataFrame:
    """(``doc``, ``n``, ``item``, ``shared``, ``phrases``, ``min_doc_freq``, ``pos``): texts sharing
    enough n-grams with an item, sorted.

    Per (text, n, item), over the distinct shared n-grams whose tier (``tier``, ``freq`` of each
    entry; -1: the text's row is gone) is below 2: ``shared`` of them, ``phrases`` the runs of
    overlapping ones (item positions one apart: one copied phrase), ``pos`` the first one's
    position in the item, ``min_doc_freq`` the fewest training problems holding one. Kept when
    ``shared >= need[side, n, item]`` (``side = doc // rows``) and, unless one of them is rare
    (tier 0) or they form several phrases, ``shared >= need_stock[n, item]``: one stock phrase
    alone is not evidence.
    """
    live = (tier >= 0) & (tier < 2)
    doc, nk, item, pos = (entries[c][live] for c in ("doc", "nk", "item", "pos"))
    freq, rare = freq[live], tier[live] == 0
    n = nk & 255
    group = (doc * need.shape[1] + n) * need.shape[2] + item
    if not len(group):
        return pl.DataFrame(schema=_SHARED)
    order = np.lexsort((nk, group))
    g, k = group[order], nk[order]
    first = np.flatnonzero(np.concatenate([[True], g[1:] != g[:-1]]))
    distinct = np.concatenate([[True], (g[1:] != g[:-1]) | (k[1:] != k[:-1])])
    shared = np.add.reduceat(distinct, first)
    any_rare = np.add.reduceat(distinct & rare[order], first) > 0
    min_freq = np.minimum.reduceat(freq[order], first)
    by_pos = np.lexsort((pos, group))  # the same groups in the same order, positions sorted within each
    g, p = group[by_pos], pos[by_pos]
    starts = np.concatenate([[True], (g[1:] != g[:-1]) | (p[1:] > p[:-1] + 1)])
    phrases = np.add.reduceat(starts, first)
    first_pos = p[first]
    doc, n, item = doc[order][first], n[order][first], item[order][first]
    keep = (shared >= need[doc // max(rows, 1), n, item]) & (any_rare | (phrases > 1) | (shared >= need_stock[n, item]))
    return pl.DataFrame({"doc": doc[keep], "n": n[keep].astype(np.uint8), "item": item[keep], "shared": shared[keep],
                         "phrases": phrases[keep], "min_doc_freq": min_freq[keep],
                         "pos": first_pos[keep].astype(np.int32)})


def _found(part: _Bucket, gone: np.ndarray, keys: np.ndarray, freq: np.ndarray,
           tier: Callable[[np.ndarray], np.ndarray], need: np.ndarray, need_stock: np.ndarray) -> pl.DataFrame:
    """One pass's hits (columns :data:`_FOUND`) of the rows of ``part`` not ``gone``: texts sharing enough
    n-grams with an item (:func:`_shared`, each entry's frequency from ``keys``/``freq`` and its ``tier``)
    and texts equal to a short question (all found in the first pass)."""
    entries, hits = part.entries, part.hits
    at = np.minimum(np.searchsorted(keys, entries["nk"]), max(len(keys) - 1, 0))
    present = (keys[at] == entries["nk"]) if len(keys) else np.zeros(len(at), bool)
    entry_freq = np.where(present, freq[at] if len(keys) else 0, 0)
    entry_tier = np.where(present & ~gone[part.local(entries["doc"])], tier(entry_freq), -1)
    shared = _shared(entries, entry_freq, entry_tier, part.total, need, need_stock).with_columns(
        pl.format("{}-gram", "n").alias("how"))
    live = ~gone[part.local(hits.exact_doc)]
    exact = pl.DataFrame({"doc": hits.exact_doc[live], "item": hits.exact_item[live]}).with_columns(
        pl.lit(0, pl.UInt8).alias("n"), pl.lit(0, pl.Int32).alias("pos"), pl.lit("exact").alias("how"),
        *(pl.lit(None, pl.Int64).alias(c) for c in ("shared", "phrases", "min_doc_freq")))
    return pl.concat([shared.select(_FOUND), exact.select(_FOUND)])


def _need(look: Lookup, coverage: dict[int, float] | None, default: float = 0.0) -> np.ndarray:
    """int64 ``[max n + 1, items]``: ``max(1, ceil(coverage[n] * m))`` distinct n-grams of each item."""
    cov = np.full(len(look.m), default)
    for n, c in (coverage or {}).items():
        if int(n) < len(cov):
            cov[int(n)] = c
    return np.maximum(1, np.ceil(cov[:, None] * look.m)).astype(np.int64)


def find_contamination(train: pl.DataFrame, kind: str, index: NgramIndex, max_train_doc_freq: int,
                       min_coverage: dict[int, float] | None = None, stock_doc_freq: int | None = None,
                       stock_min_coverage: float = 0.5, answer_min_coverage: float = 0.5,
                       sides: tuple[str, ...] = SIDES) -> tuple[pl.DataFrame, dict[str, Any]]:
    """:func:`find_contamination_tables` of the one table ``train`` (schema ``kind``), without the
    ``table`` column."""
    matches, stats = find_contamination_tables({kind: train}, index, max_train_doc_freq, min_coverage, stock_doc_freq,
                                               stock_min_coverage, answer_min_coverage, sides)
    return matches.drop("table"), stats


def find_contamination_tables(tables: dict[str, pl.DataFrame], index: NgramIndex, max_train_doc_freq: int,
                              min_coverage: dict[int, float] | None = None, stock_doc_freq: int | None = None,
                              stock_min_coverage: float = 0.5, answer_min_coverage: float = 0.5,
                              sides: tuple[str, ...] = SIDES) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Contaminated rows of the training ``tables`` (``{kind: frame}``: one corpus, so the document
    frequencies count the rows of every table), matched on the ``sides`` of each row (:data:`SIDES`:
    the prompt side and the assistant turns' content and reasoning).

    Each n-gram gets the number of training problems holding it (its document frequency ``df``;
    rows with the same normalized prompt side are one problem: :func:`_problems`).
    A side of a row is contaminated by a benchmark item when it shares, for some n, at least
    ``max(1, ceil(min_coverage[n] * m))`` of the item's ``m`` distinct n-grams, not counting
    boilerplate (``df > max_train_doc_freq``), or equals a short question exactly.
    ``min_coverage`` defaults to 0 (any one n-gram, the GPT-3 rule); short n such as 8 need a
    coverage (e.g. 0.5), else generic phrases ("what is the probability that exactly two of")
    count. Stock phrases (``stock_doc_freq < df <= max_train_doc_freq``, e.g. "where m and n are
    relatively prime positive integers find m n" in many competition problems): a side whose
    shared n-grams with an item are all stock n-grams forming one phrase (one run of
    overlapping windows) is contaminated only when they cover at least ``stock_min_coverage``
    of the item's n-grams (the item itself, copied into several rows); a rarer shared n-gram
    or a second phrase makes them evidence. ``stock_doc_freq`` None: no stock tier. On the
    answer side every n needs at least ``answer_min_coverage`` of the item field's n-grams:
    assistant turns are formulaic (code idioms such as ``while b: a, b = b, a % b``, LaTeX
    sequences, Asymptote preambles share single 13-grams with reference solutions by chance),
    while a copied solution or restated question covers nearly all of its field.

    Returns (matches, stats): ``matches`` has one row per contaminated side of a training row,
    sorted by uuid, then the longest n, then side: ``uuid``, ``table`` (its kind), ``side``, ``benchmark``,
    ``benchmark_uuid``, ``field``, ``how`` (``"13-gram"`` ... or ``"exact"``), ``match`` (the
    first shared n-gram's tokens or the whole question), ``shared`` (distinct n-grams shared,
    null for exact), ``phrases`` (their runs), ``min_doc_freq`` (live training problems holding the
    rarest of them in the pass that found it). When a side
    matches several items, the longest n wins, then the smallest (benchmark, benchmark_uuid,
    field). ``stats``: ``passes`` (detection passes run: removing rows lowers frequencies, so one
    more runs while an n-gram's tier changes), ``boilerplate_ngrams_ignored`` and
    ``stock_ngrams`` per n (in the final pass).
    """
    parts = [(kind, row_hits(t, kind, index, sides)) for kind, t in tables.items()]
    return detect_contamination(scanned_rows(parts), index, max_train_doc_freq, min_coverage, stock_doc_freq,
                                stock_min_coverage, answer_min_coverage, sides)


def detect_contamination(scanned: ScannedRows | Sequence[Callable[[], ScannedRows]], index: NgramIndex,
                         max_train_doc_freq: int, min_coverage: dict[int, float] | None = None,
                         stock_doc_freq: int | None = None, stock_min_coverage: float = 0.5,
                         answer_min_coverage: float = 0.5, sides: tuple[str, ...] = SIDES
                         ) -> tuple[pl.DataFrame, dict[str, Any]]:
    """:func:`find_contamination_tables` on the index hits of the rows (``scanned``, :func:`scanned_rows`
    of :func:`row_hits` on ``sides``): the same matches and stats, from arrays of hits instead of texts.

    ``scanned`` may also be the loaders of buckets of those rows (each a :class:`ScannedRows` numbered over
    them all; every row of one problem in one bucket, so each bucket's document frequencies add up): each
    pass loads one bucket at a time, so memory holds one bucket's hits, the frequencies of the index's
    n-grams, a flag per scanned row and the matches.
    """
    loaders = [lambda: scanned] if isinstance(scanned, ScannedRows) else list(scanned)
    look = index.lookup
    coverage = {int(n): float(c) for n, c in (min_coverage or {}).items()}
    stock = max_train_doc_freq if stock_doc_freq is None else min(int(stock_doc_freq), max_train_doc_freq)
    tier = partial(_tiers, stock_doc_freq=stock, max_train_doc_freq=max_train_doc_freq)
    on_answers = _need(look, {n: max(c, answer_min_coverage) for n, c in coverage.items()}, answer_min_coverage)
    need = np.stack([on_answers if side == "answer" else _need(look, coverage) for side in sides])
    need_stock = _need(look, {}, stock_min_coverage)
    held: dict[int, _Bucket] = {}

    def bucket(b: int) -> _Bucket:  # one bucket stays loaded between passes; more are read again
        part = held.get(b) or _bucket(loaders[b](), look)
        if len(loaders) == 1:
            held[b] = part
        return part

    gone: list[np.ndarray] = []  # per bucket, per row: removed by an earlier pass
    counts: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    total = 1  # rows scanned over every bucket (texts are numbered side * total + row)
    for b in range(len(loaders)):
        part = bucket(b)
        total = part.total
        gone.append(np.zeros(len(part.number), bool))
        counts = _add_freq(counts, _doc_freq(part, gone[b]))
    keys, freq = counts
    found: list[pl.DataFrame] = []
    passes = 0
    while True:
        passes += 1
        new, counts = 0, (np.zeros(0, np.int64), np.zeros(0, np.int64))
        for b in range(len(loaders)):
            part, dropped = bucket(b), gone[b]
            hit = _found(part, dropped, keys, freq, tier, need, need_stock)
            rows = part.local(hit["doc"].to_numpy())
            new += int((~dropped[rows]).sum())
            dropped[rows] = True
            found.append(hit.with_columns(part.uuid.gather(rows).alias("uuid"),
                                          pl.Series("table", part.table[rows].tolist(), dtype=pl.Utf8)))
            counts = _add_freq(counts, _doc_freq(part, dropped))
        if not new:
            break
        # The texts left count the same n-grams against the same items in the next pass unless an
        # n-gram's tier falls once these rows are gone: else the next pass would find nothing.
        before_keys, before = keys, tier(freq)
        keys, freq = counts
        if np.array_equal(tier(freq), before[np.searchsorted(before_keys, keys)]):
            break
    tiers = tier(freq)
    best = (pl.concat([pl.DataFrame(schema={**_SHARED, "how": pl.Utf8, "uuid": pl.Utf8, "table": pl.Utf8})
                       .select(*_FOUND, "uuid", "table"), *found])
            .join(index.items.select("item", "benchmark", "benchmark_uuid", "field", "text"), on="item")
            .sort(pl.col("n"), "doc", "benchmark", "benchmark_uuid", "field", "pos",
                  descending=[True, False, False, False, False, False])
            .group_by("doc", maintain_order=True).first())
    best = best.with_columns(pl.Series("match", _match_texts(best), dtype=pl.Utf8),
                             pl.Series("side", np.array(sides)[(best["doc"] // total).to_numpy()], dtype=pl.Utf8))
    stats = {"passes": passes,
             "boilerplate_ngrams_ignored": {f"{n}-gram": int(((keys[tiers == 2] & 255) == n).sum())
                                            for n in index.meta["ngrams"]},
             "stock_ngrams": {f"{n}-gram": int(((keys[tiers == 1] & 255) == n).sum()) for n in index.meta["ngrams"]}}
    matches = (best.sort("uuid", pl.col("n"), "side", descending=[False, True, False])
               .select("uuid", "table", "side", "benchmark", "benchmark_uuid", "field", "how", "match", "shared",
                       "phrases", "min_doc_freq"))
    return matches, stats


def _match_texts(best: pl.DataFrame) -> list[str]:
    """The matched tokens of each chosen hit (the whole item text for exact hits)."""
    if best.is_empty():
        return []
    tok = tokenize(best["text"])
    n = best["n"].cast(pl.Int64).to_numpy()
    return tok.texts(np.arange(len(best)), best["pos"].to_numpy(), np.where(n > 0, n, tok.counts))


def decontaminate(train: pl.DataFrame, kind: str, index: NgramIndex, max_train_doc_freq: int,
                  min_coverage: dict[int, float] | None = None, stock_doc_freq: int | None = None,
                  stock_min_coverage: float = 0.5, answer_min_coverage: float = 0.5, sides: tuple[str, ...] = SIDES
                  ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """Split ``train`` into (clean, contaminated-with-reason, matches, stats).

    ``reason`` is ``contaminated: <benchmark> item <uuid> <field> <how> in <side> '<match>'``, from
    the row's first match (:func:`find_contamination`: the longest n, the prompt side first);
    ``matches`` is that function's frame; ``stats["contaminated_by_benchmark"]`` counts rows per
    benchmark (each row once, under its reported match).
    """
    matches, stats = find_contamination(train, kind, index, max_train_doc_freq, min_coverage, stock_doc_freq,
                                        stock_min_coverage, answer_min_coverage, sides)
    clean, dirty = split_contaminated(train, matches)
    stats["contaminated_by_benchmark"] = contaminated_by_benchmark(matches)
    return clean, dirty, matches, stats


def split_contaminated(train: pl.DataFrame, matches: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(clean rows, contaminated rows with ``reason``) of ``train``, in its order, by the ``matches``
    of :func:`find_contamination` (or of :func:`find_contamination_tables`: rows of other tables
    are ignored). ``reason`` comes from a row's first match."""
    first = matches.unique("uuid", keep="first", maintain_order=True)
    bad = first.select("uuid", pl.format("contaminated: {} item {} {} {} in {} '{}'", "benchmark", "benchmark_uuid",
                                         "field", "how", "side", pl.col("match").str.slice(0, 200)).alias("reason"))
    return (train.join(bad, on="uuid", how="anti", maintain_order="left"),
            train.join(bad, on="uuid", how="inner", maintain_order="left"))


def contaminated_by_benchmark(matches: pl.DataFrame) -> dict[str, int]:
    """``{benchmark: contaminated training rows}`` of the decontamination matches (sorted by name;
    a row counts once, under its first match)."""
    totals = matches.unique("uuid", keep="first", maintain_order=True).group_by("benchmark").len().sort("benchmark")
    return dict(zip(totals["benchmark"], totals["len"], strict=True))


def contamination_report(matches: pl.DataFrame, meta: dict[str, Any], p: DecontaminateParams) -> dict[str, Any]:
    """``metrics/decontamination.json``: the settings (the ``decontaminate`` params ``p``, every key)
    and, per benchmark of the index (``meta``): its item count, the contaminated training rows per
    side (``rows``: ``{"prompt": n, "answer": n}``, a row matched on both sides counts in both;
    ``rows_removed``: each row once, under its first match) and every match (one dict per row of
    ``matches``, which may carry a ``table`` column)."""
    first = contaminated_by_benchmark(matches)
    out: dict[str, Any] = p.model_dump()
    out["benchmarks"] = {}
    for b, n in meta["benchmark_items"].items():
        mine = matches.filter(pl.col("benchmark") == b)
        out["benchmarks"][b] = {"items": n, "rows_removed": first.get(b, 0),
                                "rows": {side: mine.filter(pl.col("side") == side).height for side in SIDES},
                                "contaminated_rows": mine.to_dicts()}
    return out

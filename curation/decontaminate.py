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

from dataclasses import dataclass
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


def _train_hits(scanned: ScannedRows) -> _Hits:
    """All index hits of the scanned rows, as :class:`_Hits` (text number ``side * rows + row``)."""
    rows = max(len(scanned.uuid), 1)
    doc, nk = _unique_pairs(scanned.side * rows + scanned.row, scanned.key * 256 + scanned.n)
    row, row_nk = _unique_pairs(doc % rows, nk)
    return _Hits(doc, nk, row, row_nk, scanned.exact_side * rows + scanned.exact_row, scanned.exact_item)


@dataclass
class ScannedRows:
    """The rows of training tables that hold an index hit, as detection needs them: no text.

    ``uuid`` (Utf8 ``[K]``), ``table`` (their kinds, object ``[K]``) and ``problem`` (uint64 ``[K]``: hash
    of the normalized prompt side, :func:`common.text.item_texts`; rows of one problem are one training
    document) per row, in table then file order. N-gram hits: ``row``, ``side`` (position in ``sides``),
    ``n`` and ``key`` (position in ``Lookup.sums[n]``), int64 ``[H]``; exact hits of short questions:
    ``exact_row``, ``exact_side``, ``exact_item``, int64 ``[E]``.
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
    frames = [f for _, f in parts]
    rows = [len(f) for f in frames]
    whole = pl.concat([pl.DataFrame(schema=HITS_SCHEMA), *frames])
    lists = {}
    for name in _HIT_LISTS:
        counts = whole[name].list.len().to_numpy()
        lists[name] = (np.repeat(np.arange(len(whole), dtype=np.int64), counts),
                       whole[name].explode().drop_nulls().cast(pl.Int64).to_numpy())
    return ScannedRows(uuid=whole["uuid"], table=np.repeat(np.array([k for k, _ in parts], dtype=object), rows),
                       problem=whole["problem"].to_numpy(), row=lists["side"][0], side=lists["side"][1],
                       n=lists["n"][1], key=lists["key"][1], exact_row=lists["exact_side"][0],
                       exact_side=lists["exact_side"][1], exact_item=lists["exact_item"][1])


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


def _doc_freq(hits: _Hits, gone: np.ndarray, problem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n-gram keys ``nk`` sorted, training problems holding each) over the rows not ``gone``;
    ``problem`` (int64 ``[rows]``): rows with one problem id count once (:func:`_problems`)."""
    live = ~gone[hits.row]
    _, nk = _unique_pairs(problem[hits.row[live]], hits.row_nk[live])
    return np.unique(nk, return_counts=True)


def _problems(problem: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """int64 ``[len(problem)]``: for the rows ``rows`` (sorted: those with n-gram hits), one id per distinct
    prompt-side hash ``problem`` (:class:`ScannedRows`); -1 elsewhere. The rows of one problem (its SFT
    solution and RL prompt, several synthesized responses) are one training document for the frequencies."""
    out = np.full(len(problem), -1, np.int64)
    if len(rows):
        out[rows] = np.unique(problem[rows], return_inverse=True)[1]
    return out


def _tiers(freq: np.ndarray, stock_doc_freq: int, max_train_doc_freq: int) -> np.ndarray:
    """0 (evidence), 1 (stock phrase: evidence only with coverage) or 2 (boilerplate: ignored) per frequency."""
    return (freq > stock_doc_freq).astype(np.int8) + (freq > max_train_doc_freq)


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


def detect_contamination(scanned: ScannedRows, index: NgramIndex, max_train_doc_freq: int,
                         min_coverage: dict[int, float] | None = None, stock_doc_freq: int | None = None,
                         stock_min_coverage: float = 0.5, answer_min_coverage: float = 0.5,
                         sides: tuple[str, ...] = SIDES) -> tuple[pl.DataFrame, dict[str, Any]]:
    """:func:`find_contamination_tables` on the index hits of the rows (``scanned``, :func:`scanned_rows`
    of :func:`row_hits` on ``sides``): the same matches and stats, from arrays of hits instead of texts."""
    look, rows = index.lookup, len(scanned.uuid)
    uuids, table_of = scanned.uuid, scanned.table
    coverage = {int(n): float(c) for n, c in (min_coverage or {}).items()}
    stock = max_train_doc_freq if stock_doc_freq is None else min(int(stock_doc_freq), max_train_doc_freq)
    on_answers = _need(look, {n: max(c, answer_min_coverage) for n, c in coverage.items()}, answer_min_coverage)
    need = np.stack([on_answers if side == "answer" else _need(look, coverage) for side in sides])
    need_stock = _need(look, {}, stock_min_coverage)
    hits = _train_hits(scanned)
    entries = _index_entries(hits, look)
    gone = np.zeros(rows, dtype=bool)
    found: list[pl.DataFrame] = []
    passes = 0
    problem = _problems(scanned.problem, np.unique(hits.row))
    keys, freq = _doc_freq(hits, gone, problem)
    while True:
        passes += 1
        at = np.minimum(np.searchsorted(keys, entries["nk"]), max(len(keys) - 1, 0))
        present = (keys[at] == entries["nk"]) if len(keys) else np.zeros(len(at), bool)
        entry_freq = np.where(present, freq[at] if len(keys) else 0, 0)
        entry_tier = np.where(present & ~gone[entries["doc"] % max(rows, 1)],
                              _tiers(entry_freq, stock, max_train_doc_freq), -1)
        shared = _shared(entries, entry_freq, entry_tier, rows, need, need_stock)
        exact_live = hits.exact_doc[~gone[hits.exact_doc % max(rows, 1)]]
        new = np.union1d(shared["doc"].to_numpy(), exact_live) % max(rows, 1)
        if not len(new):
            break
        gone[new] = True
        found.append(shared)
        # The texts left count the same n-grams against the same items in the next pass unless an
        # n-gram's tier falls once these rows are gone: else the next pass would find nothing.
        before_keys, before = keys, _tiers(freq, stock, max_train_doc_freq)
        keys, freq = _doc_freq(hits, gone, problem)
        if np.array_equal(_tiers(freq, stock, max_train_doc_freq), before[np.searchsorted(before_keys, keys)]):
            break
    tiers = _tiers(freq, stock, max_train_doc_freq)
    gram_hits = pl.concat([pl.DataFrame(schema=_SHARED), *found]).with_columns(pl.format("{}-gram", "n").alias("how"))
    exact_hits = pl.DataFrame({"doc": hits.exact_doc, "item": hits.exact_item}).with_columns(  # all gone in pass 1
        pl.lit(0, pl.UInt8).alias("n"), pl.lit(0, pl.Int32).alias("pos"), pl.lit("exact").alias("how"),
        *(pl.lit(None, pl.Int64).alias(c) for c in ("shared", "phrases", "min_doc_freq")))
    cols = ["doc", "item", "n", "pos", "how", "shared", "phrases", "min_doc_freq"]
    best = (pl.concat([gram_hits.select(cols), exact_hits.select(cols)])
            .join(index.items.select("item", "benchmark", "benchmark_uuid", "field", "text"), on="item")
            .sort(pl.col("n"), "doc", "benchmark", "benchmark_uuid", "field", "pos",
                  descending=[True, False, False, False, False, False])
            .group_by("doc", maintain_order=True).first())
    row = best["doc"] % max(rows, 1)
    best = best.with_columns(pl.Series("match", _match_texts(best), dtype=pl.Utf8),
                             uuids.gather(row).alias("uuid"),
                             pl.Series("table", table_of[row.to_numpy()].tolist(), dtype=pl.Utf8),
                             pl.Series("side", np.array(sides)[(best["doc"] // max(rows, 1)).to_numpy()],
                                       dtype=pl.Utf8))
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

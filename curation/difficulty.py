"""Difficulty filtering: measure each RL prompt's pass rate with the policy, keep the informative ones.

For every row, ``n`` responses are sampled with a rollout engine of the stage
runners (CPU: transformers ``generate``; GPU: vLLM) from the prompt rendered by
the tokenizer's chat template, scored by the row's verifier, and recorded as
``pass_rate_total = n``, ``pass_rate_passed = c``, ``pass_rate = c / n``. A row
is kept when ``min < pass_rate < max`` (strict; the paper drops prompts a
strong model solves n/n, and prompts nobody solves carry no GRPO signal
either: their group rewards are all equal).

Generations are cached per (row uuid, model, sampling parameters) as parquet
chunks under ``cache_dir/<key>/``: changing the bounds re-filters without
generating, and a run killed midway resumes at the first chunk not written.

Rows that arrive with pass rates (NVIDIA's Cascade-2 RL release measured them with
its own policy: ``pass_rate``, ``pass_rate_total``, ``pass_rate_passed``) can be
judged by those instead (``difficulty.pass_rates``, :func:`plan_set`):
the same bounds and reject reasons, and each judged row's ``metadata`` says which
it was (``pass_rate_source``: ``release`` | ``measured``).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from tqdm import tqdm

from common.io import write_parquet

if TYPE_CHECKING:
    from curation.params import DifficultyParams

RESULT_SCHEMA = {"uuid": pl.Utf8, "pass_rate_total": pl.Int64, "pass_rate_passed": pl.Int64,
                 "responses": pl.List(pl.Utf8), "rewards": pl.List(pl.Float64), "reasons": pl.List(pl.Utf8)}


def cache_key(model_id: str, sampling: dict[str, Any], n: int) -> str:
    """Directory name of a generation cache: model and sampling parameters, hashed (16 hex)."""
    blob = json.dumps({"model": model_id, "sampling": sampling, "n": n}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_cache(cache: Path) -> pl.DataFrame:
    """All results cached in ``cache`` (empty frame with :data:`RESULT_SCHEMA` when none)."""
    files = sorted(cache.glob("chunk-*.parquet"))
    if not files:
        return pl.DataFrame(schema=RESULT_SCHEMA)
    return pl.concat([pl.read_parquet(f) for f in files]).unique("uuid", keep="last", maintain_order=True)


def grade(rows: list[dict[str, Any]], responses: list[list[str]],
          score: Callable[[list[str], list[dict[str, Any]]], list[Any]]) -> list[dict[str, Any]]:
    """One :data:`RESULT_SCHEMA` dict per row from its responses and their verdicts (one ``score``
    call for all); a verdict whose grader failed (``error``) is left out of ``pass_rate_total``.

    Raises:
        RuntimeError: ``score`` returned another number of verdicts than responses.
    """
    flat_rows = [row for row, rs in zip(rows, responses, strict=True) for _ in rs]
    verdicts = score([r for rs in responses for r in rs], flat_rows)
    if len(verdicts) != len(flat_rows):
        raise RuntimeError(f"{len(verdicts)} verdicts for {len(flat_rows)} responses")
    out, pos = [], 0
    for row, rs in zip(rows, responses, strict=True):
        vs = verdicts[pos:pos + len(rs)]
        pos += len(rs)
        graded = [v for v in vs if not getattr(v, "error", None)]  # the grader failed: not a 0
        out.append({"uuid": row["uuid"], "pass_rate_total": len(graded),
                    "pass_rate_passed": sum(bool(v.passed) for v in graded), "responses": rs,
                    "rewards": [float(v.reward) for v in vs], "reasons": [v.reason for v in vs]})
    return out


# measure()'s stats that describe this run, not its result: seconds and rates depend on the machine and its
# load, generated counts on what the cache already held. Kept out of the DVC metrics (dvc.lock stays stable).
RUN_KEYS = ("wall_s", "cpu_s", "rollouts_per_s", "tokens_per_s", "generated_rows", "rollouts", "generated_tokens")


def measure(rows: list[dict[str, Any]], sample: Callable[[list[dict[str, Any]]], list[list[str]]],
            score: Callable[[list[str], list[dict[str, Any]]], list[Any]], cache: Path,
            chunk_rows: int = 8) -> tuple[pl.DataFrame, dict[str, float]]:
    """Pass rates of ``rows``, generating only what ``cache`` lacks.

    Args:
        rows: canonical RL rows (dicts).
        sample: ``rows -> n responses per row`` (the rollout engine behind the chat template).
        score: ``(responses, rows) -> verdicts`` with ``.reward`` and ``.passed`` (the verifiers'
            ``verify_batch``), one verdict per response.
        cache: this (model, sampling) pair's cache directory.

    Only the generations are reused from ``cache``: every cached response is graded again by
    ``score``, so a verifier fixed since the cache was written is what decides (grading is cheap
    next to sampling).

    Returns:
        (results with :data:`RESULT_SCHEMA` for every row, stats: ``generated_rows``,
        ``rollouts``, ``wall_s``, ``cpu_s`` (this process's CPU seconds: on shared cores the
        load-independent cost), ``rollouts_per_s`` and, when the sampler counts them
        (``policy_sampler``), ``generated_tokens`` and ``tokens_per_s``).
    """
    cache.mkdir(parents=True, exist_ok=True)
    done = set(load_cache(cache)["uuid"])
    todo = [r for r in rows if r["uuid"] not in done]
    start, cpu_start, n_rollouts = time.perf_counter(), time.process_time(), 0
    tokens_start = getattr(sample, "generated_tokens", None)  # the sampler counts over its lifetime
    offset = len(list(cache.glob("chunk-*.parquet")))
    for k, i in enumerate(tqdm(range(0, len(todo), chunk_rows), desc="pass rates", unit="chunk")):
        chunk = todo[i:i + chunk_rows]
        responses = sample(chunk)
        out = grade(chunk, responses, score)
        n_rollouts += sum(map(len, responses))
        write_parquet(pl.DataFrame(out, schema=RESULT_SCHEMA), cache / f"chunk-{offset + k:06d}.parquet")
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    results = load_cache(cache).filter(pl.col("uuid").is_in([r["uuid"] for r in rows]))
    # Cached generations are graded again by today's verifiers: a stored verdict is never trusted.
    reused = results.filter(pl.col("uuid").is_in(list(done)))
    if len(reused):
        by_uuid = {r["uuid"]: r for r in rows}
        fresh = pl.DataFrame(grade([by_uuid[u] for u in reused["uuid"]], reused["responses"].to_list(), score),
                             schema=RESULT_SCHEMA)
        results = results.update(fresh, on="uuid")
    stats = {"generated_rows": len(todo), "rollouts": n_rollouts, "wall_s": round(elapsed, 1),
             "cpu_s": round(cpu, 1), "rollouts_per_s": round(n_rollouts / elapsed, 3) if n_rollouts else 0.0}
    if tokens_start is not None and n_rollouts:
        tokens = sample.generated_tokens - tokens_start  # type: ignore[attr-defined]
        stats |= {"generated_tokens": tokens, "tokens_per_s": round(tokens / elapsed, 2)}
    return results, stats


def apply_pass_rates(rows: pl.DataFrame, results: pl.DataFrame, lo: float, hi: float
                     ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Fill ``pass_rate*`` of ``rows`` from ``results`` and split by ``lo < pass_rate < hi``.

    Returns (kept, dropped with ``reason`` ``too_easy: c/n``, ``too_hard: c/n`` or ``ungraded``:
    ``n`` counts only the responses the grader judged (``Verdict.error`` ones are left out));
    rows without a result are an error.

    Raises:
        ValueError: naming a row that has no measured pass rate.
    """
    joined = rows.drop("pass_rate", "pass_rate_total", "pass_rate_passed").join(
        results.select("uuid", "pass_rate_total", "pass_rate_passed"), on="uuid", how="left",
        maintain_order="left")
    missing = joined.filter(pl.col("pass_rate_total").is_null())
    if len(missing):
        raise ValueError(f"row {missing['uuid'][0]} has no measured pass rate ({len(missing)} rows)")
    joined = joined.with_columns((pl.col("pass_rate_passed") / pl.col("pass_rate_total")).alias("pass_rate"))
    return _split_by_bounds(joined.select(rows.columns), lo, hi,
                            pl.format("{}/{}", "pass_rate_passed", "pass_rate_total"))


def _split_by_bounds(rows: pl.DataFrame, lo: float, hi: float, frac: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(rows with ``lo < pass_rate < hi``, the others with a ``reason``: ``ungraded`` when no response
    was graded (``pass_rate`` 0/0, NaN), else ``too_easy: <frac>`` / ``too_hard: <frac>``)."""
    keep = (pl.col("pass_rate") > lo) & (pl.col("pass_rate") < hi)
    dropped = rows.filter(~keep).with_columns(
        pl.when(pl.col("pass_rate").is_nan()).then(pl.lit("ungraded: the grader failed on every response"))
        .when(pl.col("pass_rate") >= hi).then(pl.format("too_easy: {}", frac))
        .otherwise(pl.format("too_hard: {}", frac)).alias("reason"))
    return rows.filter(keep), dropped


NO_RELEASE_PASS_RATE = ("no_release_pass_rate: the row carries no usable pass_rate or pass_rate_total/"
                        "pass_rate_passed (params difficulty.pass_rates: release)")


def _counted() -> pl.Expr:
    """True where ``pass_rate_passed`` of ``pass_rate_total`` (>= 1) responses is a usable count (null where
    either is missing)."""
    total, passed = pl.col("pass_rate_total"), pl.col("pass_rate_passed")
    return (total >= 1) & (passed >= 0) & (passed <= total)


def has_release_pass_rate() -> pl.Expr:
    """True where a row carries a pass rate of its own: counts (``pass_rate_passed`` of
    ``pass_rate_total`` >= 1 responses), else a ``pass_rate`` in [0, 1]; false where neither."""
    return (_counted() | pl.col("pass_rate").is_between(0.0, 1.0)).fill_null(False)


def _release_frac() -> pl.Expr:
    """A release pass rate as the reasons and histograms write it: ``c/n`` from its counts, else the rate."""
    return (pl.when(_counted()).then(pl.format("{}/{}", "pass_rate_passed", "pass_rate_total"))
            .otherwise(pl.col("pass_rate").cast(pl.Utf8)))


def apply_release_pass_rates(rows: pl.DataFrame, lo: float, hi: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split ``rows`` by their own pass rates with the rule of :func:`apply_pass_rates`
    (``lo < pass_rate < hi``, reasons ``too_easy: c/n`` / ``too_hard: c/n``). ``pass_rate`` is
    ``pass_rate_passed / pass_rate_total`` where the counts are usable, else the row's ``pass_rate``
    (a reason then gives the rate, e.g. ``too_easy: 1.0``).

    Raises:
        ValueError: naming a row without a release pass rate (:func:`has_release_pass_rate`).
    """
    missing = rows.filter(~has_release_pass_rate())
    if len(missing):
        raise ValueError(f"row {missing['uuid'][0]} has no release pass rate ({len(missing)} rows)")
    rated = rows.with_columns(pl.when(_counted()).then(pl.col("pass_rate_passed") / pl.col("pass_rate_total"))
                              .otherwise(pl.col("pass_rate")).alias("pass_rate"))
    return _split_by_bounds(rated, lo, hi, _release_frac())


def mark_source(rows: pl.DataFrame, source: str) -> pl.DataFrame:
    """``rows`` with ``pass_rate_source: source`` added to each row's ``metadata`` JSON object."""
    meta = [json.dumps({**json.loads(m or "{}"), "pass_rate_source": source}, ensure_ascii=False)
            for m in rows["metadata"]]
    return rows.with_columns(pl.Series("metadata", meta, dtype=pl.Utf8))


def plan_set(train: pl.DataFrame, p: DifficultyParams, name: str, seed: int
             ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """``(rated, todo, unjudged)``: the rows of set ``name``'s ``train`` judged by their release pass
    rates, the rows to measure with the policy, and the rows judged by neither with a ``reason``.

    ``difficulty.pass_rates`` (``p.pass_rates``) decides: ``measure`` rates no row; ``release`` and
    ``release_else_measure`` rate every row that has a release pass rate (:func:`has_release_pass_rate`,
    no row budget: nothing is sampled). The rest is measured under ``measure`` and
    ``release_else_measure`` (:func:`split_for_measurement` within ``difficulty.max_rows_per_set``:
    beyond it ``not_measured``), rejected as ``no_release_pass_rate`` under ``release``.

    Raises:
        ValueError: ``release`` on a set none of whose rows has a release pass rate (names the params key
            and the set), or a ``{set: rows}`` budget without ``name`` (:func:`rows_to_measure`).
    """
    rated_mask = has_release_pass_rate() if p.pass_rates != "measure" else pl.lit(False)
    rated, unrated = train.filter(rated_mask), train.filter(~rated_mask)
    if p.pass_rates == "release":
        if len(train) and not len(rated):
            raise ValueError(f"params difficulty.pass_rates is 'release' but no row of set {name!r} carries a "
                             f"release pass rate (pass_rate, or pass_rate_total and pass_rate_passed): use "
                             f"release_else_measure, or leave {name} out of difficulty.sets")
        return rated, unrated.head(0), unrated.with_columns(pl.lit(NO_RELEASE_PASS_RATE).alias("reason"))
    todo, skipped = split_for_measurement(unrated, p.max_prompt_chars, rows_to_measure(p, name), seed)
    return rated, todo, skipped.with_columns(
        pl.lit("not_measured: beyond max_rows_per_set or longer than max_prompt_chars").alias("reason"))


def judge(rated: pl.DataFrame, todo: pl.DataFrame, results: pl.DataFrame, lo: float, hi: float
          ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(kept, dropped with ``reason``) of a set: ``rated`` rows by their release pass rates
    (:func:`apply_release_pass_rates`), then ``todo`` rows by their measured ``results``
    (:func:`apply_pass_rates`), each row's ``metadata`` marked with its ``pass_rate_source``
    (``release`` | ``measured``, :func:`mark_source`).

    Raises:
        ValueError: a ``rated`` row without a release pass rate, or a ``todo`` row without a result.
    """
    kept_r, dropped_r = apply_release_pass_rates(mark_source(rated, "release"), lo, hi)
    kept_m, dropped_m = apply_pass_rates(mark_source(todo, "measured"), results, lo, hi)
    return pl.concat([kept_r, kept_m]), pl.concat([dropped_r, dropped_m])


@dataclass
class Verdictish:
    """A pass/fail outcome with a reason, shaped like a verifier's ``Verdict`` for
    rows graded by a rule rather than a verifier (``reward`` is 1.0 or 0.0)."""

    passed: bool
    reason: str

    @property
    def reward(self) -> float:
        return float(self.passed)


def policy_sampler(model_dir: str, engine: str, sampling: dict[str, Any], n: int, thinking: bool = False,
                   seed: int | None = None, threads: int | None = 1
                   ) -> Callable[[list[dict[str, Any]]], list[list[str]]]:
    """``rows -> n responses each`` with the model in ``model_dir`` through the stage runners'
    rollout engine ``engine`` (``auto`` | ``hf`` | ``vllm``), started once here; ``sample.close()``
    stops it. Prompts are the ones the RL stages train on (:class:`stages.environment.PromptBuilder`:
    chat template, tools in a system turn when the template ignores ``tools``; ``enable_thinking``
    passed to templates that read it). ``sample.generated_tokens`` counts the response tokens
    sampled so far. With ``seed`` each call's samples are a function of the seed and the rows'
    uuids, so a batch samples the same way whatever was generated before it. ``threads``: torch
    intra-op threads while the hf engine samples (restored after; ``None``: the process setting).
    The default 1 is measured: on 2 shared cores, 2 threads spin-waiting burned 106 CPU-s where 1
    thread needed 16.5 for the same 16 rollouts. The vllm engine binds its own process's threads."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stages.environment import PromptBuilder
    from stages.rollout import SamplingConfig, make_rollout_engine, resolve_engine_name, torch_threads

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = resolve_engine_name(engine)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32) if engine == "hf" else None
    rollout = make_rollout_engine(engine, model, tokenizer, SamplingConfig(**sampling), model_path=model_dir)
    builder = PromptBuilder(tokenizer, max_prompt_tokens=10**9)

    def sample(rows: list[dict[str, Any]]) -> list[list[str]]:
        prompts = []
        for row in rows:
            chat, tools = builder.messages(row)
            prompts.append(list(tokenizer.apply_chat_template(chat, tools=tools, add_generation_prompt=True,
                                                              tokenize=True, return_dict=False,
                                                              enable_thinking=thinking)))
        call_seed = None
        if seed is not None:
            digest = hashlib.sha256(f"{seed}:{','.join(r['uuid'] for r in rows)}".encode()).hexdigest()
            call_seed = int(digest[:15], 16)
        with torch_threads(threads):
            out = rollout.generate(prompts, n, seed=call_seed)
        sample.generated_tokens += sum(map(len, out.response_ids))  # type: ignore[attr-defined]
        return [out.texts[i * n:(i + 1) * n] for i in range(len(rows))]

    sample.generated_tokens = 0  # type: ignore[attr-defined]
    sample.close = rollout.close  # type: ignore[attr-defined]
    return sample


def histogram_bins(totals: set[int], most: int = 256) -> int:
    """Bins of :func:`histogram_png` for pass rates ``c/n`` over every ``n`` in ``totals`` (responses
    per prompt, each >= 1): their least common multiple, so every ``c/n`` sits at a bin centre, or the
    largest ``n`` when that multiple passes ``most`` bins."""
    lcm = math.lcm(*totals)
    return lcm if lcm <= most else max(totals)


def histogram_png(rates: dict[str, list[float]], n: int, path: Path) -> None:
    """One pass-rate histogram per set (bins at c/n), written atomically as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.io import atomic_path

    fig, axes = plt.subplots(1, max(len(rates), 1), figsize=(3 * max(len(rates), 1), 2.6), squeeze=False)
    for ax, (name, values) in zip(axes[0], sorted(rates.items()), strict=False):
        ax.hist(values, bins=[(i - 0.5) / n for i in range(n + 2)], color="#4c72b0")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("pass rate")
    axes[0][0].set_ylabel("prompts")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def prompt_chars() -> pl.Expr:
    """Characters of an RL row's prompt turns (a cheap bound on its prefill cost)."""
    return (pl.col("responses_create_params").struct.field("input")
            .list.eval(pl.element().struct.field("content").str.len_chars()).list.sum())


def rows_to_measure(p: DifficultyParams, name: str) -> int:
    """The row budget of set ``name``: ``difficulty.max_rows_per_set``, one number for every set or
    ``{set: rows}``.

    Raises:
        ValueError: a ``{set: rows}`` budget without ``name`` (names the params key).
    """
    budget = p.max_rows_per_set
    if not isinstance(budget, dict):
        return budget
    if name not in budget:
        raise ValueError(f"params difficulty.max_rows_per_set has no budget for set {name!r} (it lists "
                         f"{sorted(budget)}): give every set of difficulty.sets a row count")
    return budget[name]


def split_for_measurement(train: pl.DataFrame, max_prompt_chars: int, max_rows: int, seed: int
                          ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(todo, skipped)``: the first ``max_rows`` rows of ``train`` among those whose prompt has at
    most ``max_prompt_chars`` characters, and every other row (rejected later as ``not_measured``).

    Rows are taken in the order ``cascade build`` draws them into the stage mixes
    (:func:`curation.build.rank_batch` with ``build.seed`` as ``seed``; a mix takes each domain's
    lowest ranks), so a budget of ``max_rows`` measures the first rows of every mix, not a random
    sample of which a 600-row mix of a 5,000-row domain would hold one in thirty."""
    from curation.build import rank_batch

    ranked = rank_batch(train, seed).with_columns((prompt_chars() > max_prompt_chars).alias("_long"))
    ranked = ranked.sort("_long", "_rank")
    todo = ranked.filter(~pl.col("_long")).head(max_rows).drop("_rank", "_long")
    return todo, ranked.join(todo.select("uuid"), on="uuid", how="anti").drop("_rank", "_long")


def filter_mix(mix: pl.DataFrame, kept: pl.DataFrame, measured: list[str]) -> tuple[pl.DataFrame, list[str]]:
    """The rows of a stage mix the filter keeps, and the mix's domains it did not measure (sorted).

    A mix's rows are rows of the per-domain sets (:func:`curation.build.draw_mix` copies them, uuid
    included), so the filter's verdict on a row carries over: a row of a ``measured`` domain is kept
    when ``kept`` (the kept rows of every measured set) holds its uuid, and takes its pass rates and
    ``metadata`` (with its ``pass_rate_source``) from there; a row of any other domain is kept as it
    is (nothing measured it). Mix order is kept. ("measured": judged by the filter, by pass rates it
    sampled or by the release's.)

    >>> mix = pl.DataFrame({"uuid": ["m0", "m1", "c0"], "domain": ["math", "math", "code"],
    ...                     "pass_rate": None, "pass_rate_total": None, "pass_rate_passed": None, "metadata": "{}"})
    >>> measured = pl.DataFrame({"uuid": ["m1"], "pass_rate": [0.5], "pass_rate_total": [4], "pass_rate_passed": [2],
    ...                          "metadata": ['{"pass_rate_source": "measured"}']})
    >>> kept, unmeasured = filter_mix(mix, measured, ["math"])
    >>> kept["uuid"].to_list(), kept["pass_rate"].to_list(), kept["metadata"].to_list(), unmeasured
    (['m1', 'c0'], [0.5, None], ['{"pass_rate_source": "measured"}', '{}'], ['code'])
    """
    rates = ("pass_rate", "pass_rate_total", "pass_rate_passed")
    joined = mix.drop(rates).join(kept.select("uuid", *rates, pl.col("metadata").alias("_judged")), on="uuid",
                                  how="left", maintain_order="left")
    keep = ~pl.col("domain").is_in(measured) | pl.col("pass_rate_total").is_not_null()
    joined = joined.with_columns(pl.coalesce("_judged", "metadata").alias("metadata"))
    unmeasured = sorted(set(mix["domain"].unique()) - set(measured))
    return joined.filter(keep).select(mix.columns), unmeasured


def pass_rate_histogram(results: pl.DataFrame, n: int) -> dict[str, int]:
    """``{"c/n": rows}``: how many measured rows passed ``c`` of their ``n`` responses."""
    return {f"{c}/{n}": k for c, k in sorted(results.group_by("pass_rate_passed").len().iter_rows())}


def release_pass_rate_histogram(rated: pl.DataFrame) -> dict[str, int]:
    """``{"c/n": rows}`` of rows judged by their release pass rates, from their own counts (a row with
    only a ``pass_rate`` is keyed by the rate), in increasing pass rate."""
    rate = pl.when(_counted()).then(pl.col("pass_rate_passed") / pl.col("pass_rate_total")).otherwise("pass_rate")
    keyed = rated.select(_release_frac().alias("key"), rate.alias("rate"))
    counts = keyed.group_by("key").agg(pl.len(), pl.col("rate").first()).sort("rate", "key")
    return dict(zip(counts["key"], counts["len"], strict=True))

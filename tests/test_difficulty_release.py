"""The difficulty filter judges rows by the release's own pass rates (NVIDIA's Cascade-2 RL rows carry
``pass_rate``, ``pass_rate_total``, ``pass_rate_passed``) when ``difficulty.pass_rates`` says so, and
records which rows were judged that way and which were measured."""

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
import yaml

from common.io import write_parquet
from curation.difficulty import (
    NO_RELEASE_PASS_RATE,
    RESULT_SCHEMA,
    histogram_bins,
    judge,
    measure,
    plan_set,
    release_pass_rate_histogram,
)
from curation.params import check_params
from tests.rows import rl_table

REPO = Path(__file__).resolve().parents[1]
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
NO_RESULTS = pl.DataFrame(schema=RESULT_SCHEMA)  # nothing measured


@dataclass
class V:
    reward: float
    passed: bool
    reason: str = ""
    error: str | None = None


def _score(responses, rows):
    return [V(float(r == "yes"), r == "yes") for r in responses]


def _difficulty(**update):
    return check_params(PARAMS).difficulty.model_copy(update=update)


def _released(passed, total, prefix="r", rate=None):
    """Rows with release counts ``passed[i]`` of ``total[i]`` (``pass_rate`` as NVIDIA writes it)."""
    return rl_table([f"q{i}" for i in range(len(passed))], prefix=prefix, pass_rate_passed=passed,
                    pass_rate_total=total,
                    pass_rate=rate or [None if t is None else c / t for c, t in zip(passed, total, strict=True)])


def _source(frame):
    return [json.loads(m)["pass_rate_source"] for m in frame["metadata"]]


def test_release_rates_keep_and_drop_by_the_same_rule():
    rows = _released([0, 8, 5], [8, 8, 8])  # hand-computed: 0/8 and 8/8 are outside (0, 1), 5/8 = 0.625 inside
    rated, todo, unjudged = plan_set(rows, _difficulty(pass_rates="release"), "math", seed=42)
    assert (len(rated), len(todo), len(unjudged)) == (3, 0, 0)
    kept, dropped = judge(rated, todo, NO_RESULTS, 0.0, 1.0)
    assert kept["uuid"].to_list() == ["r2"] and kept["pass_rate"].to_list() == [0.625]
    assert (kept["pass_rate_passed"].item(), kept["pass_rate_total"].item()) == (5, 8)
    assert dict(zip(dropped["uuid"], dropped["reason"], strict=True)) == {"r0": "too_hard: 0/8", "r1": "too_easy: 8/8"}
    assert _source(kept) == ["release"] and _source(dropped) == ["release", "release"]
    # the bounds are the params' own: 0.7 < rate drops 5/8 as too hard, too
    kept, dropped = judge(rated, todo, NO_RESULTS, 0.7, 1.0)
    assert len(kept) == 0 and sorted(dropped["reason"]) == ["too_easy: 8/8", "too_hard: 0/8", "too_hard: 5/8"]


def test_a_rate_without_counts_is_used_and_the_counts_decide_when_both_are_there():
    rows = _released([None, 3], [None, 4], rate=[1.0, 0.5])  # r1's rate disagrees with its counts: 3/4 wins
    kept, dropped = judge(rows, rows.head(0), NO_RESULTS, 0.0, 1.0)
    assert dropped["reason"].to_list() == ["too_easy: 1.0"]
    assert kept["uuid"].to_list() == ["r1"] and kept["pass_rate"].to_list() == [0.75]
    assert release_pass_rate_histogram(rows) == {"3/4": 1, "1.0": 1}
    zero = _released([0], [0], rate=[1.0])  # no usable count: the rate decides, and nothing says "ungraded"
    assert judge(zero, zero.head(0), NO_RESULTS, 0.0, 1.0)[1]["reason"].to_list() == ["too_easy: 1.0"]


def test_a_measured_row_whose_every_response_failed_to_grade_is_ungraded(tmp_path):
    rows = rl_table(["a", "b"])
    results, _ = measure(rows.to_dicts(), lambda chunk: [["yes", "no"] for _ in chunk],
                         lambda responses, rows: [V(0.0, False, "boom", error="timeout") if row["uuid"] == "b0"
                                                  else V(1.0, True) for row in rows], tmp_path)
    kept, dropped = judge(rows.head(0), rows, results, 0.0, 1.0)
    assert dropped["uuid"].to_list() == ["b0", "b1"]
    assert dropped["reason"].to_list() == ["ungraded: the grader failed on every response", "too_easy: 2/2"]


def test_under_release_a_row_without_release_rates_is_rejected_with_a_reason_naming_it():
    rows = pl.concat([_released([4], [8]), rl_table(["plain"], prefix="p"),
                      _released([9], [8], prefix="bad")])  # 9 of 8: not a count, and no pass_rate of [0, 1]
    rows = rows.with_columns(pl.when(pl.col("uuid") == "bad0").then(None).otherwise("pass_rate").alias("pass_rate"))
    rated, todo, unjudged = plan_set(rows, _difficulty(pass_rates="release"), "math", seed=42)
    assert rated["uuid"].to_list() == ["r0"] and len(todo) == 0
    assert dict(zip(unjudged["uuid"], unjudged["reason"], strict=True)) == {"p0": NO_RELEASE_PASS_RATE,
                                                                            "bad0": NO_RELEASE_PASS_RATE}
    assert NO_RELEASE_PASS_RATE.startswith("no_release_pass_rate: ")


def test_release_on_a_set_without_any_release_rate_fails_naming_the_key():
    with pytest.raises(ValueError, match=r"difficulty.pass_rates is 'release' but no row of set 'math'"):
        plan_set(rl_table(["a", "b"]), _difficulty(pass_rates="release"), "math", seed=42)


def test_release_else_measure_samples_only_the_rows_without_release_rates(tmp_path):
    rows = pl.concat([_released([0, 5], [8, 8]), rl_table(["u0", "u1", "u2"], prefix="u")])
    rated, todo, unjudged = plan_set(rows, _difficulty(pass_rates="release_else_measure", max_rows_per_set=2),
                                     "math", seed=42)
    assert rated["uuid"].to_list() == ["r0", "r1"]
    assert sorted(todo["uuid"]) == sorted(set(rows["uuid"][2:]) - set(unjudged["uuid"])) and len(todo) == 2
    assert unjudged["reason"].str.starts_with("not_measured:").to_list() == [True]  # the budget covers measuring
    sampled = []

    def sample(chunk):
        sampled.extend(r["uuid"] for r in chunk)
        return [["yes", "no", "no", "no"] for _ in chunk]

    results, _ = measure(todo.to_dicts(), sample, _score, tmp_path)
    assert sorted(sampled) == sorted(todo["uuid"])
    kept, dropped = judge(rated, todo, results, 0.0, 1.0)
    assert dict(zip(kept["uuid"], _source(kept), strict=True)) == {"r1": "release",
                                                                    **dict.fromkeys(todo["uuid"], "measured")}
    assert kept.filter(pl.col("uuid").is_in(todo["uuid"].to_list()))["pass_rate"].to_list() == [0.25, 0.25]
    assert dropped["reason"].to_list() == ["too_hard: 0/8"] and kept.columns == rows.columns
    # measure (the default) rates no row, whatever the rows carry
    rated, todo, _ = plan_set(rows, _difficulty(max_rows_per_set=10), "math", seed=42)
    assert len(rated) == 0 and len(todo) == 5


def test_a_bad_pass_rates_value_names_the_key():
    params = {**PARAMS, "difficulty": {**PARAMS["difficulty"], "pass_rates": "nvidia"}}
    with pytest.raises(ValueError) as exc:
        check_params(params)
    assert str(exc.value) == ("params.yaml difficulty.pass_rates: Input should be 'measure', 'release' or "
                              "'release_else_measure' (got 'nvidia')")
    assert check_params(PARAMS).difficulty.pass_rates == "measure"  # the default pipeline measures


def test_histogram_bins_put_every_rate_at_a_bin_centre():
    assert histogram_bins({4, 8}) == 8 and histogram_bins({4, 3}) == 12 and histogram_bins({4}) == 4
    assert histogram_bins({7, 9, 11, 13}) == 13  # lcm 9009: too many bins, the largest n


def _step(monkeypatch, tmp_path, pass_rates, sets):
    """Run the difficulty step in ``tmp_path`` on the RL ``sets`` ({name: train}), with a ``mopd`` mix of
    every set's rows and of ``code`` rows; the policy answers ``yes`` once in 4."""
    from curation import difficulty, pipeline

    monkeypatch.chdir(tmp_path)
    for name, train in sets.items():
        write_parquet(train, Path("data/sets/rl") / name / "train.parquet")
        write_parquet(train.head(0), Path("data/sets/rl") / name / "validation.parquet")
    code = rl_table(["c"], prefix="c", domain=["code"], agent_ref=["code"])
    write_parquet(pl.concat([*sets.values(), code]), Path("data/sets/rl/mopd/train.parquet"))
    write_parquet(code.head(0), Path("data/sets/rl/mopd/validation.parquet"))
    sampled = []

    def policy_sampler(*args, **kwargs):
        def sample(chunk):
            sampled.extend(r["uuid"] for r in chunk)
            return [["yes", "no", "no", "no"] for _ in chunk]
        sample.close = lambda: None
        return sample

    monkeypatch.setattr(difficulty, "policy_sampler", policy_sampler)
    monkeypatch.setattr("validators.verifiers.verify_batch", lambda responses, rows, **kw: _score(responses, rows))
    monkeypatch.setattr(pipeline, "require_sandbox", lambda p: "rlimits")
    params = {**PARAMS, "build": {**PARAMS["build"], "mixes": {"mopd": {"total": 9, "weights": {"math": 0.5,
                                                                                                  "code": 0.5}}}},
              "difficulty": {**PARAMS["difficulty"], "sets": list(sets), "pass_rates": pass_rates,
                             "max_rows_per_set": 10, "cache_dir": str(tmp_path / "cache")}}
    metrics = pipeline.step_difficulty(check_params(params))
    return metrics, json.loads(Path("data/filtered/manifest.json").read_text()), sampled


def test_the_step_records_which_rows_came_from_the_release(monkeypatch, tmp_path):
    math = pl.concat([_released([0, 8, 5], [8, 8, 8]), rl_table(["u0"], prefix="u")])
    metrics, manifest, sampled = _step(monkeypatch, tmp_path, "release", {"math": math})
    assert sampled == []  # no policy: nothing is measured
    assert metrics["pass_rates"] == manifest["pass_rates"] == "release"
    assert (metrics["rows_in"], metrics["rows_out"]) == (4, 1)
    assert metrics["rejected_by_reason"] == {"no_release_pass_rate": 1, "too_easy": 1, "too_hard": 1}
    per_set = metrics["per_set"]["math"]
    assert (per_set["release"], per_set["measured"], per_set["kept"]) == (3, 0, 1)
    assert per_set["release_pass_rate_histogram"] == {"0/8": 1, "5/8": 1, "8/8": 1}
    assert manifest["sets"]["rl/math"] == {"rows": 4, "measured": 0, "release": 3, "kept": 1}
    filtered = pl.read_parquet("data/filtered/rl/math/train.parquet")
    assert filtered["uuid"].to_list() == ["r2"] and _source(filtered) == ["release"]
    mix = pl.read_parquet("data/filtered/rl/mopd/train.parquet")  # the mix takes the set's verdicts and marks
    assert mix["uuid"].to_list() == ["r2", "c0"] and [json.loads(m) for m in mix["metadata"]] == [
        {"pass_rate_source": "release"}, {}]
    rejects = pl.read_parquet("rejects/difficulty.parquet")
    assert dict(zip(rejects["record_id"], rejects["category"], strict=True)) == {
        "r0": "too_hard", "r1": "too_easy", "u0": "no_release_pass_rate"}


def test_the_step_measures_only_what_the_release_does_not_rate(monkeypatch, tmp_path):
    math = pl.concat([_released([0, 5], [8, 8]), rl_table(["u0", "u1"], prefix="u")])
    metrics, manifest, sampled = _step(monkeypatch, tmp_path, "release_else_measure", {"math": math})
    assert sorted(sampled) == ["u0", "u1"]
    per_set = metrics["per_set"]["math"]
    assert (per_set["release"], per_set["measured"], per_set["kept"]) == (2, 2, 3)
    assert per_set["pass_rate_histogram"] == {"1/4": 2} and per_set["release_pass_rate_histogram"] == {"0/8": 1,
                                                                                                        "5/8": 1}
    filtered = pl.read_parquet("data/filtered/rl/math/train.parquet")
    assert dict(zip(filtered["uuid"], _source(filtered), strict=True)) == {"r1": "release", "u0": "measured",
                                                                          "u1": "measured"}

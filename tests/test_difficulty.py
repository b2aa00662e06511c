from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
import yaml

from curation.build import draw_mix
from curation.difficulty import (
    apply_pass_rates,
    cache_key,
    filter_mix,
    load_cache,
    measure,
    rows_to_measure,
    split_for_measurement,
)
from curation.params import check_params
from tests.handed import handed_case
from tests.rows import rl_table

REPO = Path(__file__).resolve().parents[1]


@dataclass
class V:
    reward: float
    passed: bool
    reason: str = ""


def _score(responses, rows):
    return [V(float(r == "yes"), r == "yes") for r in responses]


def test_filter01_pass_rates_and_strict_bounds(tmp_path):
    case = handed_case("FILTER-01")
    results = case["input"]["filter"]["results"]
    rows = rl_table(list(results), prefix="p")
    by_uuid = {f"p{i}": outcome for i, outcome in enumerate(results.values())}

    def sample(chunk):
        return [["yes" if x else "no" for x in by_uuid[r["uuid"]]] for r in chunk]

    res, stats = measure(rows.to_dicts(), sample, _score, tmp_path / "c", chunk_rows=3)
    assert stats["rollouts"] == sum(len(v) for v in results.values())
    kept, dropped = apply_pass_rates(rows, res, 0.0, 1.0)
    names = list(results)
    assert [names[int(u[1:])] for u in kept["uuid"]] == case["expected"]["kept"]
    rates = dict(zip([names[int(u[1:])] for u in kept["uuid"]], kept["pass_rate"], strict=True))
    rates |= {names[int(u[1:])]: p for u, p in zip(dropped["uuid"], dropped["pass_rate"], strict=True)}
    assert rates == case["expected"]["pass_rate"]
    assert sorted(dropped["reason"]) == ["too_easy: 8/8", "too_hard: 0/8"]
    assert kept.filter(kept["uuid"] == "p2")["pass_rate_passed"].item() == 3


def test_cache_resumes_and_rebounds_without_generating(tmp_path):
    rows = rl_table([f"q{i}" for i in range(10)]).to_dicts()
    calls = []

    def sample(chunk):
        calls.append(len(chunk))
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed midway
        return [["yes", "no"] for _ in chunk]

    with pytest.raises(KeyboardInterrupt):
        measure(rows, sample, _score, tmp_path, chunk_rows=4)
    assert len(load_cache(tmp_path)) == 4  # the first chunk survived, nothing half-written
    calls.clear()
    res, stats = measure(rows, lambda c: [["yes", "no"] for _ in c], _score, tmp_path, chunk_rows=4)
    assert stats["generated_rows"] == 6 and len(res) == 10
    _, stats = measure(rows, sample, _score, tmp_path, chunk_rows=4)
    assert stats["generated_rows"] == 0 and calls == []


def test_cache_key_changes_with_model_and_sampling():
    a = cache_key("m", {"temperature": 1.0}, 8)
    assert a == cache_key("m", {"temperature": 1.0}, 8)
    assert len({a, cache_key("m2", {"temperature": 1.0}, 8), cache_key("m", {"temperature": 0.7}, 8),
                cache_key("m", {"temperature": 1.0}, 4)}) == 4


def test_unmeasured_row_is_an_error(tmp_path):
    rows = rl_table(["a", "b"])
    res, _ = measure(rows.head(1).to_dicts(), lambda c: [["yes"]], _score, tmp_path)
    with pytest.raises(ValueError, match="row b1 has no measured pass rate"):
        apply_pass_rates(rows, res, 0.0, 1.0)


def test_token_counts_are_per_call_when_one_sampler_serves_several_sets(tmp_path):
    """``policy_sampler`` counts tokens over its lifetime; each ``measure`` reports its own share."""
    def sample(chunk):
        sample.generated_tokens += 3 * len(chunk)
        return [["yes", "no", "no"] for _ in chunk]

    sample.generated_tokens = 0
    a, b = rl_table(["a1", "a2"], prefix="a").to_dicts(), rl_table(["b1"], prefix="b").to_dicts()
    _, first = measure(a, sample, _score, tmp_path / "a")
    _, second = measure(b, sample, _score, tmp_path / "b")
    assert (first["generated_tokens"], second["generated_tokens"]) == (6, 3)
    assert first["rollouts"] == 6 and second["rollouts"] == 3


def test_cached_generations_are_graded_again_by_the_current_verifier(tmp_path):
    """A verdict stored with a generation is never reused: a verifier fixed (or attacked and patched)
    since the cache was written decides, without generating again."""
    rows = rl_table(["a", "b"]).to_dicts()

    def sample(chunk):
        return [["yes", "no"] for _ in chunk]

    def buggy(responses, rows):  # pays everything
        return [V(1.0, True, "buggy") for _ in responses]

    first, _ = measure(rows, sample, buggy, tmp_path / "c")
    assert first["pass_rate_passed"].to_list() == [2, 2]
    again, stats = measure(rows, lambda chunk: pytest.fail("no generation expected"), _score, tmp_path / "c")
    assert stats["generated_rows"] == 0
    assert again["pass_rate_passed"].to_list() == [1, 1] and again["rewards"].to_list() == [[1.0, 0.0]] * 2
    assert again["uuid"].to_list() == first["uuid"].to_list()


def test_rows_are_measured_in_the_order_the_mixes_draw_them():
    """A budget of k rows measures the first k rows a stage mix draws from the domain (build's seeded
    rank), so a 10-row mix of a 200-row domain gets all its measured rows."""
    domain = rl_table([f"problem {i}" for i in range(200)], prefix="m")
    mix, _ = draw_mix({"rl/math": {"train": domain, "validation": domain.head(0)}}, {"math": 1.0}, 10, seed=42)
    todo, skipped = split_for_measurement(domain, max_prompt_chars=1200, max_rows=5, seed=42)
    assert todo["uuid"].to_list() == mix["train"]["uuid"].head(5).to_list()
    assert len(skipped) == 195 and set(skipped["uuid"]).isdisjoint(todo["uuid"])
    long = rl_table(["x" * 1201, "short"])  # longer than max_prompt_chars: never measured
    assert split_for_measurement(long, 1200, 5, 42)[0]["uuid"].to_list() == ["b1"]


def test_row_budget_is_one_number_or_one_per_set():
    base = check_params(yaml.safe_load((REPO / "params.yaml").read_text())).difficulty
    assert rows_to_measure(base.model_copy(update={"max_rows_per_set": 90}), "math") == 90
    per_set = base.model_copy(update={"max_rows_per_set": {"math": 160, "code": 24}})
    assert rows_to_measure(per_set, "code") == 24
    with pytest.raises(ValueError, match="difficulty.max_rows_per_set has no budget for set 'stem_mcqa'"):
        rows_to_measure(per_set, "stem_mcqa")


def test_a_mix_keeps_the_rows_its_domains_kept_and_passes_unmeasured_domains():
    math = rl_table(["1+1", "2+2", "3+3"], prefix="m")
    tools = rl_table(["call f"], prefix="t", domain=["tool_calling"], agent_ref=["tool_call"])
    results = pl.DataFrame({"uuid": ["m0", "m1", "m2"], "pass_rate_total": [4, 4, 4], "pass_rate_passed": [4, 2, 0]})
    kept_math, dropped = apply_pass_rates(math, results, 0.0, 1.0)
    mix = pl.concat([tools, math.reverse()])  # build's order: domain blocks
    kept, unmeasured = filter_mix(mix, kept_math, ["math", "code"])
    assert kept["uuid"].to_list() == ["t0", "m1"] and unmeasured == ["tool_calling"]
    assert kept["pass_rate"].to_list() == [None, 0.5] and kept.columns == mix.columns
    assert sorted(dropped["reason"]) == ["too_easy: 4/4", "too_hard: 0/4"]

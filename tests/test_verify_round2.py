"""Issue #33, second round of verifier faults: the long-context answer format, and (with real
rows where ``data/sets/rl`` is present, or ``$CASCADE_RL_SETS`` points at one) the honest answers
of the real long-context and RLHF rows."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import pytest

from corpora.rl.long_context import make_task
from validators.verifiers import verify
from validators.verifiers.long_context import answer_format

REPO = Path(__file__).resolve().parents[1]
SETS = Path(os.environ.get("CASCADE_RL_SETS", REPO / "data" / "sets" / "rl"))
HAY = [f"Paragraph {i}: VAR-free filler text about the weather in town {i}." for i in range(40)]


def real_rows(name: str) -> list[dict]:
    """Every row of the real RL set ``name`` (train and validation); skips when it is absent."""
    pl = pytest.importorskip("polars")
    files = [SETS / name / f"{split}.parquet" for split in ("train", "validation")]
    if not all(f.exists() for f in files):
        pytest.skip(f"real set {SETS / name} not present")
    return [r for f in files for r in pl.read_parquet(f).iter_rows(named=True)]


def lc_row(kind: str, seed: int = 0, with_prompt: bool = True) -> dict:
    task = make_task(kind, HAY, random.Random(seed))
    return {"uuid": f"lc-{kind}", "agent_ref": "long_context",
            "ground_truth": json.dumps({"answers": task["answers"], "match": "all"}),
            "metadata": json.dumps({"kind": kind}),
            "responses_create_params": {"input": [{"role": "user", "content": task["prompt"]}] if with_prompt else []}}


def _gold(row: dict) -> list[str]:
    return json.loads(row["ground_truth"])["answers"]


@pytest.mark.parametrize("with_prompt", [True, False])
def test_long_context_multi_hop_is_read_in_the_prompts_space_separated_format(with_prompt):
    row = lc_row("multi_hop", with_prompt=with_prompt)
    a, b, c = _gold(row)
    assert answer_format(row) == "spaces"
    for honest in (f"{a} {b} {c}", f"{c} {a} {b}", rf"\boxed{{{a} {b} {c}}}", f"{a}, {b}, {c}.", f"{a}\n{b}\n{c}"):
        verdict = verify(honest, row)
        assert (verdict.reward, verdict.passed) == (1.0, True), honest
    padded = verify(f"{a} {b} {c} QWERT ZXCVB", row)                     # every candidate listed: extras cost
    assert (padded.reward, padded.passed) == (0.0, False) and padded.details["overlap"] == pytest.approx(3 / 5)
    assert verify(" ".join([a, b, c] + [f"X{k:04d}" for k in range(97)]), row).reward == 0.0
    assert verify(f"{a} {b}", row).details["overlap"] == pytest.approx(2 / 3)  # the first hops alone: 0
    assert verify(f"{a} {b}", row).reward == verify(f"{a} {b} QWERT", row).reward == 0.0
    assert verify(f"{a},{b},{c}", row).reward == 0.0                      # not the asked format: one item


@pytest.mark.parametrize("with_prompt", [True, False])
def test_long_context_needle_is_one_item_so_candidate_lists_score_zero(with_prompt):
    row = lc_row("needle", with_prompt=with_prompt)
    (value,) = _gold(row)
    assert answer_format(row) == "single"
    for honest in (value, f"{value}.", rf"\boxed{{{value}}}"):
        assert verify(honest, row).reward == 1.0, honest
    for attack in (f"{value}, 1234567, 7654321", f"{value} 1234567", f"{value}\n1234567", f"{value}; 1234567"):
        assert verify(attack, row).reward == 0.0, attack


def test_long_context_format_from_the_prompt_wins_and_fallbacks_stay_documented():
    row = lc_row("multi_hop")
    a, b, c = _gold(row)
    prompt = row["responses_create_params"]["input"][0]["content"].replace(
        "separated by spaces", "separated by commas")
    commas = dict(row, responses_create_params={"input": [{"role": "user", "content": prompt}]})
    assert answer_format(commas) == "commas"
    assert verify(f"{a}, {b}, {c}", commas).reward == 1.0
    assert verify(f"{a} {b} {c}", commas).reward == 0.0
    bare = {"uuid": "l", "agent_ref": "long_context", "ground_truth": json.dumps({"answers": ["42", "7"], "match": "all"})}
    assert answer_format(bare) is None
    assert verify("42, 7", bare).reward == verify("42 7", bare).reward == 1.0
    padded = verify("42, 7, 8, 9", bare)
    assert padded.reward == 0.0 and padded.details["overlap"] == 0.5


def test_real_long_context_rows_honest_answer_scores_one_and_padding_does_not_pay():
    rows = [r for r in real_rows("long_context") if r["agent_ref"] == "long_context"]
    assert rows
    for row in rows:
        gold = _gold(row)
        kind = json.loads(row["metadata"])["kind"]
        assert answer_format(row) == {"multi_hop": "spaces", "needle": "single"}[kind]
        assert verify(" ".join(gold), row).reward == 1.0
        assert verify(rf"\boxed{{{' '.join(gold)}}}", row).reward == 1.0
        padded = verify(", ".join(gold + ["QWERT", "1234567"]), row).reward
        assert padded == 0.0


# --- math: sizes bounded before math-verify / sympy, big integers graded exactly -------------------

BIG = "".join(str((7 * k + 3) % 10) for k in range(6000))          # a 6000-digit integer


def _timed(response: str, gold: str) -> tuple[float, float]:
    from benchmarks.attacks import math_row

    start = time.perf_counter()
    reward = verify(response, math_row(gold)).reward
    return reward, time.perf_counter() - start


@pytest.fixture(scope="module")
def warm_math():
    _timed(r"\boxed{2}", "2")                                          # imports math-verify / sympy once


@pytest.mark.parametrize("response,gold,reward", [
    (rf"\boxed{{{BIG}}}", BIG, 1.0),
    (rf"So the count is {BIG}.", BIG, 1.0),
    (rf"\boxed{{{BIG[:-1]}{(int(BIG[-1]) + 1) % 10}}}", BIG, 0.0),       # last digit off
    (rf"\boxed{{{BIG[1:]}}}", BIG, 0.0),                               # one digit short
    (r"\boxed{7}", BIG, 0.0),
    (rf"\boxed{{{BIG}}}", "7", 0.0),
    (r"\boxed{2^{20000}}", "2^{20000}", 1.0),
    (r"\boxed{10^{10^{10}}}", "7", 0.0),                               # power towers
    (r"\boxed{9^{9^{9^{9}}}}", "7", 0.0),
    (r"\boxed{2^{2^{2^{2^{2}}}}}", "7", 0.0),
    (r"\boxed{\sqrt{2}^{10^{9}}}", "7", 0.0),
    (r"\boxed{2^{100000000}}", "7", 0.0),
    (r"\boxed{1e999999999}", "7", 0.0),                                # e-notation past any decimal
    (r"\boxed{1e-999999999}", "7", 0.0),
    ("The answer is 1e99999999999999999999", "7", 0.0),
    ("so 2**99999999", "7", 0.0),
    (r"\boxed{(10^{6})!}", "7", 0.0),
    (r"\boxed{\binom{100000}{50000}}", "7", 0.0),
    (r"\boxed{(x+1)^{1000}}", "(x+1)^{999}", 0.0),
    (r"\boxed{10^{10^{10}}}", "10^{10^{10}}", 1.0),                    # too big to evaluate: the same text only
    (r"\boxed{1.5e400}", "1.5\\times 10^{400}", 1.0),
    (r"\boxed{2^{-60}}", "2^{-60}", 1.0),
])
def test_math_grades_every_size_in_under_a_second(warm_math, response, gold, reward):
    got, seconds = _timed(response, gold)
    assert got == reward
    assert seconds < 1.0, f"{seconds:.2f}s"


def test_math_restores_the_int_digit_limit():
    before = sys.get_int_max_str_digits()
    _timed(rf"\boxed{{{BIG}}}", BIG)
    assert sys.get_int_max_str_digits() == before


@pytest.mark.parametrize("text,problem", [
    ("10^{10^{10}}", "power"), ("2**99999999", "power"), ("(x+1)^{1000}", "huge exponent"),
    ("(10^{6})!", "factorial"), ("\\binom{100000}{50000}", "binomial"), ("7" * 10_001, "digits"),
    ("2^{2023}", None), ("x^{2}+3x-4", None), ("\\left(\\frac{3}{4}\\right)^{2}", None), ("5!", None),
    ("e^{i\\pi}", None), ("1.5\\times 10^{-18}", None), ("a^{n^{2}}", None), ("(x+1)^{99}", None),
])
def test_size_problem_flags_only_huge_work(text, problem):
    from validators.verifiers.math import size_problem

    found = size_problem(text)
    assert (found is None) if problem is None else (problem in found)


def test_real_math_golds_are_never_too_large_to_grade():
    from validators.verifiers.math import size_problem

    rows = [r for r in real_rows("math") if r["agent_ref"] == "math"]
    assert rows
    assert [g for r in rows if size_problem(g := json.loads(r["ground_truth"])["answer"])] == []


def test_real_rlhf_conversations_are_not_taken_for_injections():
    """Every user and assistant turn of the real RLHF rows (no reference responses are stored):
    none addresses the judge (measured: 0 of 2027; 0 of 64,047 SFT assistant turns too)."""
    from validators.verifiers.genrm import addresses_judge

    turns = [m["content"] or "" for r in real_rows("rlhf") for m in r["responses_create_params"]["input"]]
    assert len(turns) > 1000
    assert [t[:80] for t in turns if addresses_judge(t)] == []

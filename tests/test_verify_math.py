"""Math verifiers: VER-MATH-01 (fraction/decimal/mixed-number equivalence), VER-MATH-02 (last balanced box),
percent and unit conventions, reasoning-gym scoring."""

from __future__ import annotations

import json

import pytest

from common.answers import last_boxed
from tests.handed import handed_case
from validators.verifiers import check_row, verify


def _row(answer: str) -> dict:
    return {"uuid": "m", "agent_ref": "math", "ground_truth": json.dumps({"answer": answer})}


def test_ver_math_01_fraction_decimal_and_mixed_numbers():
    case = handed_case("VER-MATH-01")
    got = [verify(p["pred"], _row(p["gold"])).passed for p in case["input"]["pairs"]]
    assert got == case["expected"]["equivalent"]


@pytest.mark.parametrize("gold,pred,same", [
    (r"50\%", "50", True), (r"50\%", "50 percent", True), (r"50\%", "0.5", False),   # percent convention
    (r"10\text{ cm}", "10", True), (r"\$18.90", "18.90", True), (r"\dfrac{1}{2}", "0.5", True),
    (r"\frac{3}{14}", r"\frac{31}{4}", False), ("x=3", "3", True), (r"\sqrt{2}", "1.414", False),
])
def test_math_conventions(gold, pred, same):
    assert verify(rf"The answer is $\boxed{{{pred}}}$.", _row(gold)).passed is same


@pytest.mark.parametrize("answer,gold,same", [
    ("The answer is 3e5", "300000", True), ("The answer is 3e5", "3", False), ("The answer is 3e5", "5", False),
    ("It is 2.5e-3", "0.0025", True), ("It is 2.5e-3", "2.5", False), ("x = 4e2", "400", True),
    ("1e7", "1e7", True), ("The answer is $3e5$", "300000", True),
])
def test_an_unboxed_number_in_e_notation_is_the_whole_number(answer, gold, same):
    assert verify(answer, _row(gold)).passed is same


def test_ver_math_02_last_balanced_box():
    case = handed_case("VER-MATH-02")
    items = case["input"]["items"]
    assert [last_boxed(it["response"]) for it in items] == case["expected"]["extracted"]
    assert [verify(it["response"], _row(it["gold"])).passed for it in items] == case["expected"]["correct"]


def test_reasoning_is_stripped_and_unclosed_think_fails():
    row = _row("7")
    assert verify(r"<think>maybe \boxed{3}</think>So \boxed{7}", row).reward == 1.0
    assert verify(r"<think>\boxed{7}</think>So \boxed{3}", row).reward == 0.0
    unclosed = verify(r"<think>it is \boxed{7}", row)
    assert (unclosed.reward, unclosed.reason) == (0.0, "unclosed <think> block: no final answer")


def test_math_check_row_rejects_missing_answer():
    with pytest.raises(ValueError, match="ground_truth lacks answer"):
        check_row({"uuid": "bad", "agent_ref": "math", "ground_truth": "{}"})


def test_reasoning_gym_scores_with_the_generator():
    import reasoning_gym

    entry = reasoning_gym.create_dataset("basic_arithmetic", size=4, seed=42)[3]
    gt = {"answer": entry["answer"], "generator": "basic_arithmetic", "seed": 42, "index": 3, "version": "0.1.25"}
    row = {"uuid": "rg", "agent_ref": "reasoning_gym", "ground_truth": json.dumps(gt)}
    check_row(row)
    assert verify(f"<answer>{entry['answer']}</answer>", row).reward == 1.0
    assert verify(rf"\boxed{{{entry['answer']}}}", row).reward == 1.0
    assert verify("<answer>-123456789</answer>", row).reward == 0.0
    stale = dict(row, ground_truth=json.dumps(dict(gt, answer="not the rebuilt answer")))
    with pytest.raises(ValueError, match="rebuilt basic_arithmetic"):
        verify(f"<answer>{entry['answer']}</answer>", stale)
    with pytest.raises(ValueError, match="version"):
        check_row(dict(row, ground_truth=json.dumps(dict(gt, version="0.0.1"))))

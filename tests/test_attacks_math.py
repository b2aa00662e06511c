"""Math verifier under attack: hedged boxes, candidate lists, intervals, answers hidden in reasoning,
too few significant digits, neighbouring powers of two; and the relative-equality rules (tiny and
huge magnitudes, correctly rounded decimals, scientific notation)."""

from __future__ import annotations

import pytest

from benchmarks.attacks import ANSWER_ATTACKS, math_row
from validators.verifiers import verify
from validators.verifiers.math import scientific_to_latex

ATTACKS = ANSWER_ATTACKS["math"]


@pytest.mark.parametrize("name,response,row", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_scores_zero(name, response, row):
    assert verify(response, row).reward == 0.0


@pytest.mark.parametrize("gold", ["5", "7", "8"])
def test_several_boxes_earn_exactly_what_the_last_alone_earns(gold):
    hedge = verify(r"\boxed{5} or \boxed{7} or \boxed{8}", math_row(gold)).reward
    assert hedge == verify(r"\boxed{8}", math_row(gold)).reward == (1.0 if gold == "8" else 0.0)


@pytest.mark.parametrize("gold,pred,equal", [
    ("2^{-60}", "2^{-59}", False),                     # math-verify alone said equal (absolute rounding)
    ("2^{-60}", "8.673617379884035e-19", True),        # correctly rounded, 16 digits
    ("2^{-60}", "8.67362e-19", True),                  # 6 digits
    ("2^{-60}", "8.6736e-19", False),                  # 5 digits of a value with more
    ("1.5\\times 10^{-18}", "1.5e-18", True),          # scientific notation read as a number
    ("1.5\\times 10^{-18}", "1.6E-18", False),
    ("10^{20}", "1e20", True),
    ("10^{20}", "100000000000000000001", False),       # exact integers stay exact at any size
    ("\\frac{1}{3}", "0.333333", True),
    ("\\frac{1}{3}", "0.33", False),
    ("1000", "1.0e3", True),
    ("12", "1e1", False),
    ("3.14", "3.14159", True),                          # a gold given to 3 digits: the prediction rounds to it
    ("\\pi", "3.14159", True),
    ("\\pi", "3.14", False),
    ("0", "1e-9", False),
    ("0.5", "\\frac{1}{2}", True),
    ("50\\%", "0.5", False),                            # percent convention unchanged (module doc)
])
def test_numbers_compare_relatively(gold, pred, equal):
    assert verify(rf"\boxed{{{pred}}}", math_row(gold)).reward == float(equal)


def test_scientific_notation_rewrite_leaves_words_and_identifiers_alone():
    assert scientific_to_latex("x = 2.5e-3 and 1E6") == r"x = 2.5\times 10^{-3} and 1\times 10^{6}"
    assert scientific_to_latex("e2e test, 3e, abc1e5, 2.e5x") == "e2e test, 3e, abc1e5, 2.e5x"

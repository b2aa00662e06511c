"""Instruction-following verifier under attack: every constrained answer at once, empty or
whitespace answers that satisfy "no commas"/"lowercase" vacuously, reasoning-only responses."""

from __future__ import annotations

import pytest

from benchmarks.attacks import ANSWER_ATTACKS, NO_COMMA_LOWER, YES_NO
from validators.verifiers import verify

ATTACKS = ANSWER_ATTACKS["instruction_following"]


@pytest.mark.parametrize("name,response,row", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_scores_zero(name, response, row):
    assert verify(response, row).reward == 0.0


def test_honest_answers_still_pass():
    assert verify("My answer is maybe.", YES_NO).reward == 1.0
    assert verify("<think>Plan, then write.</think>the sky is blue because of rayleigh scattering",
                  NO_COMMA_LOWER).reward == 1.0

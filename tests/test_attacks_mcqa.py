"""Multiple-choice verifier under attack: every option cued or boxed, glued letters, either/or,
answers hidden in reasoning, every option's text; a hedge never earns more than its last choice."""

from __future__ import annotations

import pytest

from benchmarks.attacks import ANSWER_ATTACKS, mcq_row
from validators.verifiers import verify

ATTACKS = ANSWER_ATTACKS["mcqa"]


@pytest.mark.parametrize("name,response,row", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_scores_zero(name, response, row):
    assert verify(response, row).reward == 0.0


@pytest.mark.parametrize("gold", "ABCD")
def test_listing_every_option_earns_only_its_last_choice(gold):
    for hedge in ("Answer: A\nAnswer: B\nAnswer: C\nAnswer: D", r"\boxed{A}\boxed{B}\boxed{C}\boxed{D}"):
        assert verify(hedge, mcq_row(gold)).reward == verify("Answer: D", mcq_row(gold)).reward
    assert verify(f"The answer is {gold}.", mcq_row(gold)).reward == 1.0

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
def test_listing_every_option_is_a_hedge_and_scores_zero(gold):
    other = "B" if gold == "A" else "A"
    for hedge in ("Answer: A\nAnswer: B\nAnswer: C\nAnswer: D", r"\boxed{A}\boxed{B}\boxed{C}\boxed{D}",
                  f"The answer is {other} or {gold}.", rf"\boxed{{{other}}} or \boxed{{{gold}}}",
                  f"The answer is {gold}, {other} or D.", "Answer: A/B/C/D"):
        verdict = verify(hedge, mcq_row(gold))
        assert (verdict.reward, verdict.reason.startswith("hedged")) == (0.0, True), hedge
    assert verify(f"The answer is {gold}.", mcq_row(gold)).reward == 1.0
    assert verify(rf"\boxed{{{gold}}} ... so \boxed{{{gold}}}", mcq_row(gold)).reward == 1.0  # one letter twice


@pytest.mark.parametrize("response,gold", [
    (r"\boxed{B}. Because Apples are red, B fits.", "B"),
    ("The answer is \\boxed{C}\nA note: Apples, Bananas and Dogs are not involved.", "C"),
    (r"\boxed{C}. Answer A is a tempting trap. Done.", "C"),
    (r"\boxed{A}. Because Bob Could Drive", "A"),
    (r"\boxed{\text{(D)}}. Also see Appendix B.", "D"),
    (r"So \boxed{B} is it. Correct option is C? No: B.", "B"),          # the box wins over later prose cues
])
def test_the_boxed_letter_wins_over_later_words(response, gold):
    for letter in "ABCD":
        assert verify(response, mcq_row(letter)).reward == float(letter == gold), (response, letter)

"""Tool-call verifier under attack: every tool called, a call repeated, arguments sprayed or given as
lists of alternatives, calls hidden in reasoning, a call where none is wanted."""

from __future__ import annotations

import pytest

from benchmarks.attacks import ANSWER_ATTACKS, WEATHER, call_text
from validators.verifiers import verify

ATTACKS = ANSWER_ATTACKS["tool_call"]


@pytest.mark.parametrize("name,response,row", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_scores_zero(name, response, row):
    assert verify(response, row).reward == 0.0


def test_the_honest_call_passes():
    assert verify(call_text("get_weather", city="Oslo"), WEATHER).reward == 1.0
    assert verify(call_text("get_weather", city="oslo", unit="celsius"), WEATHER).reward == 1.0

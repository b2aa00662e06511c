"""Structured-output verifier under attack: objects padded with extra keys (top level and nested),
two JSON values, arrays of candidates, JSON inside prose; closing keeps allOf and open schemas."""

from __future__ import annotations

import json

import pytest

from benchmarks.attacks import ANSWER_ATTACKS, PERSON, so_row
from validators.verifiers import verify
from validators.verifiers.structured_output import closed

ATTACKS = ANSWER_ATTACKS["structured_output"]


@pytest.mark.parametrize("name,response,row", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_scores_zero(name, response, row):
    assert verify(response, row).reward == 0.0


def test_honest_answers_pass_and_declared_openness_is_kept():
    assert verify('{"name": "Ada", "age": 36}', so_row(PERSON)).reward == 1.0
    open_schema = dict(PERSON, additionalProperties={"type": "string"})
    assert verify('{"name": "Ada", "age": 36, "note": "x"}', so_row(open_schema)).reward == 1.0
    loose = dict(so_row(PERSON), metadata=json.dumps({"allow_extra_keys": True}))
    assert verify('{"name": "Ada", "age": 36, "id": 1}', loose).reward == 1.0
    both = {"allOf": [PERSON, {"type": "object", "properties": {"email": {"type": "string"}}}]}
    assert closed(both) == both  # closing one allOf branch would reject the other's keys
    assert verify('{"name": "Ada", "age": 36, "email": "a@b"}', so_row(both)).reward == 1.0

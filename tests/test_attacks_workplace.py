"""Workplace verifier (NeMo-Gym's workbench rows) under attack: doing nothing, reading only, an extra or
repeated write, writes sprayed over every email, extra arguments, a case change where the workbench
compares case, calls hidden in reasoning, a tool the row does not offer, other call syntaxes."""

from __future__ import annotations

import json

import pytest

from benchmarks.attacks import ANSWER_ATTACKS, DONE, REPLY, WORK_DONE, WORK_REPLY, call_text, workplace_row
from validators.verifiers import check_row, verify

ATTACKS = ANSWER_ATTACKS["workplace"]


@pytest.mark.parametrize("name,response,row", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_scores_zero(name, response, row):
    assert verify(response, row).reward == 0.0


def test_what_the_workbench_would_pay_passes():
    assert verify(call_text("email_search_emails", query="report") + call_text("email_reply_email", **REPLY),
                  WORK_REPLY).reward == 1.0
    assert verify(call_text("email_reply_email", **REPLY), WORK_REPLY).reward == 1.0  # reads are free
    shouted = {**REPLY, "body": REPLY["body"].upper()}  # NeMo-Gym lower-cases most columns before comparing
    assert verify(call_text("email_reply_email", **shouted), WORK_REPLY).reward == 1.0
    encoded = json.dumps(json.dumps(DONE))  # arguments as a JSON string, as OpenAI-style calls carry them
    as_string = f'<tool_call>{{"name": "project_management_update_task", "arguments": {encoded}}}</tool_call>'
    assert verify(as_string, WORK_DONE).reward == 1.0


def test_a_ground_truth_that_writes_nothing_cannot_train():
    reads_only = workplace_row([{"name": "email_search_emails", "arguments": {"query": "report"}}])
    with pytest.raises(ValueError, match="changes no state"):
        check_row(reads_only)
    assert verify("Nothing to do.", reads_only).reward == 1.0  # what NeMo-Gym pays: why such rows are refused
    with pytest.raises(ValueError, match="not among the row's tools"):
        check_row(workplace_row([{"name": "hr_fire_employee", "arguments": {}}]))

"""Multiple-choice (VER-MCQ-01) and tool-call (VER-TOOL-01) verifiers: strict extraction, BFCL matching."""

from __future__ import annotations

import json

import pytest

from tests.handed import handed_case
from validators.verifiers import check_row, verify
from validators.verifiers.mcqa import extract_choice
from validators.verifiers.tool_call import parse_calls


def _mcq_row(letters: str, gold: str, **meta) -> dict:
    return {"uuid": "q", "agent_ref": "mcqa", "metadata": json.dumps(meta),
            "ground_truth": json.dumps({"answer": gold, "options": {k: f"option {k}" for k in letters}})}


def test_ver_mcq_01_only_cued_letters_are_extracted():
    case = handed_case("VER-MCQ-01")
    cases = case["input"]["cases"]
    assert [extract_choice(c["response"], c["options"]) for c in cases] == case["expected"]["extracted"]
    fifth = cases[4]
    assert verify(fifth["response"], _mcq_row(fifth["options"], fifth["gold"])).reward == case["expected"]["case5_score"]


def test_mcq_boxed_regex_and_lenient_mode():
    regex = r"\\boxed\{\s*(?:\\text\{\s*)?([ABCD])\s*\}?\s*\}"
    row = _mcq_row("ABCD", "C", output_regex=regex)
    assert verify(r"I pick A first, but \boxed{\text{C}}", row).reward == 1.0
    assert verify(r"<think>\boxed{C}</think> \boxed{B}", row).reward == 0.0
    assert verify("C", row).reward == 1.0
    assert verify("I think it is option C", row).reward == 0.0                     # no cue: strict gives nothing
    assert verify("I think it is option C", _mcq_row("ABCD", "C", lenient=True)).reward == 0.0
    lenient = _mcq_row("ABCD", "C", mcqa_lenient=True)
    assert verify("It must be option c, clearly.", lenient).reward == 1.0           # option text match
    assert verify("Between (B) and (C) I go with (C)", lenient).reward == 1.0      # last parenthesised letter
    with pytest.raises(ValueError, match="not an option key"):
        check_row(dict(row, ground_truth=json.dumps({"answer": "E", "options": {"A": "a", "B": "b"}})))


def _tool_row(calls: list, tools: list[str]) -> dict:
    return {"uuid": "t", "agent_ref": "tool_call", "ground_truth": json.dumps({"calls": calls}),
            "responses_create_params": {"input": [], "tools": json.dumps(
                [{"type": "function", "function": {"name": n, "parameters": {}}} for n in tools])}}


def test_ver_tool_01_arguments_as_dict_or_json_string_never_raise():
    case = handed_case("VER-TOOL-01")
    exp = case["input"]["expected_call"]
    row = _tool_row([{exp["name"]: {k: [v] for k, v in exp["arguments"].items()}}], [exp["name"], "get_forecast"])
    check_row(row)
    got = [verify(f"<tool_call>{json.dumps(call)}</tool_call>", row).passed for call in case["input"]["predicted_calls"]]
    assert got == case["expected"]["match"]
    bare = [verify(json.dumps(call), row).passed for call in case["input"]["predicted_calls"]]
    assert bare == case["expected"]["match"]


def test_parallel_optional_nested_and_irrelevance():
    calls = [{"area": {"w": [2], "h": [3, 3.0], "unit": ["cm", ""]}}, {"area": {"w": [5], "h": [1]}}]
    row = _tool_row(calls, ["area"])
    swapped = ('<tool_call>{"name": "area", "arguments": {"w": 5, "h": 1}}</tool_call>'
               '<tool_call>{"name": "area", "arguments": {"w": 2, "h": 3, "unit": "CM"}}</tool_call>')
    assert verify(swapped, row).reward == 1.0                                       # order-insensitive, BFCL strings
    one = '<tool_call>{"name": "area", "arguments": {"w": 5, "h": 1}}</tool_call>'
    assert verify(one, row).reward == 0.0
    extra = swapped.replace('"h": 1}', '"h": 1, "x": 0}')
    assert verify(extra, row).reward == 0.0                                          # unexpected argument
    nested = _tool_row([{"db.query": {"where": [{"field": ["age"], "op": [">", "gt"]}]}}], ["db.query"])
    assert verify('[{"name": "db_query", "arguments": {"where": {"field": "age", "op": "gt"}}}]', nested).reward == 1.0
    irrelevant = _tool_row([], ["area"])
    assert verify("I cannot do that with these tools.", irrelevant).reward == 1.0
    assert verify(one, irrelevant).reward == 0.0
    assert verify("<tool_call>{not json</tool_call>", irrelevant).reward == 0.0
    assert parse_calls("<tool_call>[1, 2]</tool_call>")[1] == ["call without a string 'name'"] * 2


def test_tool_check_row_rejects_unknown_function_and_empty_answers():
    with pytest.raises(ValueError, match="not among the row's tools"):
        check_row(_tool_row([{"other": {"a": [1]}}], ["area"]))
    with pytest.raises(ValueError, match="no acceptable value for a"):
        check_row(_tool_row([{"area": {"a": []}}], ["area"]))

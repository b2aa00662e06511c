"""Tool-calling verifier (``agent_ref`` ``tool_call``), BFCL-style.

ground_truth ``{"calls": [{function name: {argument: [acceptable values]}}, ...]}`` (BFCL's
possible-answer format); ``[]`` means no call is expected (irrelevance items). The tools offered
are in ``responses_create_params.tools``.

Calls in a response (:func:`parse_calls`, on the final answer):

* Hermes/Qwen blocks ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (each block an
  object or a list of objects), else
* the whole final answer (optionally inside one ```json fence) as a JSON object or list of calls.

A call is ``{"name", "arguments"}`` (``"parameters"`` is accepted for ``"arguments"``) or the OpenAI
form ``{"function": {"name", "arguments"}}``; ``arguments`` may be an object or a JSON string of an
object. Anything else inside a tool-call block (bad JSON, a list or scalar as arguments) makes
the call malformed: reward 0, never an exception.

Matching (:func:`call_matches`, BFCL's AST checker rules): the name equals the expected one (or
equals it with ``.`` replaced by ``_``, the form OpenAI-style tool names need); no argument beyond
the expected ones; every expected argument present unless ``""`` is among its acceptable values
(optional); a value matches an acceptable value with strict types (``"3" != 3``, ``True != 1``;
an int is accepted for a float), strings after BFCL's normalisation (lower-case, without spaces
and ``,./-_*^``), lists element-wise, nested objects key by key (BFCL gives each key a list of
acceptable values). Parallel calls: the predicted calls must match the expected ones one to one,
in any order. Binary reward. Several answers: every call in the final answer counts, so calling
every tool (or one tool many times) fails a row that expects fewer calls, and a row that expects
no call (irrelevance) fails any call: a parsed one, or one of the row's tools written in another
syntax (``name(...)``, ``<function=name>``, ``"name": "name"``); it pays a reply of at least
``MIN_REPLY_WORDS`` words (an empty answer is not a refusal).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from common.answers import strict_json
from validators.verifiers.registry import (
    Verdict,
    Verifier,
    fail,
    ground_truth,
)

MIN_REPLY_WORDS = 3  # a row expecting no call pays a reply in words, not an empty answer
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n?```\s*$", re.S)


def _one_call(obj: Any) -> tuple[str, dict[str, Any]] | str:
    """``(name, arguments)`` or a string saying why ``obj`` is not a call."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return "call without a string 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = strict_json(args)
        except ValueError:
            return f"{obj['name']}: arguments are not valid JSON"
    if not isinstance(args, dict):
        return f"{obj['name']}: arguments are a {type(args).__name__}, not an object"
    return obj["name"], args


def parse_calls(answer: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The tool calls in ``answer`` and the reasons of malformed ones (see the module doc)."""
    blocks = _BLOCK.findall(answer)
    if blocks:
        payloads = blocks
    else:
        fenced = _FENCE.match(answer)
        text = (fenced.group(1) if fenced else answer).strip()
        if not text.startswith(("{", "[")):
            return [], []
        payloads = [text]
    calls, malformed = [], []
    for payload in payloads:
        try:
            obj = strict_json(payload)
        except ValueError as exc:
            if blocks:
                malformed.append(f"tool call is not valid JSON: {getattr(exc, 'msg', exc)}")
            continue  # a bare answer that is not JSON is prose, not a call
        for item in obj if isinstance(obj, list) else [obj]:
            call = _one_call(item)
            (malformed.append(call) if isinstance(call, str) else calls.append(call))
    return calls, malformed


def tool_names(row: dict[str, Any]) -> set[str]:
    """The function names of the row's ``responses_create_params.tools`` (OpenAI or bare form)."""
    params = row.get("responses_create_params") or {}
    tools = params.get("tools", "[]")
    tools = json.loads(tools) if isinstance(tools, str) else (tools or [])
    return {(t.get("function") or t).get("name") for t in tools if isinstance(t, dict)}


def _call_syntax(name: str) -> re.Pattern[str]:
    """A call of tool ``name`` written any other way: ``name(``, ``<function=name``, ``"name": "name"``."""
    n = re.escape(name)
    return re.compile(rf"(?<![\w.]){n}\s*\(|<function\s*=\s*[\"']?{n}|[\"']name[\"']\s*:\s*[\"']{n}[\"']")


def _std(s: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def value_matches(value: Any, acceptable: Any) -> bool:
    """Whether one argument ``value`` matches one ``acceptable`` value (see the module doc)."""
    if isinstance(acceptable, bool) or isinstance(value, bool):
        return type(value) is type(acceptable) and value == acceptable
    if isinstance(acceptable, float):
        return isinstance(value, (int, float)) and math.isclose(value, acceptable, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(acceptable, int):
        return type(value) is int and value == acceptable
    if isinstance(acceptable, str):
        return isinstance(value, str) and _std(value) == _std(acceptable)
    if isinstance(acceptable, list):
        return isinstance(value, list) and len(value) == len(acceptable) and all(
            value_matches(v, a) for v, a in zip(value, acceptable))
    if isinstance(acceptable, dict):  # BFCL: per-key lists of acceptable values; deeper: literal objects
        if not isinstance(value, dict):
            return False
        if all(isinstance(a, list) for a in acceptable.values()):
            return args_match(value, acceptable)
        return value.keys() == acceptable.keys() and all(value_matches(value[k], a) for k, a in acceptable.items())
    return value is None and acceptable is None


def args_match(args: dict[str, Any], expected: dict[str, list[Any]]) -> bool:
    """``args`` against BFCL's ``{argument: [acceptable values]}`` (``""`` = may be omitted)."""
    if set(args) - set(expected):
        return False
    for key, accepted in expected.items():
        accepted = accepted if isinstance(accepted, list) else [accepted]
        if key not in args:
            if "" not in accepted:
                return False
        elif not any(value_matches(args[key], a) for a in accepted):
            return False
    return True


def call_matches(call: tuple[str, dict[str, Any]], expected: dict[str, dict[str, list[Any]]]) -> bool:
    """Whether ``(name, arguments)`` matches one BFCL expected call ``{name: {arg: [values]}}``."""
    (exp_name, exp_args), = expected.items()
    name, args = call
    return name in (exp_name, exp_name.replace(".", "_")) and args_match(args, exp_args)


def _perfect_matching(calls: list[Any], expected: list[Any]) -> bool:
    ok = [[call_matches(c, e) for e in expected] for c in calls]
    owner: dict[int, int] = {}

    def augment(i: int, seen: set[int]) -> bool:
        for j, hit in enumerate(ok[i]):
            if hit and j not in seen:
                seen.add(j)
                if j not in owner or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return len(calls) == len(expected) and all(augment(i, set()) for i in range(len(calls)))


class ToolCallVerifier(Verifier):
    """BFCL-style call matching (see the module doc)."""

    sft_domain = "conversational_agent"

    def check(self, row: dict[str, Any]) -> None:
        calls = ground_truth(row, "calls")["calls"]
        uid = row.get("uuid")
        if not isinstance(calls, list):
            raise ValueError(f"row {uid!r}: ground_truth.calls must be a list")
        names = tool_names(row)
        for i, call in enumerate(calls):
            if not (isinstance(call, dict) and len(call) == 1 and isinstance(next(iter(call.values())), dict)):
                raise ValueError(f"row {uid!r}: ground_truth.calls[{i}] must be {{name: {{arg: [values]}}}}")
            name, args = next(iter(call.items()))
            if name not in names:
                raise ValueError(f"row {uid!r}: ground_truth.calls[{i}] calls {name!r}, not among the row's tools")
            if not all(isinstance(accepted, list) for accepted in args.values()):
                raise ValueError(f"row {uid!r}: ground_truth.calls[{i}].{name}: each argument maps to a list of "
                                 f"acceptable values")
            empty = [a for a, accepted in args.items() if accepted == []]
            if empty:
                raise ValueError(f"row {uid!r}: ground_truth.calls[{i}].{name}: no acceptable value for "
                                 f"{', '.join(empty)} (no response can match)")

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        expected = ground_truth(row, "calls")["calls"]
        calls, malformed = parse_calls(answer)
        details = {"calls": [{"name": n, "arguments": a} for n, a in calls], "malformed": malformed}
        if malformed:
            return fail(f"malformed tool call: {malformed[0]}", **details)
        if not expected:
            if calls:
                return fail(f"{len(calls)} call(s) where none was expected", **details)
            if len(answer.split()) < MIN_REPLY_WORDS:
                return fail(f"no reply: a row that expects no call expects an answer in words "
                            f"(at least {MIN_REPLY_WORDS})", **details)
            written = [n for n in tool_names(row) if n and _call_syntax(n).search(answer)]
            if written:
                return fail(f"a call of {written[0]!r} in another syntax where none was expected", **details)
            return Verdict(1.0, True, "no call, as expected", details)
        if _perfect_matching(calls, expected):
            return Verdict(1.0, True, "calls match", details)
        return fail(f"{len(calls)} call(s) do not match the {len(expected)} expected", **details)

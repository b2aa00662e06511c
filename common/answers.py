"""The response format every layer reads: reasoning, final answer, boxed answers, JSON row fields.

A response may open with reasoning in ``<think>...</think>``; the final answer is the text after the
last closing tag, verbatim (IFEval checks must see it unchanged); a ``<think>`` that never closes
means there is no final answer; a response without tags is its own answer.

>>> split_reasoning("<think>2 + 2</think>\\nIt is 4.")
('2 + 2', '\\nIt is 4.')
>>> last_boxed(r"first \\boxed{1}, then \\boxed{\\frac{2}{7}}")
'\\\\frac{2}{7}'
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def split_reasoning(response: str) -> tuple[str | None, str] | None:
    """``(reasoning, final answer)`` of ``response``, or None when a ``<think>`` block never closes.

    The reasoning is the stripped text inside the last closed think block (None when there is none
    or it is empty); the final answer is everything after the last ``</think>``, verbatim.
    """
    if THINK_CLOSE in response:
        head, answer = response.rsplit(THINK_CLOSE, 1)
        return head.rsplit(THINK_OPEN, 1)[-1].strip() or None, answer
    if THINK_OPEN in response:
        return None
    return None, response


def final_answer(response: str) -> str | None:
    """The user-visible answer of ``response`` (see :func:`split_reasoning`); None when a ``<think>``
    block never closes."""
    parts = split_reasoning(response)
    return None if parts is None else parts[1]


def has_box(text: str) -> bool:
    """Whether ``text`` holds a ``\\boxed`` / ``\\fbox`` answer, terminated or not."""
    return _BOX.search(text) is not None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed X``) in ``text``.

    Nested braces are balanced (``\\boxed{\\frac{2}{7}}`` -> ``\\frac{2}{7}``). Returns None when
    there is no box or the last box is unterminated.
    """
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    i = matches[-1].end()
    rest = text[i:]
    if not rest.lstrip(" ").startswith("{"):
        token = re.match(r"\s+([^\s$]+)", rest)
        return token.group(1) if token else None
    i += len(rest) - len(rest.lstrip(" "))
    depth = 0
    for k in range(i, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:k].strip()
    return None


def row_json(row: dict[str, Any], name: str) -> Any:
    """Field ``name`` of ``row`` decoded from JSON (a non-string value is returned as is).

    Raises:
        ValueError: naming the row's uuid and the field when it is not valid JSON.
    """
    value = row.get(name)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"row {row.get('uuid')!r}: {name} is not valid JSON: {exc}") from None
    return value


MAX_JSON_DEPTH = 64  # arrays and objects nested deeper than this are no answer (a grader's recursion bound)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):  # 1e400: a number no JSON consumer can hold, read by Python as inf
        raise ValueError(f"JSON number {literal[:40]} overflows a double")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen.add(key)
    return dict(pairs)


def strict_json(text: str) -> Any:
    """The one JSON value ``text`` holds, parsed as a grader must: RFC 8259 only (``NaN``, ``Infinity`` and
    ``-Infinity``, which Python's ``json`` accepts, are refused, and so is a number that overflows a
    double, e.g. ``1e400``, which Python reads as ``inf``), no duplicate object keys (Python keeps
    the last one, so ``{"age": "x", "age": 36}`` would pass a check the first value fails), at most
    :data:`MAX_JSON_DEPTH` levels of nesting, and integers within Python's int-to-str digit limit.

    >>> strict_json('{"a": [1, 2.5]}')
    {'a': [1, 2.5]}

    Raises:
        ValueError: saying which rule the text breaks (``json.JSONDecodeError`` for a syntax error).
    """
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float,
                           object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
            todo += [(v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return value


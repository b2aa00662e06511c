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

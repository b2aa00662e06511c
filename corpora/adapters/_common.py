"""Helpers shared by the adapters: role aliases, message building, JSON-safe values.

Not an adapter module itself (it registers nothing); every adapter module imports
what it needs from here so each rule lives once.
"""

from __future__ import annotations

import json
from typing import Any

from corpora.schema import RecordError

#: Role names seen in ShareGPT / OpenAI / NeMo-Gym data, lower-cased, mapped to canonical roles.
ROLE_ALIASES: dict[str, str] = {
    "system": "system", "developer": "system",
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bard": "assistant", "bing": "assistant", "model": "assistant",
    "tool": "tool", "function": "tool", "observation": "tool", "ipython": "tool",
}


def map_role(value: Any, where: str) -> str:
    """The canonical role for ``value`` (case- and whitespace-insensitive).

    Raises:
        RecordError: ``<where>.role: unknown role 'narrator'`` for anything not in
            :data:`ROLE_ALIASES` (never guessed as assistant).
    """
    key = value.strip().lower() if isinstance(value, str) else None
    if key not in ROLE_ALIASES:
        raise RecordError(f"{where}.role: unknown role {value!r}")
    return ROLE_ALIASES[key]


def require(record: Any, *fields: str) -> list[Any]:
    """The values of ``fields`` in the dict ``record``.

    Raises:
        RecordError: ``<field>: missing`` for the first absent or null field, or
            ``<record>: expected an object`` when the record is not a dict.
    """
    if not isinstance(record, dict):
        raise RecordError(f"<record>: expected an object, got {type(record).__name__}")
    out = []
    for f in fields:
        if record.get(f) is None:
            raise RecordError(f"{f}: missing")
        out.append(record[f])
    return out


def objects(value: Any, where: str) -> list[dict[str, Any]]:
    """``value`` when it is a list of objects (turns, messages, function schemas).

    Raises:
        RecordError: ``<where>: expected a list of objects, got str`` or
            ``<where>[2]: expected an object, got str``.
    """
    if not isinstance(value, list):
        raise RecordError(f"{where}: expected a list of objects, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise RecordError(f"{where}[{i}]: expected an object, got {type(item).__name__}")
    return value


def strings(value: Any, where: str) -> list[str]:
    """``value`` when it is a non-empty list of strings (test lists, option labels).

    Raises:
        RecordError: ``<where>: expected a non-empty list of strings``.
    """
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise RecordError(f"{where}: expected a non-empty list of strings")
    return value


def text(value: Any, where: str) -> str:
    """``value`` as message text: a string, or the concatenated text parts of an
    OpenAI / Responses content list (``[{type: text|input_text|output_text, text}]``).

    Raises:
        RecordError: for any other type or a non-text content part.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text") \
                    and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RecordError(f"{where}[{i}]: unsupported content part {kind!r}")
        return "".join(parts)
    raise RecordError(f"{where}: expected text, got {type(value).__name__}")


def user(content: str) -> list[dict[str, str]]:
    """A one-turn user prompt, the ``input`` of most RL rows."""
    return [{"role": "user", "content": content}]


def trim_trailing_user(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Drop trailing user turns so an SFT conversation ends with the assistant.

    Returns the kept messages and how many turns were dropped; callers record
    that count as ``metadata.trimmed_turns`` so the change is visible.
    """
    n = len(messages)
    while n and messages[n - 1]["role"] == "user":
        n -= 1
    return messages[:n], len(messages) - n


def jsonable(value: Any) -> Any:
    """``value`` with every non-JSON leaf (Fraction, numpy scalar, set...) turned into ``str``."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def json_value(value: Any, where: str) -> Any:
    """Decode ``value`` when it is a JSON string (Hub exports store nested fields that
    way); return other values unchanged.

    Raises:
        RecordError: when a string is not valid JSON.
    """
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{where}: not valid JSON ({exc.msg})") from None

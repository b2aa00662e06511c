"""Canonical row schemas: the SFT row and the NeMo-Gym compatible RL row.

Field names follow NVIDIA's Nemotron post-training releases
(``nvidia/Nemotron-Cascade-2-SFT-Data``: OpenAI chat ``messages``;
``nvidia/Nemotron-Cascade-2-RL-data``: NeMo-Gym ``responses_create_params`` rows).

Free-form nested JSON (tool schemas, ``ground_truth``, instruction ``kwargs``,
``metadata``) is stored as a JSON *string*: Arrow structs would pad every key
missing from one row with nulls in all others, which changes the data a user
loads back (see ``EXPORT`` in the handed cases).

Each row has a pyarrow schema (what parquet files hold) and a pydantic model
(what ingest validates against). :func:`validate_row` turns a pydantic error
into one readable :class:`RecordError` naming the field.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any, Literal

import pyarrow as pa
from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    field_validator,
    model_validator,
)

from common import plugins

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

SFT_DOMAINS: tuple[str, ...] = (
    "math", "code", "science", "chat", "instruction_following", "safety",
    "conversational_agent", "swe", "terminal_agent", "long_context",
)


def rl_domains() -> tuple[str, ...]:
    """The RL domains: the names of entry-point group ``cascade_rl.domains`` (built-ins in
    ``pyproject.toml``; a plugin adds its own), read from package metadata, sorted."""
    return tuple(plugins.names("domains"))


#: uuid5 namespace of cascade-rl rows: the same source record always gets the same uuid.
UUID_NAMESPACE = uuidlib.UUID("8a0c4d2e-53a1-4d7e-9c55-2f0e7f1d6b10")


def row_uuid(source: str, key: str) -> str:
    """The stable uuid of the row ``key`` of ``source`` (uuid5 in :data:`UUID_NAMESPACE`)."""
    return str(uuidlib.uuid5(UUID_NAMESPACE, f"{source}:{key}"))


class RecordError(ValueError):
    """A record cannot be brought into the canonical schema.

    The message names the field (``messages[2].role``) and the problem; ingest
    writes it as the reject ``reason``, after ``category`` (the rejects' group-by key:
    ``invalid record`` unless the raiser names a finer one, e.g. ``no_ground_truth``).
    """

    def __init__(self, message: str, category: str = "invalid record"):
        super().__init__(message)
        self.category = category


# ---------------------------------------------------------------- arrow schemas
TOOL_CALL_TYPE = pa.struct([
    ("id", pa.string()),
    ("type", pa.string()),
    ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
])
MESSAGE_TYPE = pa.struct([
    ("role", pa.string()),
    ("content", pa.string()),
    ("reasoning_content", pa.string()),
    ("tool_calls", pa.list_(TOOL_CALL_TYPE)),
    ("tool_call_id", pa.string()),
])

SFT_SCHEMA = pa.schema([
    ("uuid", pa.string()),
    ("messages", pa.list_(MESSAGE_TYPE)),
    ("tools", pa.string()),
    ("domain", pa.string()),
    ("source", pa.string()),
    ("source_version", pa.string()),
    ("license", pa.string()),
    ("generator", pa.string()),
    ("metadata", pa.string()),
])

RL_SCHEMA = pa.schema([
    ("uuid", pa.string()),
    ("domain", pa.string()),
    ("responses_create_params", pa.struct([("input", pa.list_(MESSAGE_TYPE)), ("tools", pa.string())])),
    ("agent_ref", pa.string()),
    ("ground_truth", pa.string()),
    ("instruction_id_list", pa.list_(pa.string())),
    ("kwargs", pa.string()),
    ("pass_rate", pa.float64()),
    ("pass_rate_total", pa.int64()),
    ("pass_rate_passed", pa.int64()),
    ("source", pa.string()),
    ("source_version", pa.string()),
    ("license", pa.string()),
    ("metadata", pa.string()),
])

SCHEMAS: dict[str, pa.Schema] = {"sft": SFT_SCHEMA, "rl": RL_SCHEMA}


# ---------------------------------------------------------------- pydantic models
def _check_json(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    try:
        json.loads(value)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{field} is not valid JSON: {exc}") from None
    return value


def _check_text(value: str | None) -> str | None:
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text is not valid UTF-8 (lone surrogate)") from None
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON object as a string

    @field_validator("arguments")
    @classmethod
    def _object(cls, v: str) -> str:
        try:
            parsed = json.loads(v)
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError("arguments must encode a JSON object")
        return v


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Role
    content: str
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    _text = field_validator("content", "reasoning_content")(_check_text)

    @model_validator(mode="after")
    def _not_empty(self) -> Message:
        if not self.content.strip() and not self.tool_calls:
            raise ValueError("empty turn (no content and no tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls on a {self.role!r} turn")
        return self


def _check_messages(messages: list[Message]) -> list[Message]:
    if not messages:
        raise ValueError("no messages")
    if not any(m.role == "user" for m in messages):
        raise ValueError("no user turn")
    return messages


class SFTRow(_Strict):
    """One supervised conversation; the last turn is the assistant's."""

    uuid: str
    messages: list[Message]
    tools: str = "[]"
    domain: Literal[SFT_DOMAINS]  # type: ignore[valid-type]
    source: str
    source_version: str
    license: str
    generator: str | None = None
    metadata: str = "{}"

    _json = field_validator("tools", "metadata")(lambda v, info: _check_json(v, info.field_name))

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: list[Message]) -> list[Message]:
        _check_messages(v)
        if v[-1].role != "assistant":
            raise ValueError(f"last turn is {v[-1].role!r}, expected 'assistant'")
        return v


class ResponsesCreateParams(_Strict):
    input: list[Message]
    tools: str = "[]"

    _json = field_validator("tools")(lambda v, info: _check_json(v, info.field_name))
    _msgs = field_validator("input")(lambda v: _check_messages(v))


class RLRow(_Strict):
    """One RL prompt in NeMo-Gym form; ``agent_ref`` names its verifier."""

    uuid: str
    domain: str  # one of rl_domains() (checked below)
    responses_create_params: ResponsesCreateParams
    agent_ref: str
    ground_truth: str = "null"
    instruction_id_list: list[str] | None = None
    kwargs: str | None = None
    pass_rate: float | None = None
    pass_rate_total: int | None = None
    pass_rate_passed: int | None = None
    source: str
    source_version: str
    license: str
    metadata: str = "{}"

    _json = field_validator("ground_truth", "kwargs", "metadata")(
        lambda v, info: _check_json(v, info.field_name))

    @field_validator("domain")
    @classmethod
    def _domain(cls, v: str) -> str:
        if v not in rl_domains():
            raise ValueError(f"unknown RL domain {v!r}; installed (entry-point group cascade_rl.domains): "
                             f"{', '.join(rl_domains())}")
        return v


MODELS: dict[str, type[BaseModel]] = {"sft": SFTRow, "rl": RLRow}


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validate_row(kind: str, row: dict[str, Any]) -> dict[str, Any]:
    """Validate ``row`` against the ``kind`` ('sft' | 'rl') model.

    Returns the row as a plain dict with every schema field present (``None``
    for optional fields), ready for ``pa.Table.from_pylist(rows, SCHEMAS[kind])``.

    Raises:
        RecordError: naming the first failing field, e.g.
            ``messages[1].role: Input should be 'system', 'user', ...``.
    """
    try:
        model = MODELS[kind].model_validate(row)
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = first["msg"].removeprefix("Value error, ")
        raise RecordError(f"{_loc(first['loc']) or '<row>'}: {msg}") from None
    return model.model_dump()

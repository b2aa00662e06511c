"""Hub adapters: NVIDIA's released SFT rows and NeMo-Gym RL rows, read with ``datasets.load_dataset``.

``nemotron_sft`` maps rows of ``nvidia/Nemotron-Cascade-2-SFT-Data`` (OpenAI chat
``messages`` with optional ``reasoning_content`` / ``tool_calls``, plus ``uuid``,
``license``, ``generator``, ``category``, ``tools``, ``metadata``);
``nemo_gym_rl`` maps rows of ``nvidia/Nemotron-Cascade-2-RL-data``
(``responses_create_params``, ``agent_ref``, ground-truth fields,
``instruction_id_list``/``kwargs``, ``pass_rate*``). Parquet and json loaders
pad struct fields with nulls and may hold nested fields as JSON strings; both
are undone here. Fields the canonical schema has no column for are kept in
``metadata`` (never dropped).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corpora.adapters._common import json_value, jsonable, map_role, require, text
from corpora.adapters.instructions import clean_kwargs
from corpora.adapters.tools import openai_tools
from corpora.registry import SourceSpec
from corpora.schema import SFT_DOMAINS, RecordError

_MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id")


def _tool_calls(calls: Any, where: str, index: int) -> tuple[list[dict[str, Any]], int]:
    """OpenAI ``tool_calls`` with ``arguments`` checked to be a JSON object.

    A JSON-string ``arguments`` is kept byte for byte; an object is kept as an
    object (ingest serializes it). A call without an ``id`` gets
    ``call_<index>_<k>`` (``index``: the message's position); the second value counts them.
    """
    calls = json_value(calls, where)
    if not isinstance(calls, list):
        raise RecordError(f"{where}: expected a list")
    out, generated = [], 0
    for k, tc in enumerate(calls):
        tc = json_value(tc, f"{where}[{k}]")
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RecordError(f"{where}[{k}].function: needs a name")
        args = fn.get("arguments")
        parsed = json_value(args, f"{where}[{k}].function.arguments")
        if not isinstance(parsed, dict):
            raise RecordError(f"{where}[{k}].function.arguments: must encode a JSON object")
        call_id = tc.get("id")
        if not call_id:
            call_id, generated = f"call_{index}_{k}", generated + 1
        out.append({"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out, generated


def chat_messages(messages: Any, where: str = "messages") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """OpenAI-format messages (list or JSON string) in the canonical message shape.

    ``content`` null becomes ``""`` (an assistant turn carrying only tool calls);
    content-part lists are joined; null keys are dropped. Returns the messages
    and notes for metadata: extra non-null message keys (``{"3": {"name": ...}}``)
    and the number of generated tool-call ids.
    """
    messages = json_value(messages, where)
    if not isinstance(messages, list):
        raise RecordError(f"{where}: expected a list")
    out: list[dict[str, Any]] = []
    extras: dict[str, Any] = {}
    generated = 0
    for i, m in enumerate(messages):
        m = json_value(m, f"{where}[{i}]")
        if not isinstance(m, dict):
            raise RecordError(f"{where}[{i}]: expected an object")
        if m.get("type") not in (None, "message"):
            raise RecordError(f"{where}[{i}].type: unsupported input item {m.get('type')!r}")
        content = "" if m.get("content") is None else text(m["content"], f"{where}[{i}].content")
        msg: dict[str, Any] = {"role": map_role(m.get("role"), f"{where}[{i}]"), "content": content}
        if m.get("reasoning_content") is not None:
            msg["reasoning_content"] = text(m["reasoning_content"], f"{where}[{i}].reasoning_content")
        if m.get("tool_calls"):
            msg["tool_calls"], n = _tool_calls(m["tool_calls"], f"{where}[{i}].tool_calls", i)
            generated += n
        if m.get("tool_call_id") is not None:
            msg["tool_call_id"] = str(m["tool_call_id"])
        extra = {k: v for k, v in m.items() if k not in _MESSAGE_KEYS and k != "type" and v is not None}
        if extra:
            extras[str(i)] = jsonable(extra)
        out.append(msg)
    notes: dict[str, Any] = {}
    if extras:
        notes["message_extras"] = extras
    if generated:
        notes["generated_tool_call_ids"] = generated
    return out, notes


def _rest(raw: dict[str, Any], used: set[str]) -> dict[str, Any]:
    """Every non-null field not in ``used``, JSON strings decoded when they hold objects/lists."""
    out = {}
    for k, v in raw.items():
        if k in used or v is None:
            continue
        if isinstance(v, str) and v[:1] in "{[":
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                pass
        out[k] = jsonable(v)
    return out


def _row_license(raw: dict[str, Any]) -> dict[str, str]:
    """A row's own ``license`` (of the data it came from) as ``{"row_license": ...}`` for metadata: the
    release's license (the registry's, from the dataset card) is the row's ``license``, since it governs
    what may be re-released."""
    lic = raw.get("license")
    return {"row_license": lic} if isinstance(lic, str) and lic.strip() else {}


def nemotron_sft(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """A ``nvidia/Nemotron-Cascade-2-SFT-Data`` row -> SFT row.

    Fields: ``messages`` (OpenAI chat; ``reasoning_content`` and ``tool_calls``
    kept; an empty system turn is dropped and counted in ``metadata.dropped_empty_system_turns``),
    ``tools`` (any common tool shape, see :func:`openai_tools`),
    ``generator`` (a non-string value is stored as its JSON), ``license`` (the
    row's own -> ``metadata.row_license``), ``category``/``domain`` (used
    as the domain when it is a canonical SFT domain). ``uuid`` is kept as
    ``metadata.upstream_uuid``; every other field lands in ``metadata``.
    """
    (msgs,) = require(raw, "messages")
    messages, notes = chat_messages(msgs)
    kept = [m for m in messages if m["role"] != "system" or m["content"].strip()]
    if len(kept) < len(messages):  # NVIDIA's rows often open with an empty system turn: no turn to train on
        notes["dropped_empty_system_turns"] = len(messages) - len(kept)
        messages = kept
    generator = raw.get("generator")
    if generator is not None and not isinstance(generator, str):
        generator = json.dumps(jsonable(generator), ensure_ascii=False)
    domain = next((raw[k] for k in ("domain", "category") if raw.get(k) in SFT_DOMAINS), spec.domain)
    metadata = {"upstream_uuid": raw.get("uuid"), **_rest(raw, {"uuid", "messages", "tools", "generator", "license"}),
                **notes, **_row_license(raw)}
    return {"messages": messages, "tools": openai_tools(raw.get("tools"), drop_null_keys=True), "generator": generator,
            "domain": domain, "metadata": metadata}


#: Upstream fields the agent translations (:mod:`corpora.nemo_gym`) turn into ``ground_truth`` and
#: ``metadata`` (not repeated in ``metadata`` as they were).
TRANSLATED = ("ground_truth", "expected_answer", "answer", "options", "template_metadata", "grading_mode",
              "schema_str", "schema", "json_schema", "FAIL_TO_PASS", "PASS_TO_PASS", "patch", "golden_patch",
              "test_patch", "problem_statement")


def _float(value: Any, field: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RecordError(f"{field}: expected a number, got {value!r}") from None


def _int(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{field}: expected an integer, got {value!r}")
    return value


def nemo_gym_rl(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """A ``nvidia/Nemotron-Cascade-2-RL-data`` (NeMo-Gym) row -> RL row.

    The row's ``agent_ref`` (``{type, name}``, its JSON, or a name) names a NeMo-Gym agent of the table
    in :mod:`corpora.nemo_gym`, which gives this package's verifier (the row's ``agent_ref``), the
    domain, and the ``ground_truth`` translated from the agent's own fields (an unknown agent, or a row
    with nothing to verify against, is a :class:`RecordError` naming it). Other fields:
    ``responses_create_params`` ``{input: messages, tools?, <sampling>}`` (sampling knobs kept as
    ``metadata.sampling``; a top-level ``prompt`` equal to the last input turn is not repeated in
    metadata; a SWE agent's prompt is this package's SWE agent prompt), ``instruction_id_list`` +
    ``kwargs`` (entries null, objects or JSON strings; null-padded keys removed),
    ``pass_rate``/``pass_rate_total``/``pass_rate_passed``, ``license`` (the row's own -> ``metadata.row_license``).
    Everything else -> ``metadata``; the exact upstream line (``options.json_lines``) ->
    ``metadata.nemo_gym_row``, which a NeMo-Gym export writes back as it was.
    """
    from corpora.nemo_gym import UPSTREAM_ROW_KEY, canonical_fields
    from corpora.readers import UPSTREAM_LINE

    line = raw.pop(UPSTREAM_LINE, None)
    rcp, _ = require(raw, "responses_create_params", "agent_ref")
    rcp = json_value(rcp, "responses_create_params")
    if not isinstance(rcp, dict) or rcp.get("input") is None:
        raise RecordError("responses_create_params.input: missing")
    fields = canonical_fields(raw)
    raw_input = rcp["input"]
    if isinstance(raw_input, str):  # a bare prompt string is one user turn in the Responses API
        raw_input = [{"role": "user", "content": raw_input}]
    messages, notes = chat_messages(raw_input, "responses_create_params.input")
    ids = raw.get("instruction_id_list")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise RecordError("instruction_id_list: expected a list of strings")
    kwargs = raw.get("kwargs")
    if ids is not None and kwargs is not None:
        kwargs = clean_kwargs(kwargs, len(ids))
    elif kwargs is not None:
        kwargs = jsonable(json_value(kwargs, "kwargs"))
    sampling = {k: jsonable(v) for k, v in rcp.items() if k not in ("input", "tools", "metadata") and v is not None}
    used = {"uuid", "responses_create_params", "agent_ref", "instruction_id_list", "kwargs", "license",
            "pass_rate", "pass_rate_total", "pass_rate_passed", *TRANSLATED}
    if messages and raw.get("prompt") == messages[-1]["content"]:  # IF-RL rows repeat the user turn as `prompt`
        used.add("prompt")
    metadata = {"upstream_uuid": raw.get("uuid"), **_rest(raw, used), **notes, **fields["metadata"], **_row_license(raw)}
    if sampling:
        metadata["sampling"] = sampling
    if line is not None:
        metadata[UPSTREAM_ROW_KEY] = line
    tools = openai_tools(rcp.get("tools"), "responses_create_params.tools", drop_null_keys=True)
    prompt = {"input": messages, "tools": tools}
    if fields["agent_ref"] == "swe":
        from corpora.adapters.swe import swe_prompt

        prompt = swe_prompt(fields["metadata"]["question"])
    row: dict[str, Any] = {
        "responses_create_params": prompt, "agent_ref": fields["agent_ref"], "domain": fields["domain"],
        "instruction_id_list": ids, "kwargs": kwargs,
        "pass_rate": _float(raw.get("pass_rate"), "pass_rate"),
        "pass_rate_total": _int(raw.get("pass_rate_total"), "pass_rate_total"),
        "pass_rate_passed": _int(raw.get("pass_rate_passed"), "pass_rate_passed"),
        "metadata": metadata}
    if fields["ground_truth"] is not None:
        row["ground_truth"] = fields["ground_truth"]
    return row

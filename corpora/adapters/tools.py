"""Tool-use adapters: ToolTalk conversations (SFT) and BFCL function-calling prompts (RL).

Tools are stored in OpenAI chat form, ``[{"type": "function", "function":
{name, description, parameters}}]``; :func:`openai_tools` brings the other
common shapes (bare function schemas, Responses-API flat tools) into it.
"""

from __future__ import annotations

import ast
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from corpora.adapters._common import (
    json_value,
    map_role,
    objects,
    require,
    text,
    trim_trailing_user,
)
from corpora.registry import SourceSpec
from corpora.schema import RecordError


def drop_nulls(value: Any) -> Any:
    """``value`` with every null-valued object key removed, recursively (list items are kept).

    Arrow-backed loaders (parquet, and ``datasets``' json builder) give every
    tool schema the union of all schemas' keys, the missing ones null; a JSON
    schema has no meaningful null-valued keyword except ``default: null``, which
    is lost.
    """
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def openai_tools(tools: Any, where: str = "tools", *, drop_null_keys: bool = False) -> list[dict[str, Any]]:
    """``tools`` (a list, or its JSON string) in OpenAI chat form.

    Accepts ``{"type": "function", "function": {...}}`` (kept), a bare function
    schema ``{name, description?, parameters?}`` and the Responses-API flat form
    ``{"type": "function", "name", ...}`` (both wrapped). ``drop_null_keys``
    removes null-padded keys (see :func:`drop_nulls`): for rows read through Arrow
    only, since file sources such as BFCL use ``default: null``.

    Raises:
        RecordError: for a tool without a name or of another type.
    """
    tools = json_value(tools, where)
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RecordError(f"{where}: expected a list")
    out = []
    for i, tool in enumerate(tools):
        tool = json_value(tool, f"{where}[{i}]")
        if not isinstance(tool, dict):
            raise RecordError(f"{where}[{i}]: expected an object")
        if (tool.get("type") or "function") != "function":
            raise RecordError(f"{where}[{i}].type: unsupported tool type {tool.get('type')!r}")
        fn = tool["function"] if isinstance(tool.get("function"), dict) \
            else {k: v for k, v in tool.items() if k != "type"}
        if drop_null_keys:
            fn = drop_nulls(fn)
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RecordError(f"{where}[{i}]: function without a name")
        out.append({"type": "function", "function": fn})
    return out


# ------------------------------------------------------------------ ToolTalk
TOOLTALK_SYSTEM = ("You are a helpful assistant. Here is some user data:\nlocation: {location}\n"
                   "timestamp: {timestamp}\nusername (if logged in): {username}")


@lru_cache(maxsize=8)
def tooltalk_api_docs(apis_dir: Path) -> dict[str, dict[str, Any]]:
    """ToolTalk's API classes in ``tooltalk/apis/*.py``, read statically (the package is never imported).

    Returns ``{class name: {description, parameters, requires_auth}}`` for every
    class that assigns literal ``description`` and ``parameters``; ``requires_auth``
    is inherited from a parsed base class, default False.
    """
    classes: dict[str, dict[str, Any]] = {}
    bases: dict[str, list[str]] = {}
    for path in sorted(apis_dir.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            attrs: dict[str, Any] = {}
            for st in node.body:
                if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                        and st.targets[0].id in ("description", "parameters", "requires_auth"):
                    attrs[st.targets[0].id] = ast.literal_eval(st.value)
            classes[node.name] = attrs
            bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]

    def auth(name: str) -> bool:
        if "requires_auth" in classes.get(name, {}):
            return bool(classes[name]["requires_auth"])
        return any(auth(b) for b in bases.get(name, []))

    return {name: {"description": a["description"], "parameters": a["parameters"], "requires_auth": auth(name)}
            for name, a in classes.items() if "description" in a and "parameters" in a}


def tooltalk_tool(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """One ToolTalk API as an OpenAI tool (``required`` moved inside ``parameters``).

    APIs with ``requires_auth`` take a ``session_token`` argument: ToolTalk's
    executor injects it, and the recorded calls carry it, so it is declared.
    """
    props: dict[str, Any] = {}
    required: list[str] = []
    if doc["requires_auth"]:
        props["session_token"] = {"type": "string", "description": "User's session_token."}
        required.append("session_token")
    for pname, attrs in doc["parameters"].items():
        props[pname] = {k: v for k, v in attrs.items() if k != "required"}
        if attrs.get("required"):
            required.append(pname)
    return {"type": "function", "function": {
        "name": name, "description": doc["description"],
        "parameters": {"type": "object", "properties": props, "required": required}}}


def tooltalk(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """ToolTalk conversation JSON ``{name, conversation_id, apis_used, metadata, conversation:
    [{role, text, apis?: [{request: {api_name, parameters}, response, exception}]}]}`` -> SFT row.

    The system prompt is ToolTalk's own (location, timestamp, username). Each
    recorded API call becomes an assistant turn with one ``tool_calls`` entry
    followed by a ``tool`` turn whose content is the JSON ``{response, exception}``;
    the assistant's reply text follows. ``tools`` are the OpenAI schemas of
    ``apis_used``, read from ``options.apis_dir`` (ToolTalk's API classes); when
    that directory is missing, ``tools`` is ``[]`` and ``metadata.tools_note``
    says so. Trailing user turns ("Thanks!") are trimmed and counted.
    """
    conv, apis_used, meta = require(raw, "conversation", "apis_used", "metadata")
    if not isinstance(meta, dict):
        raise RecordError(f"metadata: expected an object, got {type(meta).__name__}")
    if not isinstance(apis_used, list) or not all(isinstance(a, str) for a in apis_used):
        raise RecordError("apis_used: expected a list of API names")
    messages: list[dict[str, Any]] = [{"role": "system", "content": TOOLTALK_SYSTEM.format(
        location=meta.get("location"), timestamp=meta.get("timestamp"), username=meta.get("username"))}]
    for t, turn in enumerate(objects(conv, "conversation")):
        role = map_role(turn.get("role"), f"conversation[{t}]")
        for k, call in enumerate(objects(turn.get("apis") or [], f"conversation[{t}].apis")):
            if role != "assistant":
                raise RecordError(f"conversation[{t}].apis: API calls on a {role!r} turn")
            req = call.get("request") or {}
            if not isinstance(req.get("api_name"), str) or not isinstance(req.get("parameters"), dict):
                raise RecordError(f"conversation[{t}].apis[{k}].request: needs api_name and parameters")
            call_id = f"call_{t}_{k}"
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": req["api_name"], "arguments": req["parameters"]}}]})
            messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(
                {"response": call.get("response"), "exception": call.get("exception")}, ensure_ascii=False)})
        messages.append({"role": role, "content": text(turn.get("text"), f"conversation[{t}].text")})
    messages, trimmed = trim_trailing_user(messages)
    metadata: dict[str, Any] = {"name": raw.get("name"), "conversation_id": raw.get("conversation_id"),
                                "suites_used": raw.get("suites_used"), "apis_used": apis_used}
    if trimmed:
        metadata["trimmed_turns"] = trimmed
    apis_dir = root / spec.options["apis_dir"] if spec.options.get("apis_dir") else None
    tools: list[dict[str, Any]] = []
    if apis_dir is not None and apis_dir.is_dir():
        docs = tooltalk_api_docs(apis_dir)
        called = {tc["function"]["name"] for m in messages for tc in m.get("tool_calls", [])}
        for name in list(apis_used) + sorted(called - set(apis_used)):
            if name not in docs:
                raise RecordError(f"apis_used: no documentation for API {name!r} in {apis_dir}")
            tools.append(tooltalk_tool(name, docs[name]))
    else:
        metadata["tools_note"] = "ToolTalk API docs not available (options.apis_dir); tools left empty"
    return {"messages": messages, "tools": tools, "metadata": metadata}


# ------------------------------------------------------------------ BFCL
#: BFCL's Python-flavoured JSON-schema types and their JSON-schema names; None drops the type.
BFCL_TYPES: dict[str, str | None] = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def bfcl_schema(node: Any) -> Any:
    """A BFCL parameter schema in standard JSON Schema (recursing through
    ``properties``, ``items``, ``additionalProperties`` and ``anyOf``/``oneOf``/``allOf``)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(out.get("type"), str) and out["type"] in BFCL_TYPES:
        mapped = BFCL_TYPES[out["type"]]
        if mapped is None:
            del out["type"]
        else:
            out["type"] = mapped
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: bfcl_schema(v) for k, v in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = bfcl_schema(out[key])
        elif isinstance(out.get(key), list):
            out[key] = [bfcl_schema(v) for v in out[key]]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [bfcl_schema(v) for v in out[key]]
    return out


@lru_cache(maxsize=64)
def _bfcl_answers(path: Path) -> dict[str, Any]:
    answers = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            answers[rec["id"]] = rec["ground_truth"]
    return answers


def bfcl(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """BFCL v4 row ``{id, question: [[messages of turn 1]], function: [schemas]}`` -> RL row.

    The category is the id without its trailing ``_<n>`` (``live_simple_3-2-1`` ->
    ``live_simple``); the possible answers are read from
    ``<root>/<options.answers_dir>/BFCL_v4_<category>.json`` by id:
    ``ground_truth.calls`` is BFCL's ``[{function: {arg: [acceptable values]}}]``.
    Irrelevance categories have no answer file and mean "no call expected":
    ``calls`` is ``[]``. Multi-turn rows are rejected. Function names are kept as
    BFCL writes them (some contain dots).
    """
    rid, question, functions = require(raw, "id", "question", "function")
    rid = text(rid, "id")
    if not isinstance(question, list) or len(question) != 1:
        raise RecordError(f"question: {len(question) if isinstance(question, list) else '?'} turns; "
                          "only single-turn BFCL rows are supported")
    messages = [{"role": map_role(m.get("role"), f"question[0][{i}]"),
                 "content": text(m.get("content"), f"question[0][{i}].content")}
                for i, m in enumerate(objects(question[0], "question[0]"))]
    category = rid.rsplit("_", 1)[0]
    answers_path = root / spec.options.get("answers_dir", "") / f"BFCL_v4_{category}.json"
    if answers_path.is_file():
        answers = _bfcl_answers(answers_path)
        if rid not in answers:
            raise RecordError(f"id: {rid!r} has no possible answer in {answers_path.name}")
        calls = answers[rid]
    elif "irrelevance" in category:
        calls = []
    else:
        raise RecordError(f"id: no possible-answer file {answers_path} for category {category!r}")
    tools = [{"type": "function", "function": {**fn, "parameters": bfcl_schema(fn.get("parameters", {}))}}
             for fn in objects(functions, "function")]
    return {"responses_create_params": {"input": messages, "tools": openai_tools(tools)},
            "agent_ref": "tool_call", "ground_truth": {"calls": calls},
            "metadata": {"id": rid, "category": category}}


# ------------------------------------------------------------------ multi-turn episodes
#: BFCL's MULTI_TURN_FUNC_DOC_FILE_MAPPING for the multi-turn classes (bfcl_eval/constants/executable_backend_config.py)
BFCL_FUNC_DOCS = {"GorillaFileSystem": "gorilla_file_system.json", "MathAPI": "math_api.json",
                  "MessageAPI": "message_api.json", "TwitterAPI": "posting_api.json", "TicketAPI": "ticket_api.json",
                  "TradingBot": "trading_bot.json", "TravelAPI": "travel_booking.json",
                  "VehicleControlAPI": "vehicle_control.json"}
#: BFCL's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC: the user turn where held-out functions arrive
BFCL_MORE_FUNCTIONS = "I have updated some more functions you can choose from. What about now?"


def bfcl_call(call: str, where: str) -> dict[str, Any]:
    """A BFCL ground-truth call string (``mv(source='a', destination='b')``) as ``{name, args, kwargs}``
    of literal values, parsed with :mod:`ast` (never evaluated).

    Raises:
        RecordError: not a call of a plain name with literal arguments.
    """
    try:
        node = ast.parse(call, mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError("not a function call")
        return {"name": node.func.id, "args": [ast.literal_eval(a) for a in node.args],
                "kwargs": {k.arg: ast.literal_eval(k.value) for k in node.keywords}}
    except (SyntaxError, ValueError) as exc:
        raise RecordError(f"{where}: ground-truth call {call[:80]!r} is not a literal call: {exc}") from None


@lru_cache(maxsize=16)
def _bfcl_func_docs(path: Path) -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def bfcl_multi_turn(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """BFCL v4 multi-turn row ``{id, question: [[messages] per user turn], initial_config,
    involved_classes, missed_function?}`` -> an episode RL row (``agent_ref`` ``bfcl_multi_turn``,
    :mod:`validators.tools.bfcl`).

    The tools are the function docs of the involved classes (``options.func_doc_dir``) minus the held-out
    ones (miss_func: ``missed_function`` ``{turn: [names]}``, offered from that turn on, whose empty user
    turn becomes BFCL's "I have updated some more functions..."). Ground-truth call strings are parsed into
    literal ``{name, args, kwargs}`` (:func:`bfcl_call`). ``ground_truth.backend`` is the backends'
    directory relative to the sources root (``<package dir>/<options.backend_dir>``).

    Raises:
        RecordError: no possible answer, a turn count that differs from the answer's, an unknown class,
            a held-out function that is not documented or that the ground truth calls before it is offered
            (BFCL's miss_func_49), a ground-truth call that is not literal.
    """
    rid, question, classes = require(raw, "id", "question", "involved_classes")
    rid = text(rid, "id")
    category = rid.rsplit("_", 1)[0]
    answers = _bfcl_answers(root / spec.options["answers_dir"] / f"BFCL_v4_{category}.json")
    if rid not in answers:
        raise RecordError(f"id: {rid!r} has no possible answer")
    truth = answers[rid]
    if not isinstance(question, list) or len(question) != len(truth):
        raise RecordError(f"question: {len(question) if isinstance(question, list) else '?'} turns, "
                          f"ground truth {len(truth)}")
    docs: list[dict[str, Any]] = []
    for cls in classes:
        if cls not in BFCL_FUNC_DOCS:
            raise RecordError(f"involved_classes: unknown class {cls!r}")
        docs += _bfcl_func_docs(root / spec.options["func_doc_dir"] / BFCL_FUNC_DOCS[cls])
    missed = raw.get("missed_function") or {}
    held = {name for names in missed.values() for name in names}
    by_name = {d["name"]: {"type": "function", "function": {**d, "parameters": bfcl_schema(d.get("parameters", {}))}}
               for d in docs}
    unknown = sorted(held - set(by_name))
    if unknown:
        raise RecordError(f"missed_function: {unknown} not documented for {classes}")
    offered_at = {name: int(t) for t, names in missed.items() for name in names}
    for t, calls in enumerate(truth):
        early = sorted({c.split("(")[0].strip() for c in calls} & {n for n, at in offered_at.items() if at > t})
        if early:
            raise RecordError(f"ground_truth[{t}]: calls {early}, held out until turn "
                              f"{offered_at[early[0]]} (missed_function): no policy can match it")
    turns = []
    for t, msgs in enumerate(question):
        msgs = [{"role": map_role(m.get("role"), f"question[{t}][{i}]"), "content": text(m.get("content"),
                f"question[{t}][{i}].content")} for i, m in enumerate(objects(msgs, f"question[{t}]"))]
        turns.append(msgs or [{"role": "user", "content": BFCL_MORE_FUNCTIONS}])
    gt = {"turns": [[bfcl_call(c, f"ground_truth[{t}]") for c in calls] for t, calls in enumerate(truth)],
          "user_turns": turns[1:], "initial_config": raw.get("initial_config") or {}, "involved_classes": classes,
          "long_context": "long_context" in category,
          "missed_function": {str(t): [by_name[n] for n in names] for t, names in missed.items()},
          "backend": f"{root.name}/{spec.options['backend_dir']}"}
    tools = [tool for name, tool in by_name.items() if name not in held]
    return {"responses_create_params": {"input": turns[0], "tools": tools}, "agent_ref": "bfcl_multi_turn",
            "ground_truth": gt, "metadata": {"id": rid, "category": category, "user_turns": len(question)}}


def tooltalk_episode(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """ToolTalk conversation -> an episode RL row (``agent_ref`` ``tooltalk``, :mod:`validators.tools.tooltalk`).

    The prompt is ToolTalk's system prompt (location, timestamp, the logged-in username) and the first
    user turn; the tools are those of ``apis_used`` and of every recorded call (without
    ``session_token``: the executor supplies it). ``ground_truth``: the later user turns, the recorded
    calls after each user turn (``calls``), ``timestamp``, ``user`` and ``backend``
    (``<package dir>/<options.backend_dir>``).

    Raises:
        RecordError: no user turn, API calls on a user turn, an undocumented API.
    """
    conv, apis_used, meta = require(raw, "conversation", "apis_used", "metadata")
    user = raw.get("user") or {}
    system = TOOLTALK_SYSTEM.format(location=meta.get("location"), timestamp=meta.get("timestamp"),
                                    username=user.get("username") if "session_token" in user else None)
    user_turns: list[list[dict[str, str]]] = []
    calls: list[list[dict[str, Any]]] = []
    for t, turn in enumerate(objects(conv, "conversation")):
        role = map_role(turn.get("role"), f"conversation[{t}]")
        if role == "user":
            user_turns.append([{"role": "user", "content": text(turn.get("text"), f"conversation[{t}].text")}])
            calls.append([])
            continue
        for k, call in enumerate(objects(turn.get("apis") or [], f"conversation[{t}].apis")):
            req = call.get("request") or {}
            if not user_turns:
                raise RecordError(f"conversation[{t}].apis[{k}]: an API call before any user turn")
            calls[-1].append({"api_name": text(req.get("api_name"), f"conversation[{t}].apis[{k}].api_name"),
                              "parameters": req.get("parameters") or {}})
    if not user_turns:
        raise RecordError("conversation: no user turn")
    docs = tooltalk_api_docs(root / spec.options["apis_dir"])
    names = list(dict.fromkeys([*apis_used, *(c["api_name"] for turn in calls for c in turn)]))
    tools = []
    for name in names:
        if name not in docs:
            raise RecordError(f"apis_used: no documentation for API {name!r}")
        tools.append(tooltalk_tool(name, {**docs[name], "requires_auth": False}))
    gt = {"user_turns": user_turns[1:], "calls": calls, "timestamp": meta.get("timestamp"), "user": user,
          "backend": f"{root.name}/{spec.options['backend_dir']}"}
    return {"responses_create_params": {"input": [{"role": "system", "content": system}, *user_turns[0]],
                                        "tools": tools},
            "agent_ref": "tooltalk", "ground_truth": gt,
            "metadata": {"name": raw.get("name"), "conversation_id": raw.get("conversation_id"),
                         "category": "tooltalk", "user_turns": len(user_turns)}}

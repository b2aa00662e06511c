"""Chat adapters: ShareGPT conversations, Arena-Hard answers and prompts, HealthBench, MT-Bench.

SFT rows keep every turn in order; RL rows of open-ended chat are judged by a
generative reward model (``agent_ref`` ``genrm``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corpora.adapters._common import map_role, objects, require, text, trim_trailing_user, user
from corpora.registry import SourceSpec
from corpora.schema import RecordError


def sharegpt(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """ShareGPT ``{id, conversations: [{from, value}], system?}`` -> one SFT row.

    Roles go through :func:`map_role` (``human``/``User`` -> user, ``gpt``/
    ``chatgpt``/``bard``/``bing`` -> assistant, ...); an unknown role is a
    RecordError naming it and the turn index. All turns are kept in order and a
    non-empty top-level ``system`` becomes the first message. Assistant turns
    before the first user turn (a continuation chunk of a conversation that
    ShareGPT-V3 split for length) are dropped, as FastChat's preprocessing does,
    and counted in ``metadata.dropped_leading_turns``; trailing user turns are
    trimmed and counted in ``metadata.trimmed_turns``. Empty turns are left to
    schema validation.
    """
    (turns,) = require(raw, "conversations")
    if not isinstance(turns, list):
        raise RecordError("conversations: expected a list")
    messages: list[dict[str, Any]] = []
    system = text(raw["system"], "system") if raw.get("system") is not None else ""
    if system.strip():
        messages.append({"role": "system", "content": system})
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise RecordError(f"conversations[{i}]: expected an object")
        messages.append({"role": map_role(turn.get("from"), f"conversations[{i}]"),
                         "content": text(turn.get("value"), f"conversations[{i}].value")})
    start = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    end = start
    while end < len(messages) and messages[end]["role"] == "assistant":
        end += 1
    messages, trimmed = trim_trailing_user(messages[:start] + messages[end:])
    metadata: dict[str, Any] = {"id": raw.get("id")}
    if end > start:
        metadata["dropped_leading_turns"] = end - start
    if trimmed:
        metadata["trimmed_turns"] = trimmed
    return {"messages": messages, "metadata": metadata}


def arena_hard_answer(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """Arena-Hard ``model_answer/<model>.jsonl`` ``{uid, ans_id, model, messages}`` -> one SFT row.

    The assistant ``content`` is an object ``{answer, reasoning?}``: ``answer``
    becomes the content, ``reasoning`` the ``reasoning_content``; any other key
    is a RecordError. ``generator`` is the answering model.
    """
    uid, model, msgs = require(raw, "uid", "model", "messages")
    messages = []
    for i, m in enumerate(objects(msgs, "messages")):
        role = map_role(m.get("role"), f"messages[{i}]")
        content = m.get("content")
        msg: dict[str, Any] = {"role": role}
        if isinstance(content, dict):
            extra = set(content) - {"answer", "reasoning"}
            if extra:
                raise RecordError(f"messages[{i}].content: unexpected keys {sorted(extra)}")
            msg["content"] = text(content.get("answer"), f"messages[{i}].content.answer")
            if content.get("reasoning"):
                msg["reasoning_content"] = text(content["reasoning"], f"messages[{i}].content.reasoning")
        else:
            msg["content"] = text(content, f"messages[{i}].content")
        messages.append(msg)
    return {"messages": messages, "generator": model,
            "metadata": {"uid": uid, "ans_id": raw.get("ans_id")}}


def arena_hard_prompt(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """Arena-Hard ``question.jsonl`` ``{uid, category, subcategory, prompt}`` -> RL row for the GenRM."""
    uid, prompt = require(raw, "uid", "prompt")
    return {"responses_create_params": {"input": user(text(prompt, "prompt"))}, "agent_ref": "genrm",
            "metadata": {"uid": uid, "category": raw.get("category"), "subcategory": raw.get("subcategory")}}


def healthbench(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """HealthBench ``{prompt_id, prompt: [{role, content}], rubrics: [{criterion, points, tags}],
    example_tags}`` -> RL row; the whole conversation is the input, the rubrics the ground truth."""
    prompt_id, prompt, rubrics = require(raw, "prompt_id", "prompt", "rubrics")
    messages = [{"role": map_role(m.get("role"), f"prompt[{i}]"),
                 "content": text(m.get("content"), f"prompt[{i}].content")}
                for i, m in enumerate(objects(prompt, "prompt"))]
    rubrics = objects(rubrics, "rubrics")
    return {"responses_create_params": {"input": messages}, "agent_ref": "genrm",
            "ground_truth": {"rubrics": rubrics},
            "metadata": {"prompt_id": prompt_id, "example_tags": raw.get("example_tags", [])}}


def mtbench(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """MT-Bench ``question.jsonl`` ``{question_id, category, turns: [q1, q2], reference?}`` -> RL row.

    The input is the first turn (a single-turn prompt); both turns stay in
    ``metadata.turns``. ``ground_truth`` is ``{"reference": <first-turn reference>}``
    when the question has references (math, reasoning, coding, some roleplay), else null.
    """
    qid, turns = require(raw, "question_id", "turns")
    if not isinstance(turns, list) or not turns:
        raise RecordError("turns: expected a non-empty list")
    row: dict[str, Any] = {
        "responses_create_params": {"input": user(text(turns[0], "turns[0]"))}, "agent_ref": "genrm",
        "metadata": {"question_id": qid, "category": raw.get("category"), "turns": turns}}
    reference = raw.get("reference")
    if reference is not None and not isinstance(reference, list):
        raise RecordError(f"reference: expected a list (one per turn), got {type(reference).__name__}")
    if reference:
        row["ground_truth"] = {"reference": reference[0]}
        row["metadata"]["reference"] = reference
    return row

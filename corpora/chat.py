"""Chat rendering: canonical messages and tools (:mod:`corpora.schema`) to what a chat template or a
trainer receives. One place for it, used by tokenization (``packing``), the RL stages' prompts
(``stages``) and other trainers' dataset layouts (``curation``):

- :func:`to_chat`: schema messages and the ``tools`` JSON string to Hugging Face chat format (null
  keys dropped, tool-call ``arguments`` decoded), what ``apply_chat_template`` reads.
- :func:`inline_tools`: the tool schemas moved into the system turn (:data:`TOOLS_PREAMBLE`), for a
  template, or a trainer, that does not take a row's own ``tools``.
- :func:`renders_tools`: whether a tokenizer's chat template renders ``tools`` at all.
- :func:`prompt_messages`: the chat and tools a template receives for an RL row's
  ``responses_create_params`` (tools inlined when the template does not render them).
- :func:`trl_prompt`: the conversational prompt of an RL row for TRL and verl (tools always inlined:
  those trainers render every prompt of a run with one set of tools, not a row's own).

A model given :data:`TOOLS_PREAMBLE` answers with :data:`TOOL_CALL_FORMAT` blocks, which
:func:`validators.verifiers.tool_call.parse_calls` reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

#: How a model told the tools in text (:data:`TOOLS_PREAMBLE`) writes a tool call.
TOOL_CALL_FORMAT = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
#: The system-turn text that declares a row's tools to a template that does not render ``tools``
#: (``{tools}``: one JSON schema per line).
TOOLS_PREAMBLE = f"You can call these tools. To call one, answer with {TOOL_CALL_FORMAT}.\n<tools>\n{{tools}}\n</tools>"


def to_chat(messages: Sequence[dict[str, Any]], tools: str | None) -> tuple[list[dict], list[dict] | None]:
    """Schema messages and tools (JSON string) to what chat templates read.

    Drops null fields, decodes tool-call ``arguments`` to objects (Hugging Face
    chat format) and ``tools`` to a list (``None`` when empty).

    Returns:
        ``(chat, tools)``: new message dicts (``messages`` is not modified) and the decoded tool
        schemas or ``None``.

    Raises:
        json.JSONDecodeError: ``tools`` or a tool call's ``arguments`` is not JSON.
        KeyError / TypeError: a tool call without ``function.name`` / ``function.arguments``.
    """
    chat = []
    for m in messages:
        msg = {k: v for k, v in m.items() if v is not None}
        if msg.get("tool_calls"):
            msg["tool_calls"] = [{**c, "function": {"name": c["function"]["name"],
                                                    "arguments": json.loads(c["function"]["arguments"])}}
                                 for c in msg["tool_calls"]]
        chat.append(msg)
    parsed = json.loads(tools) if tools else None
    return chat, (parsed or None)


def inline_tools(chat: list[dict[str, Any]], tools: list[dict] | None) -> list[dict[str, Any]]:
    """``chat`` with the tool schemas in its system turn (:data:`TOOLS_PREAMBLE`, one JSON schema per
    line; a system turn is prepended when there is none): the prompt of a template, or a trainer, that
    does not take a row's own ``tools``. ``chat`` unchanged when ``tools`` is empty.

    Returns:
        A new list (``chat`` and its messages are not modified), or ``chat`` itself when ``tools`` is
        empty.
    """
    if not tools:
        return chat
    block = TOOLS_PREAMBLE.replace("{tools}", "\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if chat and chat[0]["role"] == "system":
        return [{**chat[0], "content": chat[0]["content"] + "\n\n" + block}, *chat[1:]]
    return [{"role": "system", "content": block}, *chat]


def renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template renders the ``tools`` it is given (probed with one tool on
    a one-turn chat; SmolLM2's ChatML, for one, ignores them).

    Raises:
        whatever ``tokenizer.apply_chat_template`` raises (no chat template: ``ValueError``).
    """
    probe = [{"type": "function", "function": {"name": "probe_tool_name", "parameters": {}}}]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=probe, tokenize=False)
    return "probe_tool_name" in rendered


def prompt_messages(params: dict[str, Any], template_renders_tools: bool
                    ) -> tuple[list[dict[str, Any]], list[dict] | None]:
    """The chat and tools a chat template receives for an RL row's ``responses_create_params``
    (``input`` messages, ``tools`` JSON string or absent): :func:`to_chat`, and the tools moved into
    the system turn (:func:`inline_tools`, tools ``None``) unless ``template_renders_tools``
    (:func:`renders_tools`).

    Raises:
        KeyError: ``params`` has no ``input``; errors of :func:`to_chat`.
    """
    chat, tools = to_chat(params["input"], params.get("tools"))
    if tools and not template_renders_tools:
        return inline_tools(chat, tools), None
    return chat, tools


def trl_prompt(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversational prompt of a row's ``responses_create_params``: its ``input`` messages (null
    keys dropped, tool-call arguments decoded) with its ``tools`` in the system turn (what
    :func:`prompt_messages` gives a template that does not render tools).

    Raises:
        KeyError: ``params`` has no ``input``; errors of :func:`to_chat`.
    """
    return prompt_messages(params, template_renders_tools=False)[0]

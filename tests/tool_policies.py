"""Scripted policies for the tool environments (:mod:`validators.tools`): the ground truth played back,
and edits of it (a wrong order, a missing call, an extra write) that must score 0."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from common.answers import row_json
from validators.episodes import Episode

Call = tuple[str, dict[str, Any]]


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def _params(row: dict[str, Any], name: str, gt: dict[str, Any]) -> list[str]:
    tools = list(row_json(row["responses_create_params"], "tools"))
    tools += [t for docs in (gt.get("missed_function") or {}).values() for t in docs]
    for t in tools:
        fn = t.get("function") or t
        if fn["name"] == name:
            return list(fn.get("parameters", {}).get("properties", {}))
    raise KeyError(name)


def truth_turns(row: dict[str, Any]) -> list[list[Call]]:
    """The ground-truth calls of each user turn as ``(name, arguments)`` (BFCL positional arguments named
    after the documented parameters, in order; ToolTalk's session token left to the executor; a workplace
    row's calls in its one turn)."""
    gt = row_json(row, "ground_truth")
    if row["agent_ref"] == "workplace":  # one user turn
        return [[(c["name"], dict(c.get("arguments") or {})) for c in gt["calls"]]]
    if row["agent_ref"] == "tooltalk":
        return [[(c["api_name"], {k: v for k, v in c["parameters"].items() if k != "session_token"}) for c in turn]
                for turn in gt["calls"]]
    out = []
    for turn in gt["turns"]:
        calls = []
        for c in turn:
            names = _params(row, c["name"], gt)
            calls.append((c["name"], {**dict(zip(names, c["args"], strict=False)), **c["kwargs"]}))
        out.append(calls)
    return out


class TurnScript:
    """Plays ``script(row) -> calls per user turn``: each user turn, that turn's calls in responses of at
    most ``per_response`` calls, then a plain answer that ends the turn."""

    def __init__(self, script: Callable[[dict[str, Any]], list[list[Call]]] = truth_turns, per_response: int = 8):
        self.script, self.per_response = script, per_response

    def act(self, episodes: list[Episode]) -> list[str | None]:
        out = []
        for ep in episodes:
            turns, turn = self.script(ep.row), getattr(ep, "turn", 0)
            left = (turns[turn] if turn < len(turns) else [])[getattr(ep, "turn_attempts", 0):]
            out.append("".join(tool_call(n, a) for n, a in left[:self.per_response]) if left else "Done.")
        return out


def edited(edit: Callable[[list[list[Call]]], list[list[Call]]]) -> TurnScript:
    """The ground truth with ``edit`` applied to its turns."""
    return TurnScript(lambda row: edit(truth_turns(row)))

"""The SWE agent's system prompt and tool declarations: what an SWE task row (``agent_ref`` ``swe``)
offers the model in ``responses_create_params`` (Hub adapters and ``cascade swe_tasks`` both write
them; :mod:`validators.swe.environment` implements the tools)."""

from __future__ import annotations

from typing import Any

SYSTEM_PROMPT = ("You are a software engineer. The current directory holds a Python repository with a bug. "
                 "Find it with the tools, fix the source code with edit_file, check with run_tests, then call "
                 "submit. Call one tool per turn.")


def _tool(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


_S, _I = {"type": "string"}, {"type": "integer"}
TOOLS = [
    _tool("view_file", "Show numbered lines of a file.", {"path": _S, "start_line": _I, "end_line": _I}, ["path"]),
    _tool("search", "Regex search in the repository's text files.", {"pattern": _S, "path": _S}, ["pattern"]),
    _tool("edit_file", "Replace old_text (must occur exactly once) by new_text in a file.",
          {"path": _S, "old_text": _S, "new_text": _S}, ["path", "old_text", "new_text"]),
    _tool("run", "Run a shell command in the repository.", {"command": _S}, ["command"]),
    _tool("run_tests", "Run pytest (default: the task's tests).", {"tests": {"type": "array", "items": _S}}, []),
    _tool("submit", "Finish: the fix is done.", {}, []),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)

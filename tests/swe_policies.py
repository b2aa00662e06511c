"""Scripted SWE agent policies (the proofs' oracle, no-op and test-editing cheater) and tool-call text."""

from __future__ import annotations

import difflib
import json
import tempfile
from pathlib import Path
from typing import Any

from validators.episodes import Episode
from validators.swe.environment import SWEEnvironment


def tool_call(name: str, **arguments: Any) -> str:
    """One ``<tool_call>`` block, the format the agent parses."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def oracle_edit(original: str, buggy: str) -> tuple[str, str]:
    """``(old_text, new_text)`` turning ``buggy`` back into ``original`` with one unique replacement:
    the differing lines, widened by a line of context at a time until they occur once in ``buggy``."""
    a, b = buggy.splitlines(keepends=True), original.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    i1, i2, j1, j2 = ops[0][1], ops[-1][2], ops[0][3], ops[-1][4]
    while True:
        old, new = "".join(a[i1:i2]), "".join(b[j1:j2])
        if old and buggy.count(old) == 1:
            return old, new
        if i1 == 0 and i2 == len(a):
            return old, new
        i1, j1 = max(i1 - 1, 0), max(j1 - (i1 > 0), 0)
        i2, j2 = min(i2 + 1, len(a)), j2 + (i2 < len(a))


class ScriptedPolicy:
    """A fixed script per episode: ``script(episode) -> [response, ...]``; turn ``k`` of an episode
    gets the script's ``k``-th response (``submit`` once the script runs out). The proofs' policies:

    * :meth:`oracle` applies the known fix (from the task's snapshot and bug), runs the tests, submits;
    * :meth:`noop` submits at once;
    * :meth:`test_editor` makes the tests pass by editing them (every assert becomes ``assert True``,
      a ``conftest.py`` reports every test as passed) and submits: caught because tests are restored.
    """

    def __init__(self, script: Any):
        self.script = script

    def act(self, episodes: list[Episode]) -> list[str | None]:
        out = []
        for ep in episodes:
            turns = self.script(ep)
            out.append(turns[ep.steps] if ep.steps < len(turns) else tool_call("submit"))
        return out

    @classmethod
    def oracle(cls, env: SWEEnvironment) -> ScriptedPolicy:
        def script(ep: Episode) -> list[str]:
            with tempfile.TemporaryDirectory() as tmp:
                original = env._original(ep.task, Path(tmp) / "o")
                edits = [(path, *oracle_edit((original / path).read_text(encoding="utf-8"), buggy))
                         for path, buggy in ep.task.get("bug", {}).items()]
            return [tool_call("edit_file", path=p, old_text=o, new_text=n) for p, o, n in edits] + \
                [tool_call("run_tests"), tool_call("submit")]
        return cls(script)

    @classmethod
    def noop(cls) -> ScriptedPolicy:
        return cls(lambda ep: [tool_call("submit")])

    @classmethod
    def test_editor(cls) -> ScriptedPolicy:
        def script(ep: Episode) -> list[str]:
            path = ep.task["test_files"][0]
            return [tool_call("run", command=f"sed -i 's/^\\( *\\)assert .*/\\1assert True/' {path}"),
                    tool_call("run", command=f"cat > conftest.py <<'EOF'\n{CHEAT_CONFTEST}EOF"),
                    tool_call("submit")]
        return cls(script)


#: a conftest.py that reports every test as passed (what :meth:`ScriptedPolicy.test_editor` writes)
CHEAT_CONFTEST = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""

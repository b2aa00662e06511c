"""The SWE environment: episodes in sandboxed repository copies, the tools, and the execution reward.

The paper trains SWE RL with OpenHands; here a small documented tool set (all run inside the code
sandbox, in the episode's own copy of the repository, by :mod:`validators.swe.harness`):

==============  ========================================================================
``view_file``   ``{path, start_line?, end_line?}``: numbered lines (200 at most per call)
``search``      ``{pattern, path?}``: regex matches as ``path:line: text`` (50 at most)
``edit_file``   ``{path, old_text, new_text}``: replace ``old_text``, which must occur once
``run``         ``{command}``: ``bash -c command`` (wall clock ``tool_timeout_s``)
``run_tests``   ``{tests?}``: pytest on the given files / node ids (default: the task's tests)
``submit``      ``{}``: end the episode
==============  ========================================================================

The model calls tools in its tokenizer's tool-call format; templates without one (SmolLM2's
ChatML) get the tool list in the system prompt (:func:`corpora.chat.prompt_messages`, through
:class:`stages.environment.PromptBuilder`) and answer with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
blocks (:data:`corpora.chat.TOOL_CALL_FORMAT`), parsed by
:func:`validators.verifiers.tool_call.parse_calls`. Tool results come back as ``tool`` turns.

Reward (:meth:`SWEEnvironment.grade`): after the episode every test file (the task's test files,
any ``conftest.py``, ``test_*.py``/``*_test.py``, pytest configuration files) is restored from
the original repository (a file the agent added there is deleted), the tests run, and the reward
is 1 iff every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test passes, else 0 (SWE-bench's resolved
criterion). An episode ends on ``submit``, after ``max_steps`` model turns, past
``episode_timeout_s``, or when the context is full. One response alone (``verify``, the trainer
wrappers) is graded as a patch the same way (:class:`SWEVerifier`).

:class:`SWEEnvironment` is an episode environment of :mod:`validators.episodes` (``reset``, ``step``,
``grade``, ``close``; entry point ``swe``): episodes run with :func:`validators.episodes.run_episodes`
and any :class:`~validators.episodes.Policy` (the model: :class:`stages.policy.ModelPolicy`; a
script: the tests'). The prompt and tool declarations rows carry are in :mod:`corpora.swe_tools`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from common.answers import row_json
from corpora.chat import TOOL_CALL_FORMAT
from corpora.swe_tools import TOOL_NAMES
from validators.episodes import Episode
from validators.swe.workspace import copy_repo, run_in_workspace, run_tests, tempdir
from validators.verifiers.registry import Verdict, Verifier, fail
from validators.verifiers.sandbox import Limits
from validators.verifiers.tool_call import parse_calls

#: files restored from the original repository before grading (besides the task's test files)
PROTECTED = ("conftest.py", "test_*.py", "*_test.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")


class AgentConfig(BaseModel):
    """Episode limits (``params.yaml`` ``cascade.stages.swe_rl.agent``)."""

    model_config = ConfigDict(extra="forbid")
    max_steps: int = 6                 # model turns per episode
    episode_timeout_s: float = 300.0   # wall clock of an episode (tool time and generation)
    tool_timeout_s: float = 20.0       # one tool call
    test_timeout_s: float = 60.0       # one pytest run (run_tests, grading)
    max_calls_per_turn: int = 2        # tool calls executed per model turn
    observation_chars: int = 2000      # tool output kept (head and tail)
    mirrors: str | None = None         # dir of git mirrors for Hub rows (<owner>__<name>)


@dataclass
class SWEEpisode(Episode):
    """An agent episode on one task row: its ground truth (``task``) and its repository copy (``workdir``).
    End reasons: ``submitted``, ``max_steps``, ``timeout``, ``context``."""

    task: dict[str, Any] = field(default_factory=dict)
    workdir: Path = Path()


@dataclass
class Grade:
    """The episode's reward: 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed after the
    tests were restored; ``failing`` lists those that did not; ``restored`` the test files put back."""

    reward: float
    passed: bool
    failing: list[str]
    restored: list[str]
    status: str
    wall_s: float

    @property
    def reason(self) -> str:
        """The grade in words (:class:`validators.episodes.Grade`'s ``reason``)."""
        if self.passed:
            return "every FAIL_TO_PASS and PASS_TO_PASS test passes"
        return f"{len(self.failing)} test(s) fail ({self.status}): {', '.join(self.failing)[:200]}"


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... ({len(text) - limit} characters cut) ...\n{text[-half:]}"


def _safe_path(root: Path, rel: str) -> Path:
    """``root / rel`` with every symlink on the way replaced by a directory (a symlink the agent
    made must not redirect a host-side write)."""
    cur = root
    for part in Path(rel).parts[:-1]:
        cur = cur / part
        if cur.is_symlink() or (cur.exists() and not cur.is_dir()):
            cur.unlink()
        cur.mkdir(exist_ok=True)
    target = cur / Path(rel).name
    if target.is_symlink() or target.is_dir():
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    return target


def protected(rel: str, test_files: list[str]) -> bool:
    """Whether ``rel`` is a test or test-configuration file (restored before grading)."""
    name = Path(rel).name
    return rel in test_files or any(fnmatch.fnmatch(name, p) for p in PROTECTED)


def restore_tests(workdir: Path, original: Path, test_files: list[str]) -> list[str]:
    """Put every protected file of ``original`` back into ``workdir`` and delete protected files
    the agent added; returns the relative paths that differed (restored or deleted)."""
    changed = []
    for d, dirs, files in os.walk(workdir):
        for name in files + [x for x in dirs if Path(d, x).is_symlink()]:
            rel = str(Path(d, name).relative_to(workdir))
            if protected(rel, test_files) and not (original / rel).is_file():
                Path(d, name).unlink()
                changed.append(rel)
    for d, _, files in os.walk(original):
        for name in files:
            rel = str(Path(d, name).relative_to(original))
            if not protected(rel, test_files):
                continue
            src, dst = original / rel, workdir / rel
            if dst.is_symlink() or not dst.is_file() or dst.read_bytes() != src.read_bytes():
                shutil.copyfile(src, _safe_path(workdir, rel))
                changed.append(rel)
    return sorted(changed)


#: Environment variables that tell a verifier worker where SWE repositories are (``verify_batch`` and the
#: trainer wrappers grade a patch outside any stage config): the task set's directory, for rows with a
#: ``snapshot`` (default: the working directory), and the directory of git mirrors, for Hub rows.
ROOT_ENV, MIRRORS_ENV = "CASCADE_SWE_ROOT", "CASCADE_SWE_MIRRORS"
_FENCED_DIFF = re.compile(r"```(?:diff|patch)[ \t]*\n(.*?)```", re.S)
_DIFF_START = re.compile(r"^(?:diff --git |--- )", re.M)


def extract_patch(answer: str) -> str | None:
    """The unified diff of ``answer``: the last fenced ```` ```diff ```` (or ```` ```patch ````) block,
    else everything from the first ``diff --git`` / ``--- `` line; None when there is none."""
    fenced = _FENCED_DIFF.findall(answer)
    if fenced:
        patch = fenced[-1]
    else:
        start = _DIFF_START.search(answer)
        if start is None:
            return None
        patch = answer[start.start():]
    return patch if patch.endswith("\n") else patch + "\n"


class SWEVerifier(Verifier):
    """SWE rows (``agent_ref`` ``swe``), graded two ways. SWE RL runs whole agent episodes
    (:func:`validators.episodes.run_episodes`, :meth:`SWEEnvironment.grade`). One response, through :func:`verify`,
    ``verify_batch`` and the TRL / verl / NeMo-Gym wrappers, is graded the way SWE-bench grades a
    model patch (agentless): its final answer's unified diff (:func:`extract_patch`) is applied with
    ``git apply`` to a fresh copy of the repository (which refuses paths outside it), then graded like an
    episode (tests restored, the row's ``test_patch`` applied, every FAIL_TO_PASS and PASS_TO_PASS test
    must pass). The repository comes from ``$CASCADE_SWE_ROOT`` / ``$CASCADE_SWE_MIRRORS``
    (:data:`ROOT_ENV`, :data:`MIRRORS_ENV`); when it cannot be found the verdict is a grader error
    (``no_environment``: no verdict, never a 0). :meth:`check` validates the task."""

    def check(self, row: dict[str, Any]) -> None:
        SWEEnvironment.task(row)

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        patch = extract_patch(answer)
        if patch is None:
            return fail("no unified diff in the final answer")
        env = SWEEnvironment(os.environ.get(ROOT_ENV, "."), AgentConfig(mirrors=os.environ.get(MIRRORS_ENV)))
        try:
            ep = env.reset(row)
        except (FileNotFoundError, subprocess.CalledProcessError) as exc:
            return Verdict(0.0, False, f"no repository for the task: {exc}"[:300], error="no_environment")
        try:
            applied = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=patch.encode(),
                                     cwd=ep.workdir, capture_output=True, timeout=env.cfg.tool_timeout_s, check=False)
            if applied.returncode:
                return fail(f"the patch does not apply: {applied.stderr.decode('utf-8', 'replace').strip()[:200]}")
            grade = env.grade(ep)
        finally:
            env.close(ep)
        details = {"failing": grade.failing, "restored": grade.restored, "status": grade.status}
        if grade.passed:
            return Verdict(1.0, True, "every FAIL_TO_PASS and PASS_TO_PASS test passes", details)
        return fail(f"{len(grade.failing)} test(s) fail: {', '.join(grade.failing)[:200]}", **details)


class SWEEnvironment:
    """Episodes of SWE task rows (``agent_ref`` ``swe``): workspaces, tools, grading.

    Args:
        root: the task set's directory (``ground_truth.snapshot`` is relative to it).
        cfg: :class:`AgentConfig` (default limits when None).
    """

    def __init__(self, root: str | Path, cfg: AgentConfig | None = None):
        self.root, self.cfg = Path(root), cfg or AgentConfig()

    @staticmethod
    def task(row: dict[str, Any]) -> dict[str, Any]:
        """The row's ground truth. Raises ValueError naming the row and the missing field."""
        gt = row_json(row, "ground_truth")
        if not isinstance(gt, dict):
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth must be a JSON object")
        missing = [k for k in ("FAIL_TO_PASS", "PASS_TO_PASS") if k not in gt]
        if "snapshot" not in gt and "base_commit" not in gt:
            missing.append("snapshot or base_commit")
        if missing:
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth lacks {', '.join(missing)}")
        return gt

    def _original(self, task: dict[str, Any], dst: Path) -> Path:
        """Write the task's clean repository to ``dst`` (a snapshot, or ``git archive`` of a mirror)."""
        if "snapshot" in task:
            src = self.root / task["snapshot"]
            if not src.is_dir():
                raise FileNotFoundError(f"snapshot {src} missing: run `cascade swe_tasks` (dvc repro swe_tasks)")
            return copy_repo(src, dst)
        mirror = Path(self.cfg.mirrors or "") / task["repo"].replace("/", "__")
        if not self.cfg.mirrors or not mirror.is_dir():
            raise FileNotFoundError(f"task {task.get('instance_id')!r}: no git mirror of {task['repo']} at {mirror} "
                                    f"(git clone --mirror https://github.com/{task['repo']} {mirror}; set agent.mirrors)")
        dst.mkdir(parents=True)
        archive = subprocess.run(["git", "--git-dir", str(mirror), "archive", task["base_commit"]],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
        return dst

    def reset(self, row: dict[str, Any]) -> SWEEpisode:
        """A new episode: a fresh copy of the repository with the bug applied (nothing left behind when the
        repository cannot be found)."""
        task = self.task(row)
        base = tempdir("cascade-episode-")
        try:
            original = self._original(task, base / "original")
            workdir = copy_repo(original, base / "repo", task.get("bug", {}))
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise
        params = row["responses_create_params"]
        messages = [{"role": m["role"], "content": m["content"]} for m in params["input"]]
        return SWEEpisode(row, messages, task=task, workdir=workdir)

    def close(self, ep: SWEEpisode) -> None:
        """Delete the episode's files."""
        shutil.rmtree(ep.workdir.parent, ignore_errors=True)

    def _left(self, ep: SWEEpisode) -> float:
        return self.cfg.episode_timeout_s - (time.monotonic() - ep.t0)

    def call(self, ep: SWEEpisode, name: str, args: dict[str, Any]) -> str:
        """Run tool ``name`` in the episode's workspace; returns the observation text."""
        timeout = max(1.0, min(self.cfg.tool_timeout_s, self._left(ep)))
        limits = Limits(timeout_s=timeout, output_bytes=256 << 10)
        s = lambda key, default="": str(args.get(key, default))
        if name == "run_tests":
            tests = args.get("tests") or ep.task["test_files"]
            run = run_tests(ep.workdir, [str(t) for t in tests], ep.task.get("pythonpath", ["."]),
                            min(self.cfg.test_timeout_s, max(1.0, self._left(ep))))
            return f"[{run.status}]\n{run.output}"
        if name == "view_file":
            argv = ["harness", "view", s("path"), s("start_line", 1)] + ([s("end_line")] if "end_line" in args else [])
        elif name == "search":
            argv = ["harness", "search", s("pattern"), s("path", ".")]
        elif name == "edit_file":
            res = run_in_workspace(ep.workdir, ["harness", "edit", s("path")], limits, stdin=json.dumps(
                {"old": s("old_text"), "new": s("new_text")}).encode())
            return (res.stdout + res.stderr).decode("utf-8", "replace")
        elif name == "run":
            argv = ["bash", "-c", s("command")]
        else:
            return f"unknown tool {name!r}; tools: {', '.join(TOOL_NAMES)}"
        res = run_in_workspace(ep.workdir, argv, limits)
        head = "" if res.status == "ok" else f"[{res.status}, exit {res.returncode}]\n"
        return head + (res.stdout + res.stderr).decode("utf-8", "replace")

    def step(self, ep: SWEEpisode, response: str) -> list[dict[str, Any]]:
        """Apply one model turn: record it, run its tool calls (at most ``max_calls_per_turn``),
        append their outputs as ``tool`` turns, and end the episode when due. Returns the new tool turns."""
        ep.messages.append({"role": "assistant", "content": response})
        ep.steps += 1
        calls, malformed = parse_calls(response)
        out = [f"error: {m}" for m in malformed]
        if not calls and not malformed:
            out.append(f"No tool call found. Answer with {TOOL_CALL_FORMAT}.")
        for name, args in calls[:self.cfg.max_calls_per_turn]:
            if name == "submit":
                ep.end("submitted")
                break
            out.append(f"{name}: " + self.call(ep, name, args))
        turns = [{"role": "tool", "content": _clip(o, self.cfg.observation_chars)} for o in out]
        if not ep.done:
            ep.messages += turns
            if ep.steps >= self.cfg.max_steps:
                ep.end("max_steps")
            elif self._left(ep) <= 0:
                ep.end("timeout")
        return turns if not ep.done else []

    def grade(self, ep: SWEEpisode) -> Grade:
        """Restore the tests, run them, and score the episode (see the module doc)."""
        t0 = time.monotonic()
        task = ep.task
        with tempfile.TemporaryDirectory(prefix="cascade-grade-") as tmp:
            original = self._original(task, Path(tmp) / "original")  # read on the host only
            test_files = list(task.get("test_files", []))
            restored = restore_tests(ep.workdir, original, test_files)
            if task.get("test_patch"):  # Hub rows: the tests that check the fix (SWE-bench)
                subprocess.run(["git", "apply", "-"], input=task["test_patch"].encode(), cwd=ep.workdir,
                               capture_output=True, check=False)
            wanted = list(task["FAIL_TO_PASS"]) + list(task["PASS_TO_PASS"])
            targets = test_files or sorted({t.split("::")[0] for t in wanted})
            run = run_tests(ep.workdir, targets, task.get("pythonpath", ["."]), self.cfg.test_timeout_s)
        failing = [t for t in wanted if not run.passed(t)]
        ok = not failing and bool(wanted)
        return Grade(float(ok), ok, failing, restored, run.status, time.monotonic() - t0)


def swe_episodes(root: str | Path | None = None, **agent: Any) -> SWEEnvironment:
    """Episode environment ``swe`` (entry point ``cascade_rl.episode_environments``): an
    :class:`SWEEnvironment` over the task set ``root`` (default ``$CASCADE_SWE_ROOT``, else the working
    directory) with :class:`AgentConfig` fields ``agent`` (``mirrors`` default ``$CASCADE_SWE_MIRRORS``)."""
    agent.setdefault("mirrors", os.environ.get(MIRRORS_ENV))
    return SWEEnvironment(root or os.environ.get(ROOT_ENV, "."), AgentConfig(**agent))

"""SWE agent scaffold: tools, episodes in sandboxed repository copies, and the execution reward.

The paper trains SWE RL with OpenHands; here a small documented tool set (all run inside the code
sandbox, in the episode's own copy of the repository, by :mod:`curation.swe.harness`):

==============  ========================================================================
``view_file``   ``{path, start_line?, end_line?}``: numbered lines (200 at most per call)
``search``      ``{pattern, path?}``: regex matches as ``path:line: text`` (50 at most)
``edit_file``   ``{path, old_text, new_text}``: replace ``old_text``, which must occur once
``run``         ``{command}``: ``bash -c command`` (wall clock ``tool_timeout_s``)
``run_tests``   ``{tests?}``: pytest on the given files / node ids (default: the task's tests)
``submit``      ``{}``: end the episode
==============  ========================================================================

The model calls tools in its tokenizer's tool-call format; templates without one (SmolLM2's
ChatML) get the tool list in the system prompt (:class:`stages.environment.PromptBuilder`) and
answer with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, parsed by
:func:`validators.verifiers.tool_call.parse_calls`. Tool results come back as ``tool`` turns.

Reward (:meth:`SWEEnvironment.grade`): after the episode every test file (the task's test files,
any ``conftest.py``, ``test_*.py``/``*_test.py``, pytest configuration files) is restored from
the original repository (a file the agent added there is deleted), the tests run, and the reward
is 1 iff every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test passes, else 0 (SWE-bench's resolved
criterion). An episode ends on ``submit``, after ``max_steps`` model turns, past
``episode_timeout_s``, or when the context is full.

:class:`ModelPolicy` keeps the token-level trajectory of each episode: the model's own sampled
tokens (``loss_mask`` 1, with their log-probabilities) and the rendered tool turns (``loss_mask``
0), so multi-turn GRPO trains only the model's tokens (:mod:`stages.swe_rl`).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from curation.swe.workspace import copy_repo, run_in_workspace, run_tests, tempdir
from validators.verifiers.sandbox import Limits
from validators.verifiers.tool_call import parse_calls

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
class Trajectory:
    """Token-level record of one episode under :class:`ModelPolicy`.

    Attributes:
        prompt_ids: the first prompt (system + issue).
        ids: every token after it: model turns and rendered tool turns, in order.
        loss_mask: 1 on the model's sampled tokens, 0 on tool turns (same length as ``ids``).
        logprobs: sampler log-probability (nats) of each model token, 0.0 on tool tokens.
        truncated: some model turn hit ``max_new_tokens`` without EOS.
        n_messages: messages of the episode already in ``ids``.
    """

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    truncated: bool = False
    n_messages: int = 0
    ended_with_eos: bool = True

    def extend(self, ids: list[int], trained: bool, logprobs: list[float] | None = None) -> None:
        """Append ``ids`` with ``loss_mask`` 1 (``trained``) or 0, and their log-probabilities."""
        self.ids += ids
        self.loss_mask += [int(trained)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.ids


@dataclass
class Episode:
    """One agent episode on one task row; ``messages`` is the chat so far (system + issue first)."""

    row: dict[str, Any]
    task: dict[str, Any]
    workdir: Path
    messages: list[dict[str, Any]]
    t0: float
    steps: int = 0
    done: bool = False
    finish: str = ""
    trajectory: Trajectory | None = None

    def end(self, reason: str) -> None:
        """Mark the episode finished with ``reason`` (``submitted``, ``max_steps``, ``timeout``, ``context``)."""
        self.done, self.finish = True, self.finish or reason


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


@dataclass
class EpisodeResult:
    """What :func:`run_episodes` returns per episode."""

    uuid: str
    grade: Grade
    steps: int
    finish: str
    wall_s: float
    messages: list[dict[str, Any]]
    trajectory: Trajectory | None


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


class SWEEnvironment:
    """Episodes of SWE task rows (``agent_ref`` ``swe``): workspaces, tools, grading.

    Args:
        root: the task set's directory (``ground_truth.snapshot`` is relative to it).
        cfg: :class:`AgentConfig` (default limits when None).
    """

    def __init__(self, root: str | Path, cfg: AgentConfig | None = None):
        self.root, self.cfg = Path(root), cfg or AgentConfig()

    def task(self, row: dict[str, Any]) -> dict[str, Any]:
        """The row's ground truth. Raises ValueError naming the row and the missing field."""
        gt = row["ground_truth"]
        gt = json.loads(gt) if isinstance(gt, str) else gt
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

    def start(self, row: dict[str, Any]) -> Episode:
        """A new episode: a fresh copy of the repository with the bug applied."""
        task = self.task(row)
        base = tempdir("cascade-episode-")
        original = self._original(task, base / "original")
        workdir = copy_repo(original, base / "repo", task.get("bug", {}))
        params = row["responses_create_params"]
        messages = [{"role": m["role"], "content": m["content"]} for m in params["input"]]
        return Episode(row, task, workdir, messages, time.monotonic())

    def close(self, ep: Episode) -> None:
        """Delete the episode's files."""
        shutil.rmtree(ep.workdir.parent, ignore_errors=True)

    def _left(self, ep: Episode) -> float:
        return self.cfg.episode_timeout_s - (time.monotonic() - ep.t0)

    def call(self, ep: Episode, name: str, args: dict[str, Any]) -> str:
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

    def step(self, ep: Episode, response: str) -> list[dict[str, Any]]:
        """Apply one model turn: record it, run its tool calls (at most ``max_calls_per_turn``),
        append their outputs as ``tool`` turns, and end the episode when due. Returns the new tool turns."""
        ep.messages.append({"role": "assistant", "content": response})
        ep.steps += 1
        calls, malformed = parse_calls(response)
        out = [f"error: {m}" for m in malformed]
        if not calls and not malformed:
            out.append("No tool call found. Answer with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.")
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

    def grade(self, ep: Episode) -> Grade:
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


class Policy(Protocol):
    """Chooses the next assistant turn of each active episode."""

    def act(self, episodes: list[Episode]) -> list[str | None]:
        """One response per episode (``None``: the policy cannot continue it, e.g. a full context)."""


def run_episodes(env: SWEEnvironment, policy: Policy, rows: list[dict[str, Any]]) -> list[EpisodeResult]:
    """Run one episode per row with ``policy`` until each ends, grade them, delete their files.

    The episodes advance together (one batched policy call per turn).
    """
    episodes = [env.start(r) for r in rows]
    try:
        while active := [e for e in episodes if not e.done]:
            for ep, text in zip(active, policy.act(active), strict=True):
                if text is None:
                    ep.end("context")
                else:
                    env.step(ep, text)
        results = []
        for ep in episodes:
            grade = env.grade(ep)
            results.append(EpisodeResult(ep.row["uuid"], grade, ep.steps, ep.finish, time.monotonic() - ep.t0,
                                         ep.messages, ep.trajectory))
        return results
    finally:
        for ep in episodes:
            env.close(ep)


class ModelPolicy:
    """A causal LM acting through a rollout engine (token ids in, :class:`~stages.rollout.Rollouts` out).

    Args:
        engine: ``stages.rollout.RolloutEngine``; tokenizer: its tokenizer (chat template).
        builder: ``stages.environment.PromptBuilder`` (renders the first prompt, tools included).
        max_new_tokens: per model turn; max_context_tokens: an episode whose context would pass
            it ends (``finish`` ``context``).
        greedy: argmax decoding (evaluation) instead of sampling.
    """

    def __init__(self, engine: Any, tokenizer: Any, builder: Any, max_new_tokens: int = 128,
                 max_context_tokens: int = 4096, greedy: bool = False):
        self.engine, self.tok, self.builder = engine, tokenizer, builder
        self.max_new_tokens, self.max_context_tokens, self.greedy = max_new_tokens, max_context_tokens, greedy

    def observation_ids(self, chat: list[dict[str, Any]], new: list[dict[str, Any]], tools: Any) -> list[int]:
        """Token ids of the turns ``new`` after ``chat`` (which ends with the assistant turn the model
        sampled, EOS included), up to the next assistant header: the template's rendering of
        ``chat + new`` minus that of ``chat``, plus what the template puts after the EOS.

        Raises:
            ValueError: the template re-renders earlier turns (the rendering of ``chat`` is not a
                prefix of that of ``chat + new``), so turns cannot be appended token-exactly.
        """
        render = lambda msgs, gen: self.tok.apply_chat_template(msgs, tools=tools, tokenize=False,
                                                                add_generation_prompt=gen)
        before, after = render(chat, False), render(chat + new, True)
        if not after.startswith(before):
            raise ValueError("the chat template re-renders earlier turns: multi-turn token ids cannot be appended")
        eos = self.tok.eos_token or ""
        glue = before[before.rindex(eos) + len(eos):] if eos and eos in before else ""
        return list(self.tok(glue + after[len(before):], add_special_tokens=False)["input_ids"])

    def act(self, episodes: list[Episode]) -> list[str | None]:
        out: list[str | None] = [None] * len(episodes)
        todo = []
        for i, ep in enumerate(episodes):
            chat, tools = self.builder.messages(ep.row)
            if ep.trajectory is None:
                ep.trajectory = Trajectory(self.builder(ep.row), n_messages=len(ep.messages))
            else:
                traj = ep.trajectory
                if not traj.ended_with_eos:  # close the cut-off turn (not trained)
                    traj.extend([self.tok.eos_token_id], trained=False)
                first = len(ep.row["responses_create_params"]["input"])  # the turns `chat` renders
                history = chat + ep.messages[first:traj.n_messages]
                traj.extend(self.observation_ids(history, ep.messages[traj.n_messages:], tools), trained=False)
                traj.n_messages = len(ep.messages)
            if len(ep.trajectory.full_ids) + self.max_new_tokens <= self.max_context_tokens:
                todo.append(i)
        if todo:
            ro = self.engine.generate([episodes[i].trajectory.full_ids for i in todo], n=1, greedy=self.greedy,
                                      max_new_tokens=self.max_new_tokens)
            for k, i in enumerate(todo):
                traj = episodes[i].trajectory
                traj.extend(ro.response_ids[k], trained=True, logprobs=ro.logprobs[k])
                traj.truncated |= ro.truncated[k]
                traj.ended_with_eos = not ro.truncated[k] and bool(ro.response_ids[k])
                traj.n_messages = len(episodes[i].messages) + 1  # the assistant turn about to be appended
                out[i] = ro.texts[k]
        return out


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

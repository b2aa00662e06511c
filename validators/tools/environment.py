"""Multi-turn tool environments (:class:`validators.episodes.EpisodeEnvironment`): BFCL v4 multi-turn and
ToolTalk, the tools executed against per-episode state in a sandbox (:class:`~validators.tools.session.ToolSession`).

An episode replays the row's scripted user turns. After each user turn the model acts until it answers
without a tool call (then the next user turn comes, or the episode ends ``finished``); each of its
tool calls (:data:`corpora.chat.TOOL_CALL_FORMAT`, parsed by :func:`validators.verifiers.tool_call.parse_calls`)
runs in the episode's ``model`` world and its result comes back as a ``tool`` turn. A malformed call, a
call of a tool the row does not offer (now), or one that raises becomes an error text for the model,
never a crash. Limits (:class:`ToolEnvConfig`): calls run per model turn, model turns per user turn
(BFCL force-quits at 20) and per episode, the episode's wall clock, and the session's per-call time, CPU
and output caps; an episode past one ends with that reason (``max_steps``, ``timeout``,
``tool_timeout``, ``tool_output_limit``, ``tool_crashed``) and scores 0.

The ``reference`` world of the same sandbox runs the ground-truth calls; the reward compares the two
(:class:`BFCLEnvironment`, :class:`ToolTalkEnvironment` say how). Rows come from
:func:`corpora.adapters.tools.bfcl_multi_turn` and :func:`corpora.adapters.tools.tooltalk_episode`; the
backend's sources are read from ``<sources_root>/<ground_truth.backend>`` (``data/sources``: the
fetched packages; nothing of them is imported here).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from common.answers import row_json
from common.paths import SOURCES
from corpora.chat import TOOL_CALL_FORMAT
from validators.episodes import Episode, Grade
from validators.tools.session import SessionError, SessionLimits, ToolSession
from validators.verifiers.tool_call import parse_calls, tool_names

MAX_ERRORS = 3  # error messages per model turn for malformed calls, and for unknown tools (the rest counted)


class ToolEnvConfig(BaseModel):
    """Episode limits of the tool environments (a stage's ``environment_kwargs.episodes``)."""

    model_config = ConfigDict(extra="forbid")
    max_steps: int = 24                # model turns per episode
    max_steps_per_turn: int = 8        # model turns per user turn (BFCL's MAXIMUM_STEP_LIMIT is 20)
    max_calls_per_turn: int = 8        # tool calls executed per model turn (the rest are refused)
    episode_timeout_s: float = 120.0   # wall clock of an episode, generation included
    call_timeout_s: float = 5.0        # one tool call in the sandbox
    episode_cpu_s: int = 60            # CPU seconds of the episode's tool server
    max_output_chars: int = 2000       # a tool's result text is cut to this (head and tail kept)
    sources_root: str = str(SOURCES)   # where ground_truth.backend is looked up
    isolation_mode: str | None = None  # force bwrap | unshare | rlimits (tests); default: the best here


@dataclass
class ToolEpisode(Episode):
    """A tool episode: its sandbox ``session``, the user turn in progress (``turn``), the model turns, the calls
    that ran (offered tools, within the cap) and the well-formed calls attempted in it, the tools offered now,
    and the outputs of every model call so far."""

    session: ToolSession | None = None
    turn: int = 0
    turn_steps: int = 0
    turn_calls: int = 0
    turn_attempts: int = 0
    offered: set[str] = field(default_factory=set)
    outputs: list[str] = field(default_factory=list)
    failure: str = ""


@cache
def backend_sources(root: str) -> dict[str, str]:
    """``{relative path: text}`` of the ``.py`` files under ``root`` (read once per process)."""
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"tool backend {base} not found: run `dvc repro fetch` (or set "
                                f"environment_kwargs.episodes.sources_root)")
    return {str(p.relative_to(base)): p.read_text(encoding="utf-8") for p in sorted(base.rglob("*.py"))}


class ToolEnvironment:
    """The shared episode loop of the tool environments (module doc); subclasses say which world the
    sandbox runs, how it is loaded and reset, and how a user turn and the episode are graded."""

    world = ""

    def __init__(self, episodes: dict[str, Any] | ToolEnvConfig | None = None):
        self.cfg = episodes if isinstance(episodes, ToolEnvConfig) else ToolEnvConfig(**(episodes or {}))
        self.limits = SessionLimits(call_timeout_s=self.cfg.call_timeout_s, episode_cpu_s=self.cfg.episode_cpu_s,
                                    max_output_chars=self.cfg.max_output_chars)

    # -- what subclasses provide
    def load(self, gt: dict[str, Any]) -> dict[str, Any]:
        """The ``load`` request (backend sources) for a row's ground truth."""
        raise NotImplementedError

    def configs(self, gt: dict[str, Any]) -> dict[str, Any]:
        """The world config of a row (both worlds start from it)."""
        raise NotImplementedError

    def user_turns(self, gt: dict[str, Any]) -> list[list[dict[str, Any]]]:
        """The user turns after the first (the first is in the row's prompt)."""
        return gt.get("user_turns", [])

    def end_turn(self, ep: ToolEpisode, gt: dict[str, Any]) -> str:
        """Grade user turn ``ep.turn`` as it ends; returns the failure reason or ``""``."""
        return ""

    def final(self, ep: ToolEpisode, gt: dict[str, Any]) -> Grade:
        """The grade of an episode whose every user turn ended without failure."""
        raise NotImplementedError

    # -- the episode interface
    def backend_dir(self, gt: dict[str, Any]) -> str:
        return str(Path(self.cfg.sources_root) / gt["backend"])

    def reset(self, row: dict[str, Any]) -> ToolEpisode:
        """A new episode: a sandboxed tool server with both worlds reset to the row's initial state.

        Raises:
            ValueError: the row's ground truth is malformed (names the row). FileNotFoundError: no backend.
            SessionError: the sandbox did not start.
        """
        gt = self.task(row)
        messages = [dict(m) for m in row["responses_create_params"]["input"]]
        ep = ToolEpisode(row, messages, offered=tool_names(row))
        ep.session = ToolSession(self.world, limits=self.limits, isolation_mode=self.cfg.isolation_mode)
        try:
            config = self.configs(gt)
            for op, fields in (("load", self.load(gt)), ("reset", {"world": "model", "config": config}),
                               ("reset", {"world": "reference", "config": config})):
                reply = ep.session.request(op, **fields)
                if "error" in reply:
                    raise ValueError(f"row {row.get('uuid')!r}: the tool backend refused the row: {reply['error']}")
        except BaseException:
            ep.session.close()
            raise
        return ep

    @staticmethod
    def task(row: dict[str, Any]) -> dict[str, Any]:
        """The row's ground truth object. Raises ValueError naming the row and the missing field."""
        gt = row_json(row, "ground_truth")
        if not isinstance(gt, dict) or "backend" not in gt:
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth must be an object with 'backend'")
        return gt

    def _out_of_time(self, ep: ToolEpisode) -> bool:
        return time.monotonic() - ep.t0 > self.cfg.episode_timeout_s

    def step(self, ep: ToolEpisode, response: str) -> list[dict[str, Any]]:
        """Apply one model turn (module doc); returns the tool turns or the next user turn, ``[]`` at the end."""
        ep.messages.append({"role": "assistant", "content": response})
        ep.steps += 1
        ep.turn_steps += 1
        gt = self.task(ep.row)
        calls, malformed = parse_calls(response)
        ep.turn_attempts += len(calls)
        out: list[str] = [f"error: {m}. Call a tool with {TOOL_CALL_FORMAT}." for m in malformed[:MAX_ERRORS]]
        if len(malformed) > MAX_ERRORS:
            out.append(f"error: {len(malformed) - MAX_ERRORS} more malformed tool calls")
        unknown = 0
        try:
            for k, (name, args) in enumerate(calls):
                if k >= self.cfg.max_calls_per_turn:
                    out.append(f"error: at most {self.cfg.max_calls_per_turn} tool calls run per turn; "
                               f"{len(calls) - k} not run")
                    break
                if name not in ep.offered:
                    unknown += 1
                    if unknown <= MAX_ERRORS:
                        out.append(f"error: unknown tool {name!r}; tools: {', '.join(sorted(ep.offered))}")
                    continue
                ep.turn_calls += 1  # a call that ran (an offered tool, within the cap)
                result = ep.session.call("model", name, kwargs=args)
                ep.outputs.append(result)
                out.append(result)
            if unknown > MAX_ERRORS:
                out.append(f"error: {unknown - MAX_ERRORS} more calls of unknown tools")
            if not calls and not malformed:  # an answer: the user turn ends
                return self._next_turn(ep, gt)
        except SessionError as exc:
            ep.end(exc.reason)
            ep.failure = str(exc)
            return []
        turns = [{"role": "tool", "content": o} for o in out]
        ep.messages += turns
        if ep.turn_steps >= self.cfg.max_steps_per_turn or ep.steps >= self.cfg.max_steps:
            ep.end("max_steps")
        elif self._out_of_time(ep):
            ep.end("timeout")
        return [] if ep.done else turns

    def _next_turn(self, ep: ToolEpisode, gt: dict[str, Any]) -> list[dict[str, Any]]:
        failure = self.end_turn(ep, gt)
        if failure:
            ep.failure = failure
            ep.end("turn_failed")
            return []
        turns = self.user_turns(gt)
        if ep.turn >= len(turns):
            ep.end("finished")
            return []
        new = [dict(m) for m in turns[ep.turn]]
        ep.turn += 1
        ep.turn_steps = ep.turn_calls = ep.turn_attempts = 0
        added = (gt.get("missed_function") or {}).get(str(ep.turn)) or []
        if added:  # BFCL miss_func: the held-out functions are offered from this turn on
            ep.offered |= {(t.get("function") or t)["name"] for t in added}
            docs = "\n".join(json.dumps(t.get("function") or t) for t in added)
            new = [{"role": "user", "content": f"New tools you can call now:\n<tools>\n{docs}\n</tools>\n"
                                               + (new[0]["content"] if new else "")}] + new[1:]
        ep.messages += new
        if ep.steps >= self.cfg.max_steps:
            ep.end("max_steps")
        elif self._out_of_time(ep):
            ep.end("timeout")
        return [] if ep.done else new

    def grade(self, ep: ToolEpisode) -> Grade:
        """1.0 iff the episode ``finished`` (every user turn done) and :meth:`final` passes; else 0 with
        the reason (the turn that failed, or the limit that ended it)."""
        if ep.finish != "finished":
            why = ep.failure or f"the episode ended: {ep.finish or 'not finished'}"
            return Grade(0.0, False, why, {"finish": ep.finish, "turn": ep.turn})
        try:
            return self.final(ep, self.task(ep.row))
        except SessionError as exc:
            return Grade(0.0, False, f"grading failed: {exc}", {"finish": exc.reason})

    def close(self, ep: ToolEpisode) -> None:
        """Kill the episode's sandbox."""
        if ep.session is not None:
            ep.session.close()

"""One episode's tool backends in their own sandbox: a long-lived :mod:`validators.tools.server`
process that holds the episode's state, and the host side that talks to it.

The backend code (BFCL's classes, ToolTalk's APIs: third-party code) runs only in that process, under
the code sandbox of :mod:`validators.verifiers.sandbox` (bubblewrap: no network, read-only
filesystem, own uid; rlimits; one memory cgroup). The host sends JSON requests and reads one JSON
line back per request, with a deadline per request (``call_timeout_s``) and a cap on the reply
(``max_reply_bytes``). A request past either, or a server that dies, ends the session:
:class:`SessionError` says why (``tool_timeout``, ``tool_output_limit``, ``tool_crashed``); the episode
then ends with that reason (its state is gone). The process's CPU seconds are capped at
``episode_cpu_s`` for its whole life (``RLIMIT_CPU``).
"""

from __future__ import annotations

import json
import os
import select
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validators.verifiers import sandbox
from validators.verifiers.sandbox import Limits, Program

HERE = Path(__file__).parent
#: the interpreter's site-packages, visible read-only in the sandbox (BFCL's math backend imports mpmath)
SITE = sysconfig.get_paths()["purelib"]


@dataclass(frozen=True)
class SessionLimits:
    """Limits of one episode's tool server.

    Attributes:
        call_timeout_s: wall clock of one request (a tool call, a reset, a comparison).
        episode_cpu_s: CPU seconds of the server over its life.
        memory_bytes: its address space and its cgroup's memory cap.
        max_output_chars: a tool's result text is cut to this (head and tail kept) by the server.
        max_reply_bytes: a reply line longer than this ends the session (``tool_output_limit``).
    """

    call_timeout_s: float = 5.0
    episode_cpu_s: int = 60
    memory_bytes: int = 1 << 30
    max_output_chars: int = 4000
    max_reply_bytes: int = 1 << 20


class SessionError(RuntimeError):
    """The session ended: ``reason`` is ``tool_timeout``, ``tool_output_limit`` or ``tool_crashed``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class ToolSession:
    """A tool server for one episode, started at once.

    Args:
        world: the sandbox-side world module shipped with the server (``bfcl_world``, ``tooltalk_world``).
        files: more files for the sandbox's working directory (``{name: text}``, no sub-directories).
        limits: :class:`SessionLimits`.
        isolation_mode: force ``bwrap`` | ``unshare`` | ``rlimits`` (tests); default: the sandbox's probe.

    Raises:
        SessionError: the server did not start (``tool_crashed``).
    """

    def __init__(self, world: str, files: dict[str, str] | None = None, limits: SessionLimits | None = None,
                 isolation_mode: str | None = None):
        self.limits = limits or SessionLimits()
        shipped = {"server.py": (HERE / "server.py").read_text(), f"{world}.py": (HERE / f"{world}.py").read_text()}
        to_server, from_server = os.pipe(), os.pipe()
        lim = Limits(timeout_s=float(self.limits.episode_cpu_s), cpu_s=self.limits.episode_cpu_s,
                     memory_bytes=self.limits.memory_bytes, total_memory_bytes=self.limits.memory_bytes)
        program = Program({**shipped, **(files or {})},
                          ["-I", "server.py", world, str(to_server[0]), str(from_server[1]), SITE],
                          fds=(to_server[0], from_server[1]))
        self._in, self._out = to_server[1], from_server[0]
        self._buf = b""
        self.proc = sandbox.launch(program, lim, isolation_mode, ro_binds=(SITE,))
        self.closed = False
        if self.proc.proc is None:
            self.close()
            raise SessionError("tool_crashed", f"the tool sandbox did not start: {self.proc.error.decode()[:300]}")
        self.isolation = self.proc.mode
        hello = self._read(self.limits.call_timeout_s * 4)
        if hello != {"started": True}:
            self.close()
            raise SessionError("tool_crashed", f"the tool server did not start: {hello!r}")

    def _read(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise SessionError("tool_timeout", f"a tool call ran past {timeout_s:g} s")
            poller = select.poll()  # poll: no FD_SETSIZE limit with many episodes open
            poller.register(self._out, select.POLLIN | select.POLLHUP)
            if not poller.poll(left * 1000):
                continue
            chunk = os.read(self._out, 1 << 16)
            if not chunk:
                self.close()
                raise SessionError("tool_crashed", "the tool server ended")
            self._buf += chunk
            if len(self._buf) > self.limits.max_reply_bytes:
                self.close()
                raise SessionError("tool_output_limit", f"a tool reply passed {self.limits.max_reply_bytes} bytes")
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return the server's reply.

        Raises:
            SessionError: the reply did not come in time, was too long, or the server is gone.
        """
        if self.closed:
            raise SessionError("tool_crashed", "the tool session is closed")
        msg = (json.dumps({"op": op, **fields}) + "\n").encode()
        try:
            view = memoryview(msg)
            while view:
                view = view[os.write(self._in, view):]
        except OSError as exc:
            self.close()
            raise SessionError("tool_crashed", f"the tool server is gone: {exc}") from None
        return self._read(self.limits.call_timeout_s)

    def call(self, world: str, name: str, args: list[Any] | None = None,
             kwargs: dict[str, Any] | None = None) -> str:
        """The text result of tool ``name`` in ``world`` (``model`` | ``reference``)."""
        reply = self.request("call", world=world, name=name, args=args or [], kwargs=kwargs or {},
                             max_output_chars=self.limits.max_output_chars)
        return str(reply.get("output", reply.get("error", "")))

    def close(self) -> None:
        """Kill the server and free its sandbox (idempotent)."""
        if self.closed:
            return
        self.closed = True
        for fd in (self._in, self._out):
            try:
                os.close(fd)
            except OSError:
                pass
        self.proc.kill()
        if self.proc.proc is not None:
            for stream in (self.proc.proc.stdout, self.proc.proc.stderr):
                stream.close()
        self.proc.finish(None, b"", b"")

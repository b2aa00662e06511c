"""``verify_batch`` and ``VerifierPool``: verdicts for many responses, in worker processes, each under a
wall-clock limit (``verify_batch`` starts a pool per call; a ``VerifierPool`` keeps its workers between calls).

Workers are fresh interpreters (``python -c`` running :func:`_serve` on two pipe fds, pickled
messages), so callers need no ``if __name__ == "__main__"`` guard and nothing of the caller's
state is forked. Each worker imports the verifiers once, says it is ready, then
grades one sample at a time; the parent hands out samples, waits on the pipes and, when a sample
passes ``timeout_s`` (counted from hand-out), kills that worker (SIGKILL; code sandboxes die with
it through bubblewrap's ``--die-with-parent``; the host directories of weaker isolations are swept)
and starts a fresh one. A sample that hangs
(math-verify on a pathological expression, a regex blow-up) or crashes its worker gets reward 0
with the reason, and the batch goes on. This process-level limit is what makes math-verify's
disabled ``signal.alarm`` timeouts safe (those only work in a main thread).
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from common.plugins import UnknownPlugin
from validators.verifiers.registry import Verdict, fail, verify
from validators.verifiers.sandbox import sweep

READY = "ready"
START_TIMEOUT_S = 120.0
BURST_AFTER_S = 0.5  # a sample queued this long with every worker busy gets a worker of its own
WORKER_MAIN = "import sys; from validators.verifiers.batch import _serve; _serve(int(sys.argv[1]), int(sys.argv[2]))"


def _serve(rfd: int, wfd: int) -> None:
    """Worker loop: receive ``(i, response, row)``, send ``(i, Verdict)``; ``None`` ends it."""
    from common import plugins
    from validators.verifiers.registry import get_verifier

    for name in plugins.names("verifiers"):  # every installed verifier, out-of-tree ones too, warm, before READY
        try:
            get_verifier(name).warmup()
        except Exception:  # noqa: BLE001 (a broken plugin fails the rows that name it, with its error)
            pass

    inbox, outbox = Connection(rfd, writable=False), Connection(wfd, readable=False)
    outbox.send(READY)
    while True:
        try:
            task = inbox.recv()
        except EOFError:
            return
        if task is None:
            return
        i, response, row = task
        try:
            verdict = verify(response, row)
        except UnknownPlugin as exc:  # not the response's fault: no verdict, never a silent 0
            verdict = Verdict(0.0, False, f"UnknownPlugin: {exc}"[:500], error="unknown_verifier")
        except Exception as exc:  # one bad sample never stops the batch
            verdict = fail(f"{type(exc).__name__}: {exc}"[:500])
        outbox.send((i, verdict))


@dataclass
class _Task:
    """One sample handed to the pool by a caller, and what came of it."""

    response: str
    row: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    verdict: Verdict | None = None
    error: BaseException | None = None

    def settle(self, verdict: Verdict | None = None, error: BaseException | None = None) -> None:
        self.verdict, self.error = verdict, error
        self.done.set()


def _limit_memory(memory_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    return apply


@dataclass
class _Worker:
    proc: subprocess.Popen
    send: Connection
    recv: Connection
    ready: bool = False
    task: _Task | None = None
    since: float = 0.0  # when its task was handed out
    deadline: float = 0.0

    @classmethod
    def start(cls, memory_bytes: int) -> _Worker:
        """Launch a worker (it is ``ready`` once it says so, within ``START_TIMEOUT_S``)."""
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        proc = subprocess.Popen([sys.executable, "-c", WORKER_MAIN, str(to_child_r), str(from_child_w)],
                                pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL,
                                preexec_fn=_limit_memory(memory_bytes))
        os.close(to_child_r)
        os.close(from_child_w)
        return cls(proc, Connection(to_child_w, readable=False), Connection(from_child_r, writable=False),
                   deadline=time.monotonic() + START_TIMEOUT_S)

    def hand(self, task: _Task, timeout_s: float) -> None:
        self.task, self.since = task, time.monotonic()
        self.deadline = self.since + timeout_s
        self.send.send((0, task.response, task.row))

    def stop(self, kill: bool) -> None:
        if not kill:
            try:
                self.send.send(None)
            except OSError:
                kill = True
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if kill:  # its sandboxes' host directories (non-bubblewrap isolations): its finally blocks never ran
            sweep(self.proc.pid)
        self.send.close()
        self.recv.close()


class VerifierPool:
    """Verifier worker processes that stay up between calls (what :func:`verify_batch` starts per call).

    Trainer-side rewards (``validators.rewards``) grade a few samples per call, thousands of times:
    a pool pays the worker start-up (an interpreter importing every verifier, about a second) once.
    Callers may be concurrent (a trainer's reward threads): their samples share one queue, served
    in order by a dispatcher thread; a sample's ``timeout_s`` counts from hand-out to a worker.
    When samples wait and every worker has been busy on one for ``BURST_AFTER_S``, the pool starts
    another worker (up to ``max_workers``), so one caller's slow answer holds one worker, never
    another caller's answers (those wait at most ``BURST_AFTER_S`` plus a worker start-up, while
    ``max_workers`` is not reached); workers beyond ``workers`` stop once the queue is empty. Each
    worker's address space is capped (``RLIMIT_AS`` = ``memory_bytes``: a verifier's allocation
    over it is a ``MemoryError``, reward 0; code runs in sandboxes with their own caps). A process
    forked after the pool started gets fresh workers on first use (the parent's are never shared).

    Args:
        workers: worker processes kept up.
        timeout_s: wall-clock seconds per sample, from hand-out to verdict.
        max_workers: most worker processes at once; default ``2 * workers``.
        memory_bytes: ``RLIMIT_AS`` of each worker, default 4 GiB.

    Raises:
        ValueError: ``workers < 1`` or ``max_workers < workers``.
    """

    def __init__(self, workers: int = 2, timeout_s: float = 10.0, max_workers: int | None = None,
                 memory_bytes: int = 4 << 30):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        max_workers = 2 * workers if max_workers is None else max_workers
        if max_workers < workers:
            raise ValueError(f"max_workers ({max_workers}) must be >= workers ({workers})")
        self.workers, self.timeout_s, self.max_workers, self.memory_bytes = workers, timeout_s, max_workers, memory_bytes
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        """Fresh state (at start, after a fork, after close): no workers, no dispatcher."""
        self._pid = os.getpid()
        self._pool: list[_Worker] = []
        self._queue: deque[_Task] = deque()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)

    def _forked(self) -> bool:
        """In a process forked after the pool started: the workers, pipes, thread and lock belong to
        the parent (the lock may have been held at the fork), so start afresh. Returns whether so."""
        if os.getpid() == self._pid:
            return False
        self._lock = threading.Lock()
        self._reset()
        return True

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the dispatcher and the workers (a later :meth:`verify` starts new ones)."""
        if self._forked():
            return
        with self._lock:
            thread, self._closing = self._thread, True
            os.write(self._wake_w, b"x")
        if thread is not None:
            thread.join()
        with self._lock:
            for w in self._pool:
                if w.task is not None:
                    w.task.settle(error=RuntimeError("verifier pool closed"))
                w.stop(kill=not w.ready or w.task is not None)
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self._reset()

    def verify(self, responses: list[str], rows: list[dict[str, Any]]) -> list[Verdict]:
        """One :class:`Verdict` per response, ``responses[i]`` graded against ``rows[i]``.

        Returns:
            ``len(responses)`` verdicts in input order; a sample that raised, timed out or killed its
            worker has reward 0 and the reason.

        Raises:
            ValueError: ``responses`` and ``rows`` differ in length.
            RuntimeError: a worker cannot start.
        """
        if len(responses) != len(rows):
            raise ValueError(f"{len(responses)} responses but {len(rows)} rows")
        tasks = [_Task(r, row) for r, row in zip(responses, rows)]
        if not tasks:
            return []
        self._forked()
        with self._lock:
            self._queue.extend(tasks)
            if self._thread is None:
                self._thread = threading.Thread(target=self._dispatch, name="verifier-pool", daemon=True)
                self._thread.start()
            os.write(self._wake_w, b"x")
        for t in tasks:
            t.done.wait()
        for t in tasks:
            if t.error is not None:
                raise t.error
        return [t.verdict for t in tasks]  # type: ignore[misc]

    def _dispatch(self) -> None:
        """The dispatcher thread: hand queued samples to idle workers, start and retire workers,
        collect verdicts, kill a worker at its sample's deadline."""
        while True:
            with self._lock:
                if self._closing:
                    for t in self._queue:
                        t.settle(error=RuntimeError("verifier pool closed"))
                    self._queue.clear()
                    return
                self._assign()
                waiting = [w for w in self._pool if w.task is not None or not w.ready]
                wake = [w.deadline for w in waiting]
                if self._queue and len(self._pool) < self.max_workers and (burst := self._burst_at()) is not None:
                    wake.append(burst)
            timeout = max(0.0, min(wake) - time.monotonic()) if wake else None
            ready = wait([w.recv for w in waiting] + [self._wake_r], timeout=timeout)
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            with self._lock:
                for w in waiting:
                    self._collect(w, w.recv in ready)

    def _assign(self) -> None:
        idle = [w for w in self._pool if w.ready and w.task is None]
        while self._queue and idle:
            idle.pop().hand(self._queue.popleft(), self.timeout_s)
        wanted = self.workers if self._queue else 0
        if self._queue and (burst := self._burst_at()) is not None and time.monotonic() >= burst:
            wanted = len(self._pool) + 1  # a slow answer holds a worker and others wait: one more
        while len(self._pool) < min(wanted, self.max_workers):
            try:
                self._pool.append(_Worker.start(self.memory_bytes))
            except OSError as exc:
                self._fail_queue(RuntimeError(f"verifier worker did not start: {exc}"))
                return
        if not self._queue:  # retire the extra idle workers
            for w in [w for w in self._pool if w.ready and w.task is None][: max(0, len(self._pool) - self.workers)]:
                self._pool.remove(w)
                w.stop(kill=False)

    def _burst_at(self) -> float | None:
        """When to start one more worker for the queue: ``BURST_AFTER_S`` after the oldest hand-out,
        if every worker is started and busy (None: some worker is starting or idle)."""
        if not self._pool or any(not w.ready or w.task is None for w in self._pool):
            return None
        return min(w.since for w in self._pool) + BURST_AFTER_S

    def _fail_queue(self, error: BaseException) -> None:
        for t in self._queue:
            t.settle(error=error)
        self._queue.clear()

    def _collect(self, w: _Worker, readable: bool) -> None:
        """Take ``w``'s message if ``readable``; replace it when it died or passed its deadline."""
        if readable:
            try:
                msg = w.recv.recv()
                if not w.ready:
                    w.ready = msg == READY
                    if w.ready:
                        return
                    raise EOFError
                w.task.settle(msg[1])
                w.task = None
                return
            except (EOFError, OSError):
                reason = f"verifier process died (exit code {w.proc.poll()})"
        elif time.monotonic() >= w.deadline:
            reason = f"timeout after {self.timeout_s:g}s"
        else:
            return
        self._pool.remove(w)
        w.stop(kill=True)
        if w.task is not None:
            w.task.settle(fail(reason))
        elif not self._pool:  # it never started, and no other worker is left to serve the queue
            self._fail_queue(RuntimeError(f"verifier worker did not start ({reason})"))


def verify_batch(responses: list[str], rows: list[dict[str, Any]], timeout_s: float = 10.0,
                 workers: int = 2) -> list[Verdict]:
    """One :class:`Verdict` per response, ``responses[i]`` graded against ``rows[i]``, by a
    :class:`VerifierPool` started for this call and stopped after it.

    Args:
        responses: raw model outputs (reasoning included).
        rows: canonical RL rows (``agent_ref`` picks the verifier).
        timeout_s: wall-clock seconds per sample, from hand-out to verdict (worker start-up excluded).
        workers: worker processes (at most one per sample).

    Returns:
        ``len(responses)`` verdicts in input order; a sample that raised, timed out or killed its
        worker has reward 0 and the reason.

    Raises:
        ValueError: ``responses`` and ``rows`` differ in length, or ``workers < 1``.
        RuntimeError: a worker cannot start, or a verdict is missing at the end (checked).
    """
    with VerifierPool(workers, timeout_s) as pool:
        return pool.verify(responses, rows)

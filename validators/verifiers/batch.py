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

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from common.plugins import UnknownPlugin
from validators.verifiers.registry import Verdict, fail, verify
from validators.verifiers.sandbox import sweep

READY = "ready"
START_TIMEOUT_S = 120.0
WORKER_MAIN = "import sys; from validators.verifiers.batch import _serve; _serve(int(sys.argv[1]), int(sys.argv[2]))"


def _serve(rfd: int, wfd: int) -> None:
    """Worker loop: receive ``(i, response, row)``, send ``(i, Verdict)``; ``None`` ends it."""
    from common import plugins
    from validators.verifiers.registry import get_verifier

    for name in plugins.names("verifiers"):  # every installed verifier, out-of-tree ones too, before READY
        try:
            get_verifier(name)
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
class _Worker:
    proc: subprocess.Popen
    send: Connection
    recv: Connection
    task: int | None = None
    deadline: float = 0.0

    @classmethod
    def start(cls) -> _Worker:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        proc = subprocess.Popen([sys.executable, "-c", WORKER_MAIN, str(to_child_r), str(from_child_w)],
                                pass_fds=(to_child_r, from_child_w), env=env,
                                stdin=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        worker = cls(proc, Connection(to_child_w, readable=False), Connection(from_child_r, writable=False))
        if not worker.recv.poll(START_TIMEOUT_S) or worker.recv.recv() != READY:
            worker.stop(kill=True)
            raise RuntimeError(f"verifier worker did not start (exit code {proc.poll()})")
        return worker

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
    Calls are serialized by a lock (safe from a trainer's reward threads); a process forked after the
    pool started gets fresh workers on first use (the parent's pipes are never shared).

    Args:
        workers: worker processes (at most one per sample of a call).
        timeout_s: wall-clock seconds per sample, from hand-out to verdict.

    Raises:
        ValueError: ``workers < 1``.
    """

    def __init__(self, workers: int = 2, timeout_s: float = 10.0):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers, self.timeout_s = workers, timeout_s
        self._pool: list[_Worker] = []
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (a later :meth:`verify` starts new ones)."""
        with self._lock:
            pool, self._pool = (self._pool if os.getpid() == self._pid else []), []
            for w in pool:
                w.stop(kill=False)

    def verify(self, responses: list[str], rows: list[dict[str, Any]]) -> list[Verdict]:
        """One :class:`Verdict` per response, ``responses[i]`` graded against ``rows[i]``.

        Returns:
            ``len(responses)`` verdicts in input order; a sample that raised, timed out or killed its
            worker has reward 0 and the reason.

        Raises:
            ValueError: ``responses`` and ``rows`` differ in length.
            RuntimeError: a worker cannot start, or a verdict is missing at the end (checked).
        """
        if len(responses) != len(rows):
            raise ValueError(f"{len(responses)} responses but {len(rows)} rows")
        with self._lock:
            if os.getpid() != self._pid:  # forked: the workers and their pipes belong to the parent
                self._pool, self._pid = [], os.getpid()
            try:
                return self._run(responses, rows)
            except BaseException:
                for w in self._pool:
                    w.stop(kill=True)
                self._pool = []
                raise

    def _run(self, responses: list[str], rows: list[dict[str, Any]]) -> list[Verdict]:
        out: list[Verdict | None] = [None] * len(responses)
        todo = list(range(len(responses)))[::-1]
        while len(self._pool) < min(self.workers, len(responses)):
            self._pool.append(_Worker.start())
        pool = self._pool
        while todo or any(w.task is not None for w in pool):
            for w in pool:
                if w.task is None and todo:
                    w.task = todo.pop()
                    w.send.send((w.task, responses[w.task], rows[w.task]))
                    w.deadline = time.monotonic() + self.timeout_s
            busy = [w for w in pool if w.task is not None]
            ready = wait([w.recv for w in busy], timeout=max(0.0, min(w.deadline for w in busy) - time.monotonic()))
            for k, w in enumerate(pool):
                if w.task is None:
                    continue
                if w.recv in ready:
                    try:
                        i, verdict = w.recv.recv()
                        out[i], w.task = verdict, None
                        continue
                    except (EOFError, OSError):
                        reason = f"verifier process died (exit code {w.proc.poll()})"
                elif time.monotonic() >= w.deadline:
                    reason = f"timeout after {self.timeout_s:g}s"
                else:
                    continue
                out[w.task] = fail(reason)
                w.stop(kill=True)
                pool[k] = _Worker.start()
        missing = [i for i, v in enumerate(out) if v is None]
        if missing:
            raise RuntimeError(f"no verdict for samples {missing[:10]}")
        return out  # type: ignore[return-value]


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

"""Repository workspaces and sandboxed commands in them (SWE tasks and agent episodes).

A workspace is a host directory holding one copy of a repository. :func:`run_in_workspace` runs a
command in it under the code sandbox of :mod:`validators.verifiers.sandbox` (same isolation
probe, rlimits, process-group kill, output caps, scrubbed environment); unlike
``run_python`` it keeps the directory, so edits persist between the steps of an episode. The
directory is bound at ``/sandbox``; the tool harness (:mod:`validators.swe.harness`) and the
host's pytest (its ``site-packages``) are bound read-only, nothing else of the host is visible
under bubblewrap. When the grader is root the tree is chowned to ``nobody`` first (the sandbox
drops to that uid).

:func:`run_tests` runs pytest with ``-rA`` and parses the per-test outcomes from its short
summary (``PASSED tests/test_x.py::test_a``), as SWE-bench's log parser does.
"""

from __future__ import annotations

import os
import re
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from validators.verifiers import sandbox
from validators.verifiers.sandbox import Limits, RunResult

HARNESS = Path(__file__).with_name("harness.py")
SITE = sysconfig.get_paths()["purelib"]
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ([^\s\[]\S*)", re.MULTILINE)  # not "SKIPPED [1] ..."


def _own(root: Path) -> None:
    """Give ``root`` and everything below it to uid ``nobody`` (only when running as root).

    Raises:
        PermissionError: an ancestor of ``root`` is not traversable by others (make workspaces
            with :func:`tempdir`).
    """
    if os.geteuid() != 0:
        return
    blocked = [str(p) for p in root.parents if not p.stat().st_mode & 0o001]
    if blocked:
        raise PermissionError(f"workspace {root}: {blocked[0]} is not traversable by uid {sandbox.NOBODY}")
    for d, dirs, files in os.walk(root):
        for name in [d, *(os.path.join(d, n) for n in dirs + files)]:
            os.lchown(name, sandbox.NOBODY, sandbox.NOBODY)


def tempdir(prefix: str, parent: str | Path | None = None) -> Path:
    """A new temporary directory that the sandbox uid may traverse (mode 0711: ``mkdtemp``'s 0700
    would stop uid ``nobody`` from reaching a workspace below it)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.chmod(0o711)
    return path


def copy_repo(src: str | Path, dst: str | Path, files: dict[str, str] | None = None) -> Path:
    """Copy directory ``src`` to the new directory ``dst`` (symlinks kept as links), then write
    ``files`` (``{relative path: text}``, e.g. a task's buggy files) over it. Returns ``dst``.

    Raises:
        FileExistsError: ``dst`` exists. ValueError: a path of ``files`` leaves ``dst``.
    """
    dst = Path(dst)
    shutil.copytree(src, dst, symlinks=True)
    for rel, text in (files or {}).items():
        target = (dst / rel).resolve()
        if not target.is_relative_to(dst.resolve()):
            raise ValueError(f"file {rel!r} is outside the repository")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return dst


def run_in_workspace(workdir: str | Path, argv: list[str], limits: Limits | None = None, stdin: bytes = b"",
                     isolation_mode: str | None = None) -> RunResult:
    """Run ``argv`` with ``workdir`` as the working directory, inside the sandbox.

    ``argv[0]`` may be ``"python"`` (the sandbox interpreter, isolated mode) or ``"harness"``
    (``python -I`` on the tool harness). Returns the sandbox's :class:`RunResult` (status ``ok``,
    ``runtime_error``, ``timeout``, ``output_limit`` or ``sandbox_error``); never raises for what
    the command does.

    Raises:
        ValueError: unknown ``isolation_mode``.
    """
    limits = limits or Limits()
    mode = isolation_mode or sandbox.isolation()
    if mode not in sandbox.ISOLATIONS:
        raise ValueError(f"isolation_mode {mode!r}: expected one of {sandbox.ISOLATIONS}")
    workdir = Path(workdir).resolve()
    _own(workdir)
    if argv[0] == "harness":
        argv = [sandbox.interpreter(), "-I", str(HARNESS), *argv[1:]]
    elif argv[0] == "python":
        argv = [sandbox.interpreter(), "-I", *argv[1:]]
    return sandbox.run_in_directory(str(workdir), argv, limits=limits, isolation_mode=mode, stdin=stdin,
                                    ro_binds=(str(HARNESS), SITE))


@dataclass
class TestRun:
    """Outcome of one pytest run: ``outcomes`` ``{node id: PASSED | FAILED | ERROR | SKIPPED | XFAIL |
    XPASS}``, the sandbox ``status``, and the combined output text (capped by the sandbox)."""

    outcomes: dict[str, str]
    status: str
    output: str
    wall_s: float = 0.0
    failed: list[str] = field(default_factory=list)

    def passed(self, test_id: str) -> bool:
        """Whether ``test_id`` ran and passed (a missing test counts as not passed)."""
        return self.outcomes.get(test_id) == "PASSED"


def parse_pytest_summary(output: str) -> dict[str, str]:
    """``{node id: outcome}`` from pytest's ``-rA`` short summary; an id reported twice (a test that
    passed and then errored in teardown) keeps its worst outcome."""
    rank = {"PASSED": 0, "XFAIL": 0, "SKIPPED": 0, "XPASS": 1, "FAILED": 2, "ERROR": 3}
    out: dict[str, str] = {}
    for outcome, node in OUTCOME.findall(output):
        if node not in out or rank[outcome] > rank[out[node]]:
            out[node] = outcome
    return out


def run_tests(workdir: str | Path, tests: list[str], pythonpath: list[str], timeout_s: float = 60.0,
              isolation_mode: str | None = None) -> TestRun:
    """Run pytest on ``tests`` (files or node ids) in ``workdir`` inside the sandbox.

    Args:
        pythonpath: directories (relative to the repository) put first on ``sys.path`` (``["src"]``).
        timeout_s: wall clock of the whole run; a timeout leaves the unreported tests missing.
    """
    limits = Limits(timeout_s=timeout_s, memory_bytes=2 << 30, output_bytes=4 << 20)
    res = run_in_workspace(workdir, ["harness", "pytest", SITE, *pythonpath, "--", *tests], limits,
                           isolation_mode=isolation_mode)
    text = (res.stdout + res.stderr).decode("utf-8", errors="replace")
    outcomes = parse_pytest_summary(text)
    failed = sorted(t for t, o in outcomes.items() if o in ("FAILED", "ERROR"))
    return TestRun(outcomes, res.status, text, res.wall_s, failed)

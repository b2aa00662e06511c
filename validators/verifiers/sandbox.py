"""Run untrusted Python in sandboxes: own uid, rlimits, wall clock, capped output and disk, no network.

Every sandboxed process gets a scrubbed environment (``PATH``, ``HOME``, ``LANG``,
``PYTHONDONTWRITEBYTECODE`` only), the interpreter in isolated mode (``python -I``), and these layers:

* **its own uid** (when the grader is root): every process started here runs as a fresh uid
  ``UID_BASE + (pid * UID_SLOTS + n) % UID_SPAN`` (:func:`run_uid`), so ``RLIMIT_NPROC``, which Linux
  counts per uid, is a limit of that run alone: a fork bomb in one sample cannot stop a concurrent
  sample from starting. Linux does not enforce ``RLIMIT_NPROC`` for root, even inside a user
  namespace, hence the drop. A non-root grader runs every sandbox as its own uid: concurrent runs
  then share one process limit, and a run that could not start says so (``sandbox_error``).
* **rlimits**: CPU seconds, address space, file size, process count, no core files.
* **wall clock**: the process starts a new session; at the deadline the whole process group is
  killed with SIGKILL. Sleeping or interrupt-swallowing programs (no CPU use) die too.
* **output cap**: stdout and stderr are read while the process runs (``selectors``); once either
  passes ``output_bytes`` that process's group is killed (status ``output_limit``), so a print loop
  never grows the grader's memory; the other programs of a :func:`run_group` go on.
* **one memory cap for the whole run** (``Limits.total_memory_bytes``): a memory cgroup per run
  (:mod:`validators.verifiers.cgroup`) holds every process of the program and the pages of its
  tmpfs mounts; no allocation gets past the cap, and the supervisor, checking every ``WATCH_S``,
  kills the whole run once it hit the cap (status ``memory_limit``). Where no cgroup can be made,
  it sums the resident memory of the run's process group instead (the tmpfs mounts are
  size-capped on their own).
* **integers print whole**: ``-X int_max_str_digits=0`` (``INTERPRETER_FLAGS``; a correct program
  printing a 6000-digit integer is not a ``ValueError``); the time and memory caps bound the cost.
* **isolation**, the first that works on this machine (probed once, see :func:`isolation`):

  - ``bwrap``: Debian's bubblewrap, ``--unshare-all`` (user, pid, net, ipc, uts, cgroup
    namespaces), ``--die-with-parent``, all capabilities dropped. The filesystem is ``/usr``,
    ``/lib*``, ``/bin``, ``/sbin`` (and the interpreter's prefix) read-only, ``/dev``, ``/proc``, and
    three size-capped tmpfs, ``/sandbox`` (the working directory), ``/tmp`` and ``/dev/shm``, each at
    most ``Limits.disk_bytes``; the root and ``/dev`` are remounted read-only, so nothing else is
    writable. The program's files are copied in from memory (``--ro-bind-data`` of a
    memfd, read-only): no host directory is created, so nothing is left behind when a grader is
    killed, and nothing the program writes reaches the host's disk. No ``--new-session``: the
    sandbox stays in its launcher's process group so that one ``killpg`` reaches every process.
  - ``unshare``: util-linux ``unshare --user --map-root-user --net --pid --fork --kill-child``:
    no network, all processes die with the namespace; the files live in a host temporary
    directory ``cascade-sbx-<grader pid>-*`` (removed after the run, or by :func:`sweep` when the
    grader was killed); the host filesystem is visible with the permissions of the run's uid.
  - ``rlimits``: neither of the above is permitted; network and filesystem are only limited by
    the uid's permissions.

Which isolation ran is reported (``RunResult.isolation``). :func:`require` makes a weaker one an
error: training and difficulty filtering require ``bwrap`` by default, so code is never run with
less isolation than the step asked for.
"""

from __future__ import annotations

import functools
import glob
import itertools
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from validators.verifiers import cgroup

NOBODY = 65534
INSIDE_DIR = "/sandbox"
ISOLATIONS = ("bwrap", "unshare", "rlimits")  # strongest first
REQUIRE_ENV = "CASCADE_SANDBOX_REQUIRE"
UID_BASE, UID_SPAN, UID_SLOTS = 1 << 20, 1 << 30, 64
TMP_PREFIX = "cascade-sbx-"
INTERPRETER_FLAGS = ("-X", "int_max_str_digits=0")  # before every Program.argv
WATCH_S = 0.1  # process-group memory watch period without a cgroup, seconds
PAGE = os.sysconf("SC_PAGE_SIZE")
_uid_counter = itertools.count()
_uid_lock = threading.Lock()


class SandboxUnavailable(RuntimeError):
    """The isolation a step requires (:func:`require`) does not work on this machine."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed process.

    Attributes:
        timeout_s: wall-clock seconds before the process group is killed.
        cpu_s: ``RLIMIT_CPU`` seconds; ``None`` = ``int(timeout_s) + 2``.
        memory_bytes: ``RLIMIT_AS`` (address space), default 1 GiB.
        file_bytes: ``RLIMIT_FSIZE`` (largest file the program may write), default 16 MiB.
        nproc: ``RLIMIT_NPROC`` (processes of the run's uid), default 64.
        output_bytes: cap on captured stdout and on stderr, each; default 1 MiB.
        disk_bytes: size of each writable tmpfs (``/sandbox``, ``/tmp``, ``/dev/shm``) under bwrap;
            default 64 MiB.
        total_memory_bytes: memory of all the run's processes and its tmpfs pages together, default
            1 GiB (see the module doc).
    """

    timeout_s: float = 10.0
    cpu_s: int | None = None
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    nproc: int = 64
    output_bytes: int = 1 << 20
    disk_bytes: int = 64 << 20
    total_memory_bytes: int = 1 << 30


@dataclass
class RunResult:
    """What one sandboxed process did.

    Attributes:
        status: ``ok`` (exit code 0), ``runtime_error`` (other exit code or signal),
            ``timeout`` (wall clock), ``output_limit`` (stdout/stderr over the cap),
            ``memory_limit`` (killed at ``Limits.total_memory_bytes``) or ``sandbox_error`` (the
            process could not be started).
        returncode: the exit code (negative: killed by that signal); None if not started.
        stdout, stderr: captured bytes, at most ``Limits.output_bytes`` each.
        wall_s: seconds from start to reaped.
        isolation: ``bwrap`` | ``unshare`` | ``rlimits``.
        memory_peak_bytes: the run's largest memory use (its cgroup's peak), None without a cgroup.
    """

    status: str
    returncode: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    isolation: str
    memory_peak_bytes: int | None = None


@dataclass
class Program:
    """One process to start in its own sandbox (:func:`run_group`).

    Attributes:
        files: ``{name: content}`` placed in the working directory (no sub-directories).
        argv: the interpreter's arguments, e.g. ``["-I", "solution.py"]``.
        stdin: bytes fed on standard input, or a file descriptor (a pipe end) to use as stdin.
        fds: further descriptors the process keeps at the same numbers (pipes to another sandbox).
            Descriptors given here (and an ``int`` stdin) are closed in this process once the
            program is launched, so that a pipe reads end-of-file when its other side exits.
        uid: the uid it runs as (:func:`run_uid` by default).
    """

    files: dict[str, str | bytes]
    argv: list[str]
    stdin: bytes | int = b""
    fds: tuple[int, ...] = ()
    uid: int = field(default_factory=lambda: run_uid())


def run_uid() -> int:
    """A uid for one sandboxed process: ``UID_BASE + (pid * UID_SLOTS + n) % UID_SPAN`` with ``n``
    a per-process counter, so no two live sandboxes of this host share it (up to ``UID_SLOTS``
    concurrent ones per grader process). Only a root grader can switch to it; others keep theirs."""
    if os.geteuid() != 0:
        return os.geteuid()
    with _uid_lock:
        n = next(_uid_counter) % UID_SLOTS
    return UID_BASE + (os.getpid() * UID_SLOTS + n) % UID_SPAN


def _world_executable(path: str) -> bool:
    """Whether any uid can execute ``path`` (o+x on the file and every parent)."""
    p = Path(path)
    if not p.is_file() or not p.stat().st_mode & stat.S_IXOTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in p.parents)


@functools.lru_cache(maxsize=1)
def interpreter() -> str:
    """The Python the sandbox runs: this interpreter's base executable, or, when the grader is
    root and that is not reachable by other uids (e.g. under ``/root``), ``python3.X`` on PATH
    (same minor version required).

    Raises:
        RuntimeError: no usable interpreter.
    """
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if os.geteuid() != 0 or _world_executable(base):
        return base
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = shutil.which(minor, path="/usr/local/bin:/usr/bin:/bin")
    if found and _world_executable(os.path.realpath(found)):
        return os.path.realpath(found)
    raise RuntimeError(f"no {minor} that an unprivileged uid can execute (the grader runs as root; "
                       f"{base} is not world-executable)")


def _bwrap_prefix(workdir: str | None, limits: Limits, binds: list[str] = ()) -> list[str]:
    """bubblewrap's arguments up to the command: ``workdir`` bound at ``/sandbox`` (read-write), or,
    when None, a tmpfs of ``limits.disk_bytes`` there; then ``binds`` (more mount arguments); then
    the root and ``/dev`` remounted read-only (mount points must exist before)."""
    py_root = str(Path(interpreter()).parents[1])
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr"]
    for d in ("/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        args += ["--ro-bind-try", d, d]
    if not py_root.startswith("/usr"):
        args += ["--ro-bind", py_root, py_root]
    size = ["--size", str(limits.disk_bytes)]
    args += ["--dev", "/dev", *size, "--tmpfs", "/dev/shm", "--proc", "/proc", *size, "--tmpfs", "/tmp"]
    args += ["--bind", workdir, INSIDE_DIR] if workdir else [*size, "--tmpfs", INSIDE_DIR]
    return args + list(binds) + ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", INSIDE_DIR]


def _command(isolation: str, workdir: str, argv: list[str], limits: Limits) -> tuple[list[str], str]:
    """The full command line and the working directory path the program sees."""
    if isolation == "bwrap":
        return _bwrap_prefix(workdir, limits) + argv, INSIDE_DIR
    if isolation == "unshare":
        return ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"] + argv, workdir
    return argv, workdir


def _env(cwd_inside: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": cwd_inside, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def _preexec(limits: Limits, uid: int, group: cgroup.MemoryCgroup | None):
    cpu = limits.cpu_s if limits.cpu_s is not None else int(limits.timeout_s) + 2

    def apply() -> None:
        if group is not None:  # before the uid drop: only the grader's uid may write cgroup.procs
            group.join()
        if os.geteuid() == 0:
            os.setgid(uid)
            os.setgroups([])
            os.setuid(uid)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _kill_group(pgid: int, wait_s: float) -> None:
    """SIGKILL process group ``pgid`` until it is empty (a fork loop may add members meanwhile)."""
    end = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if time.monotonic() >= end:
            return
        time.sleep(0.01)


def _memfd(name: str, content: bytes) -> int:
    fd = os.memfd_create(name, 0)
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class _Launched:
    """A started sandboxed process (or one that failed to start), its memory cgroup and the host
    directory it holds."""

    def __init__(self, cmd: list[str], cwd: str, inside: str, stdin: int, pass_fds: tuple[int, ...],
                 limits: Limits, uid: int, mode: str, workdir: str | None = None):
        self.mode, self.workdir, self.start = mode, workdir, time.monotonic()
        self.proc: subprocess.Popen | None = None
        self.error = b""
        self.group = cgroup.create(limits.total_memory_bytes)
        try:
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=_env(inside), stdin=stdin, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True, pass_fds=pass_fds,
                                         preexec_fn=_preexec(limits, uid, self.group))
        except (OSError, subprocess.SubprocessError) as exc:
            self.error = f"{type(exc).__name__}: {exc}".encode()

    def over_memory(self, limits: Limits) -> bool:
        """Whether the run reached its memory cap: its cgroup hit the limit (the kernel may stall or
        kill only part of it, so the supervisor ends the whole run), or, without one, its process
        group's resident memory is over ``limits.total_memory_bytes``."""
        if self.group is not None:
            return self.group.hit_limit()
        return _group_rss(self.proc.pid) > limits.total_memory_bytes

    def kill(self) -> None:
        """SIGKILL the process group now (it is reaped by :meth:`finish`)."""
        if self.proc is not None:
            _kill_group(self.proc.pid, wait_s=0.0)

    def finish(self, status: str | None, out: bytes, err: bytes) -> RunResult:
        """Kill what is left of the group, reap, remove the work directory and the cgroup."""
        if self.proc is None:
            if self.workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            if self.group is not None:
                self.group.remove()
            return RunResult("sandbox_error", None, b"", self.error, 0.0, self.mode)
        _kill_group(self.proc.pid, wait_s=0.0)  # the leader becomes a zombie; its group stays addressable
        self.proc.wait()
        # Anything the program left in its group, SIGKILLed again for 50 ms (a process forked while
        # the first signal was sent). A killed bubblewrap sandbox takes 1-2 s to be torn down by the
        # kernel (pid namespace), but its processes are already dead to the world (SIGKILL cannot
        # be caught or outlived by a fork), so the grader moves on.
        _kill_group(self.proc.pid, wait_s=0.05)
        if self.workdir:  # only now: the program may have written into it until killed
            shutil.rmtree(self.workdir, ignore_errors=True)
        rc = self.proc.returncode
        peak = None
        if self.group is not None:
            peak = self.group.peak_bytes()
            if status is None and rc != 0 and self.group.hit_limit():
                status = "memory_limit"
            self.group.remove()
        if status is None:
            status = "ok" if rc == 0 else "runtime_error"
        return RunResult(status, rc, out, err, time.monotonic() - self.start, self.mode, peak)


def _launch(program: Program, limits: Limits, mode: str, ro_binds: tuple[str, ...] = ()) -> _Launched:
    """Start ``program``: under bwrap its files are memfds bound read-only into a tmpfs (and the host
    paths ``ro_binds`` read-only at the same paths), else they are written to a host temporary
    directory owned by the run's uid."""
    own: list[int] = []  # descriptors made here, closed once the child has them
    data = {n: c.encode() if isinstance(c, str) else c for n, c in program.files.items()}
    workdir = None
    try:
        if mode == "bwrap":
            binds = [a for p in ro_binds for a in ("--ro-bind", p, p)]
            for name, content in data.items():
                own.append(_memfd(name, content))
                binds += ["--ro-bind-data", str(own[-1]), f"{INSIDE_DIR}/{name}"]
            cmd = _bwrap_prefix(None, limits, binds) + [interpreter(), *INTERPRETER_FLAGS, *program.argv]
            cwd, inside = "/", INSIDE_DIR
        else:
            workdir = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
            for name, content in data.items():
                Path(workdir, name).write_bytes(content)
            if os.geteuid() == 0:
                for p in [workdir, *(os.path.join(workdir, n) for n in data)]:
                    os.chown(p, program.uid, program.uid)
            cmd, inside = _command(mode, workdir, [interpreter(), *INTERPRETER_FLAGS, *program.argv], limits)
            cwd = workdir
        if isinstance(program.stdin, int):
            stdin = program.stdin
        else:
            own.append(stdin := _memfd("stdin", program.stdin))
        return _Launched(cmd, cwd, inside, stdin, tuple(own) + tuple(program.fds), limits, program.uid, mode,
                         workdir)
    finally:
        for fd in own + list(program.fds) + ([program.stdin] if isinstance(program.stdin, int) else []):
            os.close(fd)


def _group_rss(pgid: int) -> int:
    """Resident bytes of every process in group ``pgid`` (``/proc/<pid>/stat``: pgrp, rss in pages)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[21]) * PAGE
    return total


def _supervise(launched: list[_Launched], limits: Limits) -> list[RunResult]:
    """Read every process's stdout and stderr (capped) until all are closed or the deadline (every
    group killed; ``timeout`` for those not done). A process over the output cap or the memory cap
    (checked every ``WATCH_S``) is killed alone; the others go on."""
    bufs = [[bytearray(), bytearray()] for _ in launched]
    status: list[str | None] = [None] * len(launched)
    deadline = min(x.start for x in launched) + limits.timeout_s
    watched = [k for k, x in enumerate(launched) if x.proc is not None]
    next_watch = time.monotonic()
    with selectors.DefaultSelector() as sel:
        for k, x in enumerate(launched):
            if x.proc is not None:
                sel.register(x.proc.stdout, selectors.EVENT_READ, (k, 0))
                sel.register(x.proc.stderr, selectors.EVENT_READ, (k, 1))

        def stop(k: int, why: str) -> None:
            status[k] = why
            launched[k].kill()
            for key in list(sel.get_map().values()):
                if key.data[0] == k:
                    sel.unregister(key.fileobj)

        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                for key in sel.get_map().values():
                    status[key.data[0]] = "timeout"
                break
            if watched and now >= next_watch:
                next_watch = now + WATCH_S
                for k in watched:
                    if status[k] is None and launched[k].over_memory(limits):
                        stop(k, "memory_limit")
            wake = min(deadline, next_watch)
            for key, _ in sel.select(timeout=max(0.0, wake - time.monotonic())):
                k, which = key.data
                if status[k] is not None:
                    continue
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[k][which]
                room = limits.output_bytes - len(buf)
                buf += chunk[:room]
                if len(chunk) > room:
                    stop(k, "output_limit")
    for x in launched:
        if x.proc is not None:
            x.proc.stdout.close()
            x.proc.stderr.close()
    return [x.finish(s, bytes(b[0]), bytes(b[1])) for x, s, b in zip(launched, status, bufs)]


def run_group(programs: list[Program], limits: Limits, isolation_mode: str | None = None) -> list[RunResult]:
    """Start every program in its own sandbox at once and supervise them under one wall clock.

    Programs talk through pipes the caller made and passed in ``Program.stdin``/``Program.fds``
    (this process's copies of those ends are closed as each program starts). The run ends when
    every program has closed its stdout and stderr, or at the deadline (every group killed, status
    ``timeout`` for those still open); a program over the output or memory cap is killed alone
    (``output_limit``, ``memory_limit``) and the others go on.

    Returns:
        one :class:`RunResult` per program, in order; never raises for what the programs do.

    Raises:
        ValueError: unknown ``isolation_mode``. SandboxUnavailable: see :func:`isolation`.
    """
    mode = isolation_mode or isolation()
    if mode not in ISOLATIONS:
        raise ValueError(f"isolation_mode {mode!r}: expected one of {ISOLATIONS}")
    return _supervise([_launch(p, limits, mode) for p in programs], limits)


def launch(program: Program, limits: Limits, isolation_mode: str | None = None,
           ro_binds: tuple[str, ...] = ()) -> _Launched:
    """Start ``program`` in its own sandbox and return at once: a long-lived process (a tool server,
    :mod:`validators.tools.session`) that the caller talks to over the pipes of ``Program.fds``. The
    caller owns it: ``kill()`` then ``finish(None, b"", b"")`` ends it, removes its files and its
    memory cgroup. ``ro_binds``: host paths visible read-only under bwrap.

    Raises:
        ValueError: unknown ``isolation_mode``. SandboxUnavailable: see :func:`isolation`.
    """
    mode = isolation_mode or isolation()
    if mode not in ISOLATIONS:
        raise ValueError(f"isolation_mode {mode!r}: expected one of {ISOLATIONS}")
    return _launch(program, limits, mode, ro_binds)


def run_python(files: dict[str, str | bytes], script: str, *, args: list[str] = (), stdin: bytes = b"",
               limits: Limits = Limits(), isolation_mode: str | None = None) -> RunResult:
    """Run ``python -I <script> [args]`` in a fresh sandbox holding ``files``.

    Args:
        files: ``{name: content}`` placed in the working directory.
        script: the file (one of ``files``) to run.
        args: extra command-line arguments.
        stdin: bytes fed on standard input (any size).
        limits: resource limits.
        isolation_mode: force ``bwrap`` | ``unshare`` | ``rlimits`` (tests); default :func:`isolation`.

    Returns:
        RunResult; never raises for anything the program does.

    Raises:
        ValueError: ``script`` not in ``files``, or an unknown ``isolation_mode``.
    """
    if script not in files:
        raise ValueError(f"script {script!r} is not among the files")
    return run_group([Program(files, ["-I", script, *args], stdin)], limits, isolation_mode)[0]


def run_in_directory(workdir: str, argv: list[str], *, limits: Limits, isolation_mode: str,
                     ro_binds: tuple[str, ...] = (), stdin: bytes = b"") -> RunResult:
    """Run ``argv`` (interpreter first) as uid ``nobody`` with the host directory ``workdir`` as its
    read-write working directory (``/sandbox`` under bwrap) and ``ro_binds`` visible read-only at
    the same paths (bwrap). For SWE workspaces, whose edits persist between runs: the caller owns
    ``workdir`` (chowned to ``nobody``) and its disk use."""
    cmd, inside = _command(isolation_mode, workdir, argv, limits)
    if isolation_mode == "bwrap":
        cmd = _bwrap_prefix(workdir, limits, [a for p in ro_binds for a in ("--ro-bind", p, p)]) + argv
    stdin_fd = _memfd("stdin", stdin)
    try:
        launched = _Launched(cmd, workdir, inside, stdin_fd, (), limits, NOBODY, isolation_mode)
    finally:
        os.close(stdin_fd)
    return _supervise([launched], limits)[0]


def sweep(pid: int) -> int:
    """Remove the temporary directories of grader process ``pid`` (call it after killing that
    process: its ``finally`` blocks did not run), and the memory cgroups of graders that are gone
    (:func:`cgroup.sweep`). Returns how many temporary directories were removed."""
    found = glob.glob(os.path.join(tempfile.gettempdir(), f"{TMP_PREFIX}{pid}-*"))
    for path in found:
        shutil.rmtree(path, ignore_errors=True)
    cgroup.sweep()
    return len(found)


def require(level: str | None) -> str:
    """Make ``level`` (``bwrap`` | ``unshare`` | ``rlimits``; None or ``rlimits``: anything) the
    weakest isolation this process and the verifier workers it starts may use (environment
    variable ``CASCADE_SANDBOX_REQUIRE``), and check it now.

    Returns:
        the isolation that will run.

    Raises:
        ValueError: unknown level.
        SandboxUnavailable: the best isolation here is weaker, with what to install.
    """
    if level is not None and level not in ISOLATIONS:
        raise ValueError(f"sandbox.require {level!r}: expected one of {ISOLATIONS} or null")
    os.environ[REQUIRE_ENV] = level or "rlimits"
    return isolation()


class SandboxParams(BaseModel):
    """``params.yaml: sandbox``: ``require`` is the weakest isolation generated code may run under
    (``bwrap`` | ``unshare`` | ``rlimits``; null: anything)."""

    model_config = ConfigDict(extra="forbid")
    require: Literal["bwrap", "unshare", "rlimits"] | None = "bwrap"

    @classmethod
    def from_block(cls, block: dict[str, Any] | None) -> SandboxParams:
        """The ``sandbox`` block of a raw ``params.yaml`` dict (``cascade train`` reads the file unchecked).

        Raises:
            ValueError: naming the params key, e.g. ``params.yaml sandbox.require: Input should be ...``.
        """
        try:
            return cls.model_validate(block or {})
        except ValidationError as exc:
            from common.io import params_error  # polars and pyarrow: not for the verifier workers

            raise params_error(exc, cls, prefix=("sandbox",)) from None


def require_from_params(params: SandboxParams) -> str:
    """:func:`require` with ``params.require``: what the DVC steps that run generated code (synthesize,
    difficulty, train) call before any work.

    Raises:
        SandboxUnavailable: the best isolation here is weaker, with what to install.
    """
    return require(params.require)


@functools.lru_cache(maxsize=1)
def _probe() -> str:
    for mode in ISOLATIONS[:-1]:
        if mode == "bwrap" and not shutil.which("bwrap") or mode == "unshare" and not shutil.which("unshare"):
            continue
        probe = run_python({"p.py": "print('ok')"}, "p.py", limits=Limits(timeout_s=10), isolation_mode=mode)
        if probe.status == "ok" and probe.stdout.strip() == b"ok":
            return mode
    return "rlimits"


def isolation() -> str:
    """The strongest isolation that works here: ``bwrap``, else ``unshare``, else ``rlimits``
    (each probed once per process with a trivial program that must print ``ok``).

    Raises:
        SandboxUnavailable: it is weaker than the level :func:`require` set (``CASCADE_SANDBOX_REQUIRE``).
    """
    mode = _probe()
    wanted = os.environ.get(REQUIRE_ENV) or "rlimits"
    if wanted in ISOLATIONS and ISOLATIONS.index(mode) > ISOLATIONS.index(wanted):
        raise SandboxUnavailable(
            f"code sandbox: {wanted!r} isolation is required (params sandbox.require) but only {mode!r} "
            f"works here; install bubblewrap (`apt-get install bubblewrap`) and allow unprivileged user "
            f"namespaces, or set sandbox.require: {mode} to run generated code with less isolation")
    return mode

"""Run untrusted Python in a sandbox: process group, rlimits, wall clock, capped output, no network.

Every run gets a fresh temporary working directory (``/sandbox`` inside bubblewrap), a scrubbed
environment (``PATH``, ``HOME``, ``LANG``, ``PYTHONDONTWRITEBYTECODE`` only), the interpreter in
isolated mode (``python -I``), and these layers:

* **rlimits** (always): CPU seconds, address space, file size and process count
  (``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``). When the grader runs as root
  the child drops to uid/gid 65534 (``nobody``) first: Linux does not enforce ``RLIMIT_NPROC``
  for root, even inside a user namespace (checked on this machine: 60 forks under a limit of 32).
  The process-count limit is per uid, so concurrent sandboxes share it.
* **wall clock**: the child starts a new session; at the deadline the whole process group is
  killed with SIGKILL. Sleeping or interrupt-swallowing programs (no CPU use) die too.
* **output cap**: stdout and stderr are read while the child runs (``selectors``); once either
  passes ``output_bytes`` the group is killed and the run ends with status ``output_limit``, so a
  print loop never grows the grader's memory.
* **isolation**, the first that works on this machine (probed once, see :func:`isolation`):

  - ``bwrap``: Debian's bubblewrap, ``--unshare-all`` (user, pid, net, ipc, uts, cgroup
    namespaces), ``--die-with-parent``; no ``--new-session``: the sandbox must stay in the
    grader's process group so that one ``killpg`` reaches every process (it has no controlling
    terminal anyway, the session being new); the filesystem is ``/usr``, ``/lib*``,
    ``/bin``, ``/sbin`` (and the interpreter's prefix) read-only, a private ``/tmp``, ``/dev``,
    ``/proc`` and the work directory: nothing else of the host is visible or writable.
  - ``unshare``: util-linux ``unshare --user --map-root-user --net --pid --fork --kill-child``:
    no network, all processes die with the namespace; the host filesystem is visible with the
    permissions of the (unprivileged) user.
  - ``rlimits``: none of the above is permitted; network and filesystem are only limited by
    the user's permissions. The verdict reports it, so a caller can refuse such runs.

The result names the isolation that ran (``RunResult.isolation``).
"""

from __future__ import annotations

import functools
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534
INSIDE_DIR = "/sandbox"
ISOLATIONS = ("bwrap", "unshare", "rlimits")


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run.

    Attributes:
        timeout_s: wall-clock seconds before the process group is killed.
        cpu_s: ``RLIMIT_CPU`` seconds; ``None`` = ``ceil(timeout_s) + 1``.
        memory_bytes: ``RLIMIT_AS`` (address space), default 1 GiB.
        file_bytes: ``RLIMIT_FSIZE`` (largest file the program may write), default 16 MiB.
        nproc: ``RLIMIT_NPROC`` (processes of the sandbox uid), default 64.
        output_bytes: cap on captured stdout and on stderr, each; default 1 MiB.
    """

    timeout_s: float = 10.0
    cpu_s: int | None = None
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    nproc: int = 64
    output_bytes: int = 1 << 20


@dataclass
class RunResult:
    """What one sandboxed run did.

    Attributes:
        status: ``ok`` (exit code 0), ``runtime_error`` (other exit code or signal),
            ``timeout`` (wall clock), ``output_limit`` (stdout/stderr over the cap) or
            ``sandbox_error`` (the sandbox itself failed to start).
        returncode: the child's exit code (negative: killed by that signal); None if not started.
        stdout, stderr: captured bytes, at most ``Limits.output_bytes`` each.
        wall_s: seconds from start to reaped.
        isolation: ``bwrap`` | ``unshare`` | ``rlimits``.
        files: contents of the files the caller asked back (``collect``), read after the run.
    """

    status: str
    returncode: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    isolation: str
    files: dict[str, bytes] = field(default_factory=dict)


def _drop_to_nobody() -> bool:
    return os.geteuid() == 0


def _world_executable(path: str) -> bool:
    """Whether uid ``nobody`` can execute ``path`` (o+x on the file and every parent)."""
    p = Path(path)
    if not p.is_file() or not p.stat().st_mode & stat.S_IXOTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in p.parents)


@functools.lru_cache(maxsize=1)
def interpreter() -> str:
    """The Python the sandbox runs: this interpreter's base executable, or, when the grader is
    root and that is not reachable by ``nobody`` (e.g. under ``/root``), ``python3.X`` on PATH
    (same minor version required).

    Raises:
        RuntimeError: no usable interpreter.
    """
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if not _drop_to_nobody() or _world_executable(base):
        return base
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = shutil.which(minor, path="/usr/local/bin:/usr/bin:/bin")
    if found and _world_executable(os.path.realpath(found)):
        return os.path.realpath(found)
    raise RuntimeError(f"no {minor} that uid {NOBODY} can execute (the grader runs as root; "
                       f"{base} is not world-executable)")


def _bwrap_prefix(workdir: str) -> list[str]:
    py_root = str(Path(interpreter()).parents[1])
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr"]
    for d in ("/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        args += ["--ro-bind-try", d, d]
    if not py_root.startswith("/usr"):
        args += ["--ro-bind", py_root, py_root]
    return args + ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                   "--bind", workdir, INSIDE_DIR, "--chdir", INSIDE_DIR]


def _command(isolation: str, workdir: str, argv: list[str]) -> tuple[list[str], str]:
    """The full command line and the working directory path the program sees."""
    if isolation == "bwrap":
        return _bwrap_prefix(workdir) + argv, INSIDE_DIR
    if isolation == "unshare":
        return ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"] + argv, workdir
    return argv, workdir


def _preexec(limits: Limits):
    cpu = limits.cpu_s if limits.cpu_s is not None else int(limits.timeout_s) + 2

    def apply() -> None:
        if _drop_to_nobody():
            os.setgid(NOBODY)
            os.setgroups([])
            os.setuid(NOBODY)
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


def _execute(cmd: list[str], cwd: str, env: dict[str, str], stdin_path: str, limits: Limits,
             isolation: str) -> RunResult:
    start = time.monotonic()
    with open(stdin_path, "rb") as stdin:
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=_preexec(limits), close_fds=True)
        except OSError as exc:
            return RunResult("sandbox_error", None, b"", str(exc).encode(), 0.0, isolation)
    out = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    status = None
    deadline = start + limits.timeout_s
    with selectors.DefaultSelector() as sel:
        for f in out:
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = out[key.fileobj]
                room = limits.output_bytes - len(buf)
                buf += chunk[:room]
                if len(chunk) > room:
                    status = "output_limit"
            if status:
                break
    _kill_group(proc.pid, wait_s=0.0)  # the leader becomes a zombie; its group stays addressable
    proc.wait()
    # Anything the program left behind in its group, SIGKILLed again until gone or for 0.5 s: a
    # killed bubblewrap sandbox takes 1-2 s to be torn down by the kernel (pid namespace), but its
    # processes are already dead to the world (SIGKILL cannot be caught), so the grader moves on.
    _kill_group(proc.pid, wait_s=0.5)
    for f in out:
        f.close()
    rc = proc.returncode
    if status is None:
        status = "ok" if rc == 0 else "runtime_error"
    return RunResult(status, rc, bytes(out[proc.stdout]), bytes(out[proc.stderr]),
                     time.monotonic() - start, isolation)


def run_python(files: dict[str, str | bytes], script: str, *, args: list[str] = (), stdin: bytes = b"",
               limits: Limits = Limits(), collect: tuple[str, ...] = (),
               isolation_mode: str | None = None) -> RunResult:
    """Run ``python -I <script> [args]`` in a fresh sandbox directory holding ``files``.

    Args:
        files: ``{relative name: content}`` written into the work directory first.
        script: the file (one of ``files``) to run.
        args: extra command-line arguments.
        stdin: bytes fed on standard input (from a file, so any size).
        limits: resource limits.
        collect: work-directory files whose bytes come back in ``RunResult.files`` (at most
            ``limits.file_bytes`` each; a missing file is absent).
        isolation_mode: force ``bwrap`` | ``unshare`` | ``rlimits`` (tests); default :func:`isolation`.

    Returns:
        RunResult; never raises for anything the program does.

    Raises:
        ValueError: ``script`` not in ``files``, or an unknown ``isolation_mode``.
    """
    if script not in files:
        raise ValueError(f"script {script!r} is not among the files")
    mode = isolation_mode or isolation()
    if mode not in ISOLATIONS:
        raise ValueError(f"isolation_mode {mode!r}: expected one of {ISOLATIONS}")
    workdir = tempfile.mkdtemp(prefix="cascade-sbx-")
    try:
        for name, content in files.items():
            path = Path(workdir, name)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
        stdin_path = os.path.join(workdir, ".stdin")
        Path(stdin_path).write_bytes(stdin)
        os.chmod(stdin_path, 0o400)
        if _drop_to_nobody():
            for p in [workdir, *(os.path.join(workdir, n) for n in files)]:
                os.chown(p, NOBODY, NOBODY)
        cmd, cwd = _command(mode, workdir, [interpreter(), "-I", script, *args])
        env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        result = _execute(cmd, workdir, env, stdin_path, limits, mode)
        for name in collect:
            path = Path(workdir, name)
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as f:
                    result.files[name] = f.read(limits.file_bytes)
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@functools.lru_cache(maxsize=1)
def isolation() -> str:
    """The strongest isolation that works here: ``bwrap``, else ``unshare``, else ``rlimits``.

    Each candidate is probed once per process with a trivial program (a probe must print ``ok``).
    """
    for mode in ISOLATIONS[:-1]:
        if mode == "bwrap" and not shutil.which("bwrap") or mode == "unshare" and not shutil.which("unshare"):
            continue
        probe = run_python({"p.py": "print('ok')"}, "p.py", limits=Limits(timeout_s=10), isolation_mode=mode)
        if probe.status == "ok" and probe.stdout.strip() == b"ok":
            return mode
    return "rlimits"

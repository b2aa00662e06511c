"""Memory cgroups for sandboxed runs: every process of one run, and the tmpfs pages it writes, under one cap.

``RLIMIT_AS`` bounds one process; a sample may start dozens. A memory cgroup bounds them all
together, and the kernel charges the pages of the sandbox's tmpfs mounts (``/tmp``, ``/sandbox``,
``/dev/shm``) to the cgroup of the process that wrote them, so the cap is the run's whole footprint
on host memory. Over it, the kernel's OOM killer kills inside the cgroup only.

Both hierarchies are supported: cgroup v1 (``/sys/fs/cgroup/memory/<own path>``, files
``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes``, ``memory.failcnt``) and cgroup v2
(``/sys/fs/cgroup/<own path>`` with ``memory`` in its ``cgroup.subtree_control``, files
``memory.max``, ``memory.swap.max``, ``memory.events``). Each run gets a child cgroup
``cascade-sbx-<grader pid>-<n>`` of the grader's own, created before the sandbox starts and joined by
the child before it executes anything (:meth:`MemoryCgroup.join`); removed after the run (a killed
bubblewrap sandbox takes a second or two to leave it, so removal is retried on later runs and at
exit; :func:`sweep` removes those of dead graders). Where no memory cgroup can be created (a
non-root grader without a delegated cgroup), :func:`create` returns None and the sandbox falls back
to watching the run's process group (``sandbox._supervise``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import re
import threading
from pathlib import Path

PREFIX = "cascade-sbx-"
_counter = itertools.count()
_lock = threading.Lock()
_pending: list[Path] = []  # cgroups whose processes were still leaving when the run ended


@functools.lru_cache(maxsize=1)
def _parent() -> tuple[Path, int] | None:
    """The grader's own memory cgroup directory and the hierarchy version, if children can be made there."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidate, version = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), 1
            break
    else:
        path = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
        if path is None:
            return None
        candidate, version = Path("/sys/fs/cgroup") / path.lstrip("/"), 2
        try:
            if "memory" not in (candidate / "cgroup.subtree_control").read_text().split():
                return None
        except OSError:
            return None
    probe = candidate / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    _sweep_dir(candidate)
    return candidate, version


def available() -> bool:
    """Whether this process can make run cgroups (:func:`create` does not return None)."""
    return _parent() is not None


def _sweep_dir(parent: Path) -> int:
    removed = 0
    for child in parent.glob(f"{PREFIX}*"):
        m = re.match(rf"{PREFIX}(\d+)-", child.name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            with contextlib.suppress(OSError):
                child.rmdir()
                removed += 1
    return removed


def sweep() -> int:
    """Remove the run cgroups left by grader processes that are gone (killed before they could).
    Returns how many were removed."""
    found = _parent()
    return _sweep_dir(found[0]) if found else 0


def _retry_pending() -> None:
    with _lock:
        for path in list(_pending):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            _pending.remove(path)


atexit.register(_retry_pending)


class MemoryCgroup:
    """One run's memory cgroup (:func:`create`).

    Attributes:
        path: its directory.
        version: 1 or 2 (the hierarchy).
        limit_bytes: the cap on the memory of all its processes and their tmpfs pages, in bytes.
    """

    def __init__(self, path: Path, version: int, limit_bytes: int):
        self.path, self.version, self.limit_bytes = path, version, limit_bytes

    def join(self) -> None:
        """Move the calling process into this cgroup (run in the child before ``exec``; its children follow)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def _read(self, name: str) -> str:
        try:
            return (self.path / name).read_text()
        except OSError:
            return ""

    def hit_limit(self) -> bool:
        """Whether the run's memory reached the cap (v1 ``memory.failcnt`` or ``memory.oom_control``
        ``oom_kill``; v2 ``memory.events`` ``max``/``oom_kill``): it may have been stalled or partly
        OOM-killed."""
        if self.version == 1:
            oom = dict(zip(*[iter(self._read("memory.oom_control").split())] * 2))
            return int(self._read("memory.failcnt") or 0) > 0 or int(oom.get("oom_kill", 0)) > 0
        events = dict(ln.split() for ln in self._read("memory.events").splitlines() if ln.strip())
        return int(events.get("oom_kill", 0)) > 0 or int(events.get("max", 0)) > 0

    def peak_bytes(self) -> int | None:
        """The run's largest memory use in bytes (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``), if known."""
        value = self._read("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak").strip()
        return int(value) if value.isdigit() else None

    def remove(self) -> None:
        """Remove the cgroup; if its processes are still being torn down, later (next run, or exit)."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            with _lock:
                _pending.append(self.path)


def create(limit_bytes: int) -> MemoryCgroup | None:
    """A fresh cgroup capping its processes at ``limit_bytes`` (swap included where the kernel
    accounts it), or None where this process cannot make one.

    Raises:
        ValueError: ``limit_bytes`` < 1 MiB.
    """
    if limit_bytes < 1 << 20:
        raise ValueError(f"memory cap {limit_bytes} bytes: at least 1 MiB")
    found = _parent()
    if found is None:
        return None
    _retry_pending()
    parent, version = found
    path = parent / f"{PREFIX}{os.getpid()}-{next(_counter)}"
    try:
        path.mkdir()
        if version == 1:
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):  # absent without swap accounting
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        else:
            (path / "memory.max").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return MemoryCgroup(path, version, limit_bytes)

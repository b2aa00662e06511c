"""What sandboxed runs leave on the host: live processes, temporary directories."""

from __future__ import annotations

import os
import tempfile
import time

import psutil

MARKERS = ("cascade-sbx-", "code_server.py", "code_grader.py", "bwrap")


def sandbox_procs(settle_s: float = 5.0) -> list[psutil.Process]:
    """Sandboxed programs (or their bubblewrap wrappers) still alive once the kernel had ``settle_s``
    to tear killed sandboxes down (a pid namespace takes 1-2 s here)."""
    end = time.monotonic() + settle_s
    while True:
        found = []
        for p in psutil.process_iter(["cmdline", "status"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(m in cmd for m in MARKERS):
                found.append(p)
        if not found or time.monotonic() > end:
            return found
        time.sleep(0.1)


def temp_entries() -> set[str]:
    """Names in the system temporary directory."""
    return set(os.listdir(tempfile.gettempdir()))

"""The trainer's memory allocator: TCMalloc preloaded into ``cascade train`` on Linux.

A training step on CPU allocates and frees the same large tensors every step (the LM head's logits
and their softmax, ``[tokens, vocab]``; the weight gradients, ``[V, H]``). glibc hands blocks over its
mmap threshold back to the kernel on free, so each step faults its ~1 GB in again page by page: on a
2-core VM that was 300K-600K minor faults a step at ~4 us each, more than a second of a 5 s GRPO step
(``docs/scale.md``). TCMalloc keeps freed pages for reuse: 82K faults a step, and the SmolLM2 GRPO
step's backward + AdamW went 4.7 -> 2.8 s (``benchmarks/grpo.py``). This is the setting vLLM's CPU
backend asks for (its docs: ``LD_PRELOAD`` of ``libtcmalloc_minimal.so.4``) and the PyTorch CPU
tuning guide recommends; an allocator must be loaded before the process starts, so
:func:`reexec_with_allocator` re-executes the command once with ``LD_PRELOAD`` set.

``CASCADE_MALLOC`` (environment): unset or ``tcmalloc`` finds TCMalloc (Debian/Ubuntu
``libtcmalloc-minimal4``, which ``scripts/setup.sh`` installs when it runs as root; or vLLM's bundled
copy); ``system`` keeps the C library's malloc; a path preloads that library. Values are unchanged:
only where freed memory goes differs, and the processes the trainer starts (the vLLM engine)
inherit it, as vLLM's own CPU launcher does. The verifier sandbox scrubs the environment.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

ENV = "CASCADE_MALLOC"
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
            "/usr/local/lib", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu")
NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")


def find_tcmalloc(dirs: tuple[str, ...] = LIB_DIRS) -> Path | None:
    """The first TCMalloc shared library in ``dirs`` (then in the installed vLLM's ``libs/``, where
    vLLM's own CPU wheels bundle one), or None."""
    for d in dirs:
        for name in NAMES:
            if (p := Path(d) / name).is_file():
                return p
    try:
        spec = importlib.util.find_spec("vllm")
    except ValueError:  # a vllm module without a spec
        spec = None
    if spec and spec.origin:
        found = sorted(glob.glob(str(Path(spec.origin).parent / "libs" / "libtcmalloc*.so*")))
        return Path(found[0]) if found else None
    return None


def preload_env(env: Mapping[str, str], platform: str = sys.platform) -> dict[str, str] | None:
    """``env`` with the allocator first in ``LD_PRELOAD``, or None when there is nothing to do: not Linux,
    ``CASCADE_MALLOC=system``, no TCMalloc found, or ``LD_PRELOAD`` already names it.

    Raises:
        FileNotFoundError: ``CASCADE_MALLOC`` is a path that is not a file.
    """
    choice = env.get(ENV, "tcmalloc").strip() or "tcmalloc"
    if not platform.startswith("linux") or choice == "system":
        return None
    if choice == "tcmalloc":
        lib = find_tcmalloc()
    else:
        lib = Path(choice)
        if not lib.is_file():
            raise FileNotFoundError(f"{ENV}={choice!r}: no such library file (use 'tcmalloc', 'system' or a path)")
    current = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    if lib is None or str(lib) in current or any(Path(p).name == lib.name for p in current):
        return None
    return {**env, "LD_PRELOAD": ":".join([str(lib), *current])}


def reexec_with_allocator() -> None:
    """Replace this process with the same command line (``sys.orig_argv``) under :func:`preload_env`'s
    environment; returns without doing anything when that is None (so the re-executed process goes on).
    Call it first thing in a command's ``main``, before threads or files are opened."""
    env = preload_env(os.environ)
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)

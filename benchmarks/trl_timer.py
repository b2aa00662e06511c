"""Per-step wall time of a TRL / transformers ``Trainer`` run, the thread budget and the ratio summary of
the side-by-side benchmarks (``benchmarks/grpo.py``, ``benchmarks/mopd.py``)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def use_cores(n: int) -> None:
    """Pin this process (and the processes it starts: the vllm engine) to its first ``n`` allowed cores and
    give torch ``n`` intra-op threads: the same thread budget for both sides of a comparison.

    Raises:
        ValueError: ``n`` is not between 1 and the number of allowed cores."""
    import torch

    cores = sorted(os.sched_getaffinity(0))
    if not 1 <= n <= len(cores):
        raise ValueError(f"--threads must be between 1 and {len(cores)} (this process's cores), got {n}")
    os.sched_setaffinity(0, cores[:n])
    torch.set_num_threads(n)


def fresh_runs(fn: Callable[[Any], Any], arg: Any, n: int) -> list[Any]:
    """``[fn(arg)]`` ``n`` times, each call in a fresh spawned process (:func:`fresh_call`), one after the
    other: no engine, thread pool or allocator state of one run is left to slow the next. ``fn`` must be a
    module-level function and ``arg`` and the results picklable."""
    return [fresh_call(fn, arg) for _ in range(n)]


def fresh_call(fn: Callable[[Any], Any], arg: Any, env: dict[str, str] | None = None) -> Any:
    """``fn(arg)`` in a fresh spawned process whose environment is this one's updated with ``env`` (e.g. an
    ``LD_PRELOAD``, which only a new process can take); this process's environment is restored after."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(fn, arg).result()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def side_env(malloc: str) -> dict[str, str]:
    """The environment additions of a benchmark side run with ``malloc`` (``tcmalloc``, ``system`` or a
    library path: :mod:`common.allocator`, as ``cascade train`` runs)."""
    from common.allocator import ENV, preload_env

    return preload_env({**os.environ, ENV: malloc}) or {}


def malloc_note(malloc: str) -> str:
    """What a side run with ``malloc`` preloads: the library's file name, or the C library's malloc."""
    lib = side_env(malloc).get("LD_PRELOAD", "").split(":")[0]
    return os.path.basename(lib) if lib else "glibc malloc"


def ratio_summary(ratios: list[float]) -> str:
    """``min / median / max`` of per-run ratios, formatted."""
    return f"min {min(ratios):.2f} / median {statistics.median(ratios):.2f} / max {max(ratios):.2f}"


def step_timer() -> Any:
    """A ``TrainerCallback`` whose ``times`` lists the seconds of every optimizer step, in order
    (``on_step_begin`` to ``on_step_end``). transformers is imported when called."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    return StepTimer()

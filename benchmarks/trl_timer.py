"""Per-step wall time of a TRL / transformers ``Trainer`` run, for the side-by-side benchmarks."""

from __future__ import annotations

import time
from typing import Any


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

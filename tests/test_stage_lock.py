"""A stage is trained by one ``cascade train`` at a time (stages/runtime.py ``stage_lock``), and a
training knob out of its range is refused naming its params key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from stages.base import StageConfig, build_runner
from stages.runtime import StageLocked, stage_lock

HOLD = """
import sys, time
from stages.base import StageConfig
from stages.runtime import stage_lock
with stage_lock(StageConfig(name="s", runner="grpo", datasets=[], checkpoint_root=sys.argv[1])):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_a_second_run_of_a_stage_is_refused_and_a_killed_holder_frees_the_lock(tmp_path):
    cfg = StageConfig(name="s", runner="grpo", datasets=[], checkpoint_root=str(tmp_path))
    mine = rf"stage s is being trained by another process \(pid {os.getpid()}"
    with stage_lock(cfg), pytest.raises(StageLocked, match=mine), stage_lock(cfg):
        pass
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StageLocked, match=rf"pid {holder.pid}, lock {tmp_path}/.locks/s.lock"), stage_lock(cfg):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with stage_lock(cfg):  # the kernel released the dead holder's lock
        pass


@pytest.mark.parametrize(("override", "message"), [
    ({"optim": {"lr": -1e-5}}, "cascade.stages.x.optim.lr: Input should be greater than 0"),
    ({"sampling": {"max_new_tokens": 0}}, "cascade.stages.x.sampling.max_new_tokens: Input should be greater than or "
                                          "equal to 1"),
    ({"optim": {"betas": [0.9, 1.5]}}, "cascade.stages.x.optim.betas.1: Input should be less than 1"),
    ({"kl_beta": -0.1}, "cascade.stages.x.kl_beta: Input should be greater than or equal to 0"),
    ({"eval": {"max_new_tokens": {"math": 0}}}, "cascade.stages.x.eval.max_new_tokens"),
])
def test_a_training_knob_out_of_range_names_its_key(override, message):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.")):
        build_runner("x", {"runner": "grpo", "datasets": [], **override})

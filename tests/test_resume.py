"""A stage killed with SIGKILL and started again ends exactly where an uninterrupted run ends.

Each runner runs as a real process (tests/resume_job.py: tiny models, CPU, the torch engine, one
thread, a training state after every step): killed at a seeded random step, then run again, it
must end with a ``model.safetensors`` bitwise equal to an uninterrupted run's and the same metrics
rows (timings aside), live files included.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stages.state import StateMismatch
from tests import resume_job
from tests.resume_job import STEPS

REPO = Path(__file__).resolve().parents[1]
# the default suite resumes GRPO; the rest: bash scripts/test.sh -m slow tests/test_resume.py
RUNNER_PARAMS = [pytest.param(r, marks=pytest.mark.slow) if r != "grpo" else r for r in ("sft", "grpo", "mopd", "swe_rl")]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("resume_data")
    resume_job.prepare(path)
    return path


def _job(runner: str, data: Path, out: Path, *pairs: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.resume_job", runner, str(data), str(out), *pairs],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> str:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return err


def _kill_after(proc: subprocess.Popen, steps_file: Path, step: int) -> None:
    """SIGKILL ``proc`` as soon as its live log holds ``step`` rows (it is then saving that step's
    state or already in the next step)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if steps_file.exists() and len(steps_file.read_text().splitlines()) >= step:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        time.sleep(0.02)
    raise AssertionError(f"the job ended or stalled before step {step}: {proc.communicate()[1][-3000:]}")


def _rows(out: Path, runner: str) -> list[dict]:
    """The live rows without timings (seconds and rates differ between any two runs)."""
    lines = (out / "metrics" / f"resume_{runner}" / "steps.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("_s")} for line in lines]


def _weights(out: Path, runner: str) -> bytes:
    return (out / "ckpt" / f"resume_{runner}" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    """``runner -> out dir`` of its uninterrupted run, run once on first use."""
    return resume_job.run_once(tmp_path_factory, "full", lambda runner, out: _finish(_job(runner, data, out)))


@pytest.mark.parametrize("runner", RUNNER_PARAMS)
def test_a_run_killed_at_a_random_step_resumes_bitwise_equal(runner, data, uninterrupted, tmp_path):
    kill_at = random.Random(runner).randint(1, STEPS - 1)
    _kill_after(_job(runner, data, tmp_path), tmp_path / "metrics" / f"resume_{runner}" / "steps.jsonl", kill_at)
    state_dir = tmp_path / "ckpt" / ".states" / f"resume_{runner}"
    assert not (tmp_path / "ckpt" / f"resume_{runner}").exists() and state_dir.is_dir()
    _finish(_job(runner, data, tmp_path))
    assert _weights(tmp_path, runner) == _weights(uninterrupted(runner), runner)
    rows = _rows(tmp_path, runner)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # no step twice, none missing
    assert rows == _rows(uninterrupted(runner), runner)
    assert not any(state_dir.iterdir())  # a finished run leaves no state behind


@pytest.mark.slow  # ~50 s: `bash scripts/test.sh -m slow tests/test_resume.py`
def test_a_deepspeed_run_killed_and_resumed_ends_within_fp32_tolerance(data, tmp_path):
    """The deepspeed engine (ZeRO-2, one gloo process) saves and loads its state with DeepSpeed's own
    checkpoint API: the resumed run ends where an uninterrupted one does."""
    pytest.importorskip("deepspeed", reason="install the `distributed` extra")
    from safetensors.torch import load_file

    engine, full, killed = 'train_engine="deepspeed"', tmp_path / "full", tmp_path / "killed"
    _finish(_job("grpo", data, full, engine))
    _kill_after(_job("grpo", data, killed, engine), killed / "metrics" / "resume_grpo" / "steps.jsonl", 2)
    assert any((killed / "ckpt" / ".states" / "resume_grpo").glob("step-*/deepspeed"))
    _finish(_job("grpo", data, killed, engine))
    got = load_file(killed / "ckpt" / "resume_grpo" / "model.safetensors")
    want = load_file(full / "ckpt" / "resume_grpo" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.allclose(got[k], want[k], atol=1e-5) for k in want)
    assert _rows(killed, "grpo") == _rows(full, "grpo")


def test_a_damaged_latest_state_falls_back_to_the_one_before(data, uninterrupted, tmp_path):
    _kill_after(_job("grpo", data, tmp_path), tmp_path / "metrics" / "resume_grpo" / "steps.jsonl", 3)
    states = sorted((tmp_path / "ckpt" / ".states" / "resume_grpo").glob("step-*"))
    assert len(states) == 2  # keep_last
    weights = states[-1] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    err = _finish(_job("grpo", data, tmp_path))
    assert f"training state {states[-1]} is damaged (model.safetensors)" in err
    assert _weights(tmp_path, "grpo") == _weights(uninterrupted("grpo"), "grpo")


def test_a_state_of_another_config_is_refused_naming_the_difference(data, tmp_path):
    _kill_after(_job("grpo", data, tmp_path), tmp_path / "metrics" / "resume_grpo" / "steps.jsonl", 2)
    with pytest.raises(StateMismatch, match=r"differs in: config\.optim\).*cascade train resume_grpo --restart"):
        resume_job.run("grpo", data, tmp_path, optim={"lr": 2e-2, "warmup_steps": 1})

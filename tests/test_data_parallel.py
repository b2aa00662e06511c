"""Two data-parallel ranks (``torchrun --nproc-per-node 2``, gloo on CPU) train exactly what one process
trains on the same global batch.

For SFT, GRPO (with a KL term) and MOPD (tests/dp_job.py: tiny models, the hf engine, 2 optimizer
steps that both move the weights), with the torch engine and DeepSpeed ZeRO-2 and ZeRO-3: the final
weights equal the one-process torch run's (max abs difference <= 1e-5, fp32), the final metrics
(loss, KL, SFT's sharded validation loss, rewards) equal its metrics, the ranks sampled the
one-process prompts between them, each once per step, and only rank 0 published files. The default suite runs
GRPO on the torch engine; every other case with ``bash scripts/test.sh -m slow tests/test_data_parallel.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests import resume_job

REPO = Path(__file__).resolve().parents[1]
RUNNERS = ["sft", "grpo", "mopd"]
ENGINES = {"torch": {"train_engine": "torch"},
           "zero2": {"train_engine": "deepspeed", "zero_stage": 2},
           "zero3": {"train_engine": "deepspeed", "zero_stage": 3}}
# One process: the same global batch (SFT: twice the per-rank accumulation). Micro-batches (and the hf
# engine's generate calls) hold one prompt's samples or one window on both sides, so every forward has
# the same shapes: with other paddings the tiny random model's log-probs differ by ~1e-6 relative, which
# AdamW (|update| ~ lr whatever the gradient's size) turns into ~1e-2 x lr weight differences; DeepSpeed
# reduces in its own order (ZeRO-3: ~1e-3 x lr measured), hence lr 1e-3.
# GRPO with a KL term (its reference: the init checkpoint, loaded per rank); SFT validates 3 windows (2 + 1).
GRPO = {"micro_batch_size": 4, "kl_beta": 0.05, "sampling": {"max_new_tokens": 4, "batch_size": 4}}
ONE_PROCESS = {"sft": {"grad_accum": 2, "validation_windows": 3}, "grpo": GRPO,
               "mopd": {"micro_batch_size": 2, "sampling": {"max_new_tokens": 4, "batch_size": 2}}}
TWO_RANKS = {"sft": {"grad_accum": 1, "validation_windows": 3}, "grpo": GRPO, "mopd": ONE_PROCESS["mopd"]}
STEPS = {"steps": 2, "optim": {"lr": 1e-3, "warmup_steps": 0}}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dp_data")
    resume_job.prepare(path)
    return path


def run_job(runner: str, data: Path, out: Path, ranks: int, env_extra: dict[str, str] | None = None, **over) -> None:
    """``tests.dp_job`` on ``ranks`` processes (torchrun when 2+, one thread each) with :data:`STEPS` and ``over``
    (and the environment variables ``env_extra``)."""
    pairs = [f"{k}={json.dumps(v)}" for k, v in {**STEPS, **over}.items()]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)] if ranks > 1 \
        else [sys.executable]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    proc = subprocess.run([*launcher, "-m", "tests.dp_job", runner, str(data), str(out), *pairs], cwd=REPO,
                          capture_output=True, text=True, timeout=900,
                          env={**env, "OMP_NUM_THREADS": "1", **(env_extra or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory):
    """``runner -> out dir`` of its one-process torch-engine run, run once on first use."""
    return resume_job.run_once(tmp_path_factory, "one",
                               lambda runner, out: run_job(runner, data, out, 1, **ONE_PROCESS[runner]))


def _records(out: Path, rank: int) -> list[dict]:
    path = out / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _prompts(records: list[dict]) -> Counter:
    return Counter((r["step"], tuple(r["prompt"])) for r in records if "prompt" in r)


CASES = [pytest.param(runner, engine, id=f"{runner}-{engine}",
                      marks=() if (runner, engine) == ("grpo", "torch") else pytest.mark.slow)
         for runner in RUNNERS for engine in ENGINES]


@pytest.mark.parametrize(("runner", "engine"), CASES)
def test_two_ranks_train_what_one_process_trains(runner, engine, data, one_process, tmp_path):
    run_job(runner, data, tmp_path, 2, **TWO_RANKS[runner], **ENGINES[engine])
    assert_two_ranks_match(runner, data, one_process(runner), tmp_path, engine)


@pytest.mark.parametrize("runner", ["grpo", pytest.param("mopd", marks=pytest.mark.slow)])
def test_two_ranks_train_what_one_process_trains_on_episode_rows(runner, data, tmp_path_factory):
    """GRPO and MOPD on a mix of single-turn and two-turn episode rows (stages/episodes.py ``Mixed``; the
    episodes' environment: tests/parity_episodes.py): each episode is seeded by its global sample index, so
    the ranks play what one process plays and train the same weights (MOPD: the teacher scores whole
    episodes, the student's tokens alone are trained)."""
    mixed = {**ONE_PROCESS[runner], "datasets": [str(data / "mixed")], "max_context_tokens": 512,
             **({"dynamic_filtering": False} if runner == "grpo" else {})}
    outs = {}
    for ranks in (1, 2):
        outs[ranks] = tmp_path_factory.mktemp(f"episodes_{runner}{ranks}")
        run_job(runner, data, outs[ranks], ranks, env_extra={"CASCADE_TEST_EPISODES": "1"}, **mixed)
    assert_two_ranks_match(runner, data, outs[1], outs[2], "episodes", check_prompts=False)
    final = json.loads((outs[2] / "metrics" / f"resume_{runner}.json").read_text())["final"]
    assert final["episode/steps"] == 2.0 and 0 < final["model_tokens"]


def assert_two_ranks_match(runner: str, data: Path, one: Path, two: Path, label: str, moved: float = 1e-3,
                           check_prompts: bool = True) -> None:
    """The 2-rank run in ``two`` trained what the one-process run in ``one`` trained (module docstring): equal
    final weights (moved by more than ``moved`` from init), metrics and per-domain validation (timings
    apart); the ranks split the prompts; rank 0 alone published."""
    name = f"resume_{runner}"
    got = load_file(two / "ckpt" / name / "model.safetensors")
    want = load_file(one / "ckpt" / name / "model.safetensors")
    init = load_file(data / "init" / "model.safetensors")
    assert got.keys() == want.keys()
    assert max(float((got[k] - init[k]).abs().max()) for k in got) > moved  # the weights moved
    worst = max(float((got[k] - want[k]).abs().max()) for k in got)
    print(f"{runner} {label}: max |2 ranks - 1 process| = {worst:.3g}")
    assert worst <= 1e-5, worst
    ranks = [_records(two, r) for r in (0, 1)]
    if runner in ("grpo", "mopd") and check_prompts:  # each one-process prompt sampled once by a rank, at its step
        assert _prompts(ranks[0]) + _prompts(ranks[1]) == _prompts(_records(one, 0))
        assert _prompts(ranks[0]) and _prompts(ranks[1]) and not set(_prompts(ranks[0])) & set(_prompts(ranks[1]))
    assert not [r for r in ranks[1] if "replaced" in r]  # rank 1 published nothing
    published = {Path(r["replaced"]).name for r in ranks[0] if "replaced" in r}
    assert {name, f"{name}.json", f"{name}.csv", f"{name}.png"} <= published
    one_summary, two_summary = (json.loads((out / "metrics" / f"{name}.json").read_text()) for out in (one, two))
    assert two_summary["validation"].keys() == one_summary["validation"].keys()
    for domain, block in one_summary["validation"].items():  # rank 0's greedy answers: the one-process numbers
        block = {k: v for k, v in block.items() if not k.endswith("_s")}
        assert {k: two_summary["validation"][domain][k] for k in block} == pytest.approx(block, rel=1e-4, abs=1e-6)
    one_rows, two_rows = one_summary["final"], two_summary["final"]
    keys = {"loss", "kl", "val_loss", "reward_mean", "response_tokens", "trained_samples", "supervised_tokens"}
    assert keys & set(one_rows) <= set(two_rows)
    for key in keys & set(one_rows):
        assert two_rows[key] == pytest.approx(one_rows[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow  # ~1 min: `bash scripts/test.sh -m slow tests/test_data_parallel.py`
def test_two_ranks_killed_and_resumed_end_bitwise_where_an_uninterrupted_run_ends(data, tmp_path):
    """GRPO on 2 ranks, a state after every step (each rank's RNG in its own file), the launcher's
    process group SIGKILLed after step 2, then launched again: the same weights, bit for bit, and the same
    metrics rows as 2 ranks that were never interrupted."""
    over = {**STEPS, **GRPO, "steps": 4, "save_every": 1}
    run_job("grpo", data, tmp_path / "full", 2, **over)
    killed = tmp_path / "killed"
    pairs = [f"{k}={json.dumps(v)}" for k, v in over.items()]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                             "tests.dp_job", "grpo", str(data), str(killed), *pairs], cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**env, "OMP_NUM_THREADS": "1"})
    states = killed / "ckpt" / ".states" / "resume_grpo"
    deadline = time.monotonic() + 600
    while not (states / "step-000002").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (states / "step-000002" / "rng-rank1.pt").is_file() and not (killed / "ckpt" / "resume_grpo").exists()
    run_job("grpo", data, killed, 2, **over)
    name = Path("ckpt") / "resume_grpo" / "model.safetensors"
    assert (killed / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
    rows = [[{k: v for k, v in json.loads(line).items() if not k.endswith("_s")}
             for line in (out / "metrics" / "resume_grpo" / "steps.jsonl").read_text().splitlines()]
            for out in (killed, tmp_path / "full")]
    assert [r["step"] for r in rows[0]] == [1, 2, 3, 4] and rows[0] == rows[1]


def test_a_global_batch_that_does_not_split_names_its_key(data, tmp_path):
    """3 prompts per step on 2 ranks: a clear error naming the params key, before any rollout."""
    pairs = [f"{k}={json.dumps(v)}" for k, v in {**STEPS, "prompts_per_step": 3}.items()]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                           "tests.dp_job", "grpo", str(data), str(tmp_path), *pairs], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    assert "cascade.stages.resume_grpo.prompts_per_step = 3 must be a multiple of the 2 data-parallel ranks" \
        in proc.stderr
    assert torch.__version__  # the launcher ran this torch

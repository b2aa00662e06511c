"""A real ``dvc repro`` of the data pipeline, in a temporary copy of the repository,
on a reduced source set (params override)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from datasets import load_dataset

from tests.repo_copy import copy_repo

REPO = Path(__file__).resolve().parents[1]
REDUCED = ["fastchat_conversations", "math_solutions", "mbpp_solutions", "math_problems", "mbpp_problems", "ifbench_prompts",
           "math500", "humaneval", "ifeval", "mtbench"]


def _run(args, cwd, env):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _tiny_teacher(path: Path, tokenizer_dir: Path) -> None:
    """A 2-layer random Llama with the Qwen3 tokenizer (a template that renders thinking)."""
    from transformers import AutoTokenizer

    from tests.tiny_lm import tiny_llama

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tiny_llama(len(tok), hidden=16).save_pretrained(path)
    tok.save_pretrained(path)


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory, qwen3_tokenizer_dir):
    dst = tmp_path_factory.mktemp("repo")
    copy_repo(dst)
    params = yaml.safe_load((dst / "params.yaml").read_text())
    params["sources"]["only"] = REDUCED
    params["build"]["mixes"] = {}  # the reduced set lacks the MCQ/tool/structured domains they draw from
    _tiny_teacher(dst / "tiny-teacher", qwen3_tokenizer_dir)
    params["synthesize"].update(teacher="tiny-teacher", domains=["math", "code"], prompts_per_domain=2, k=2,
                                max_new_tokens=16, engine="hf")  # a head_dim-4 model: vLLM's CPU kernels refuse it
    (dst / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1"}
    _run(["git", "init", "-q"], dst, env)
    _run([sys.executable, "-m", "dvc", "repro", "export"], dst, env)
    return dst, env


def test_repro_writes_every_step_with_balanced_counts(repo_copy):
    dst, _ = repo_copy
    for step in ("ingest", "synthesize", "dedup", "quality", "semdedup", "decontaminate", "validate", "build", "export"):
        m = json.loads((dst / "metrics" / f"{step}.json").read_text())
        assert m["rows_in"] == m["rows_out"] + m["rows_rejected"], step
        assert pq.read_table(dst / "rejects" / f"{step}.parquet").num_rows == m["rows_rejected"]
    ingest = json.loads((dst / "metrics" / "ingest.json").read_text())
    assert set(ingest["per_source"]) == set(REDUCED)
    assert ingest["per_source"]["math500"]["rows_out"] == 500
    synth = json.loads((dst / "metrics" / "synthesize.json").read_text())
    assert synth["prompts"] == 4 and synth["rows_in"] == 8  # 2 domains x 2 prompts x k=2 responses
    assert synth["teacher"] == "tiny-teacher"
    dedup = json.loads((dst / "metrics" / "dedup.json").read_text())  # the synthesized SFT rows are deduplicated too
    assert dedup["per_table"]["sft"]["rows_in"] == ingest["rows_out_by_table"]["sft"] + synth["rows_out"]


def test_math500_problems_are_removed_from_math_train_by_decontamination(repo_copy):
    dst, _ = repo_copy
    m = json.loads((dst / "metrics" / "decontaminate.json").read_text())
    # MATH test (5000) contains the MATH-500 problems: they must all be caught in both tables
    assert m["per_table"]["rl"]["contaminated_by_benchmark"]["math500"] >= 500
    assert m["per_table"]["sft"]["contaminated_by_benchmark"]["math500"] >= 500
    rejects = pq.read_table(dst / "rejects" / "decontaminate.parquet").to_pylist()
    assert all(r["reason"].startswith("contaminated: ") for r in rejects)
    # the SFT rows' assistant turns are MATH's reference solutions: matched on the answer side too
    report = json.loads((dst / "metrics" / "decontamination.json").read_text())["benchmarks"]["math500"]
    assert report["rows"]["prompt"] >= 1000 and report["rows"]["answer"] >= 490


def test_every_exported_config_loads(repo_copy):
    dst, _ = repo_copy
    for kind in ("sft", "rl"):
        card = (dst / "release" / kind / "README.md").read_text()
        configs = [c["config_name"] for c in yaml.safe_load(card.split("---")[1])["configs"]]
        assert configs
        for config in configs:
            ds = load_dataset(str(dst / "release" / kind), config)
            assert sum(len(s) for s in ds.values()) > 0


def test_second_repro_is_a_noop_and_metrics_show_lists_steps(repo_copy):
    dst, env = repo_copy
    t0 = time.perf_counter()
    out = _run([sys.executable, "-m", "dvc", "repro", "export"], dst, env)
    assert "didn't change, skipping" in out and "Running stage" not in out
    assert time.perf_counter() - t0 < 30
    shown = _run([sys.executable, "-m", "dvc", "metrics", "show", "--json"], dst, env)
    files = json.loads(shown)[""]["data"]
    assert {Path(f).stem for f in files} >= {"ingest", "dedup", "quality", "semdedup", "decontaminate", "validate", "build",
                                             "export"}


def _stage_lock(dst: Path, stage: str) -> dict:
    return yaml.safe_load((dst / "dvc.lock").read_text())["stages"][stage]


def _leftovers(dst: Path) -> list[str]:
    """Temporary files and directories of interrupted writes (common/io.py names them ``.*.tmp``), spilled
    rejects and step scratch directories (common/io.py ``step_scratch``)."""
    return sorted(str(p.relative_to(dst)) for top in ("data", "rejects", "metrics", "release", "plots", "logs")
                  for p in (dst / top).rglob("*")
                  if p.name.endswith(".tmp") or ".spill" in p.parts or ".cascade-tmp" in p.parts)


def _step_process(proc: subprocess.Popen, timeout: float = 120.0):
    """The ``cascade`` process ``dvc repro`` started for the stage (psutil), once it exists."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if any("cascade" in part for part in child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.01)
    raise AssertionError("dvc repro never started the step")


def _kill_and_rerun(dst: Path, env: dict, stage: str, kill_when) -> bool:
    """``dvc repro`` of ``stage`` with DVC's run cache off, SIGKILLed (with the step under it) once
    ``kill_when(step_process)`` returns, then the same command to completion.

    The process group is frozen (SIGSTOP) first and killed only while the step is still alive: once the
    step has exited, DVC rewrites dvc.lock in place (``open(path, "w+")``, not atomic), and a kill there
    truncates DVC's own file, which no step can prevent. Returns whether the step was killed."""
    import signal

    cmd = [sys.executable, "-m", "dvc", "repro", "--no-run-cache", "--force", "--single-item", stage]
    proc = subprocess.Popen(cmd, cwd=dst, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    step = _step_process(proc)
    kill_when(step)
    os.killpg(proc.pid, signal.SIGSTOP)
    killed = _alive(step)
    os.killpg(proc.pid, signal.SIGKILL if killed else signal.SIGCONT)
    proc.wait()
    _run(cmd, dst, env)
    return killed


def _alive(step) -> bool:
    import psutil

    try:
        return step.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _sleep_while_running(step, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _alive(step):
        time.sleep(0.01)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_a_data_step_killed_at_a_random_moment_reruns_to_the_same_bytes(repo_copy, seed):
    """SIGKILL at a random moment of a random step's process (its imports, ~1-2 s, and its work), then
    ``dvc repro``: the step's outputs and dvc.lock entry are the uninterrupted run's, no temporary left."""
    import random

    dst, env = repo_copy
    rng = random.Random(seed)
    stage = rng.choice(["ingest", "dedup", "quality", "semdedup", "decontaminate", "validate", "build", "export"])
    before = _stage_lock(dst, stage)
    seconds = json.loads((dst / "logs" / "timings.json").read_text())[stage]
    _kill_and_rerun(dst, env, stage, lambda step: _sleep_while_running(step, rng.uniform(1.0, 2.0 + seconds)))
    assert _stage_lock(dst, stage) == before
    assert _leftovers(dst) == []


@pytest.mark.parametrize("stage", ["dedup", pytest.param("export", marks=pytest.mark.slow)])
def test_a_data_step_killed_in_the_middle_of_a_write_leaves_nothing_behind(repo_copy, stage):
    """SIGKILL the moment the step's first temporary output exists (a write under way), then ``dvc repro``."""
    dst, env = repo_copy
    before = _stage_lock(dst, stage)

    def first_write(step) -> None:
        deadline = time.monotonic() + 120
        while not _leftovers(dst):
            assert step.is_running() and time.monotonic() < deadline, "the step wrote no temporary file"
            time.sleep(0.005)

    assert _kill_and_rerun(dst, env, stage, first_write), "the step ended before its first write was seen"
    assert _stage_lock(dst, stage) == before
    assert _leftovers(dst) == []

"""Issue #33: no RL row reaches ``data/sets`` unless it meets its verifier's contract, and a killed
data step leaves nothing behind after the next ``dvc repro``, even when DVC restores the stage from
its run cache."""

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml

from common.io import SCRATCH_NAME, Rejects, atomic_path, scratch, step_scratch
from curation.build import contract_reason
from tests.repo_copy import copy_repo
from tests.rows import rl_table, sft_table

TOOLS = json.dumps([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
GOOD = {  # agent_ref -> (ground_truth, other fields): one row each verifier accepts
    "math": ({"answer": "3/4"}, {}),
    "mcqa": ({"answer": "B", "options": {"A": "one", "B": "two"}}, {}),
    "code": ({"mode": "assert", "tests": ["assert f(0) == 1", "assert f(1) == 2"]}, {}),
    "instruction_following": (None, {"instruction_id_list": ["punctuation:no_comma"], "kwargs": "[{}]"}),
    "structured_output": ({"schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}, {}),
    "tool_call": ({"calls": [{"f": {"x": [1, 2]}}]}, {"tools": TOOLS}),
    "long_context": ({"answers": ["Paris"]}, {}),
    "genrm": (None, {}),
}
BROKEN = [  # (agent_ref, ground_truth JSON text, other fields, what the reason says)
    ("math", "the answer is 4", {}, "ground_truth is not valid JSON"),
    ("math", '{"answer": NaN}', {}, "not a JSON number"),
    ("math", '{"answer": "1", "answer": "2"}', {}, "duplicate key"),
    ("math", '{"answer": ""}', {}, "non-empty string"),
    ("math", '{"answer": 4}', {}, "non-empty string"),
    ("math", '[1, 2]', {}, "must be a JSON object"),
    ("mcqa", '{"answer": "E", "options": {"A": "x", "B": "y"}}', {}, "not an option key"),
    ("mcqa", '{"answer": ["A"], "options": {"A": "x", "B": "y"}}', {}, "not an option key"),
    ("mcqa", '{"answer": "a", "options": {"a": "x", "b": "y"}}', {}, "letters A-Z"),
    ("code", '{"mode": "assert"}', {}, "tests is missing"),
    ("code", '{"mode": "exec", "tests": ["assert 1"]}', {}, "mode must be one of"),
    ("code", '{"mode": "assert", "tests": ["assert ("]}', {}, "not valid Python"),
    ("code", '{"mode": "assert", "tests": ["assert f(4,8) == 2", "assert f(2,4) == 2"]}', {},
     "a program answering that constant passes"),
    ("code", '{"mode": "stdin_stdout", "tests": [{"stdin": "1", "expected_stdout": "YES"}]}', {},
     "a program answering that constant passes"),
    ("instruction_following", "null", {"instruction_id_list": ["no:such_rule"], "kwargs": "[{}]"}, "no:such_rule"),
    ("structured_output", '{"schema": {"type": "objekt"}}', {}, "not a valid JSON Schema"),
    ("tool_call", '{"calls": [{"g": {"x": [1]}}]}', {"tools": TOOLS}, "not among the row's tools"),
    ("tool_call", '{"calls": [{"f": {"x": 1}}]}', {"tools": TOOLS}, "list of acceptable values"),
    ("tool_call", '{"calls": [{"f": {"x": []}}]}', {"tools": TOOLS}, "no acceptable value"),
    ("long_context", '{"answers": []}', {}, "non-empty list"),
    ("long_context", '{"answers": [{"a": 1}]}', {}, "non-empty list"),
    ("no_such_verifier", '{"answer": "1"}', {}, "no verifier 'no_such_verifier'"),
]


def _row(agent_ref: str, gt: str, fields: dict) -> dict:
    row = rl_table(["q?"]).to_dicts()[0]
    tools = fields.pop("tools", "[]")
    row.update(agent_ref=agent_ref, ground_truth=gt, **fields)
    row["responses_create_params"] = {**row["responses_create_params"], "tools": tools}
    return row


@pytest.mark.parametrize("agent_ref", sorted(GOOD))
def test_each_verifier_accepts_a_row_meeting_its_contract(agent_ref):
    gt, fields = GOOD[agent_ref]
    assert contract_reason(_row(agent_ref, json.dumps(gt), dict(fields))) is None


@pytest.mark.parametrize(("agent_ref", "gt", "fields", "says"), BROKEN)
def test_a_row_breaking_its_verifiers_contract_gets_a_reason(agent_ref, gt, fields, says):
    reason = contract_reason(_row(agent_ref, gt, dict(fields)))
    assert reason is not None and reason.startswith(f"verifier_contract: {agent_ref}: ")
    assert says in reason


def _decontaminated(root: Path) -> None:
    """Small decontaminated tables: 40 SFT rows, 30 good math RL rows and 2 broken ones."""
    (root / "data/decontaminated").mkdir(parents=True)
    sft_table([f"question number {i}" for i in range(40)]).write_parquet(root / "data/decontaminated/sft.parquet")
    n = 32
    gts = [json.dumps({"answer": str(i)}) for i in range(n - 2)] + ["not json", '{"answer": NaN}']
    rl_table([f"prompt {i}" for i in range(n)], source="train_src", prefix="r", ground_truth=gts).write_parquet(
        root / "data/decontaminated/rl.parquet")


def _params(root: Path) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["build"]["mixes"] = {}
    (root / "params.yaml").write_text(yaml.safe_dump(params))


@pytest.mark.parametrize("take_batch", [None, 1], ids=["one_frame", "a_frame_a_row"])
def test_build_rejects_and_counts_rows_that_break_their_verifiers_contract(tmp_path, monkeypatch, take_batch):
    """The rejected rows are read back with common.take in frames (here also of one row each): each keeps
    its own reason."""
    from common import take
    from curation.params import check_params
    from curation.pipeline import run_step

    if take_batch:
        monkeypatch.setattr(take, "take_rows", functools.partial(take.take_rows, batch_rows=take_batch))
    copy_repo(tmp_path)
    _params(tmp_path)
    _decontaminated(tmp_path)
    monkeypatch.chdir(tmp_path)
    metrics = run_step("build", check_params(yaml.safe_load(Path("params.yaml").read_text())))
    built = pl.concat([pl.read_parquet(f) for f in Path("data/sets/rl").rglob("*.parquet")])
    assert len(built) == 30 and not {"r30", "r31"} & set(built["uuid"])
    rejects = pl.read_parquet("rejects/build.parquet")
    assert rejects["record_id"].to_list() == ["r30", "r31"]
    assert set(rejects["category"]) == {"verifier_contract"}
    assert "ground_truth is not valid JSON" in rejects["reason"][0] and "NaN" in rejects["reason"][1]
    assert metrics["rows_in"] == 72 and metrics["rows_rejected"] == 2
    assert metrics["rejected_by_reason"] == {"verifier_contract": 2}
    assert metrics["contract_rejects_by_verifier"] == {"math": 2}
    assert not list(Path("data/sets").rglob(f"*{SCRATCH_NAME}*"))


def test_step_temporaries_and_spills_live_in_the_scratch_and_go_with_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with step_scratch(tmp_path / "out") as where:
        assert scratch() == where.resolve() and where.parent == tmp_path / "out"
        with atomic_path(tmp_path / "rejects" / "x.parquet") as tmp:  # a target outside the output directory
            assert tmp.parent == where.resolve()
            tmp.write_text("x")
        rejects = Rejects("dedup", spill_rows=2)
        for i in range(3):
            rejects.add("s", str(i), "r", {})
        assert Path(rejects._dir).parent == where.resolve()  # not rejects/.spill
    assert scratch() is None and not where.exists()
    assert sorted(p.name for p in (tmp_path / "rejects").iterdir()) == ["x.parquet"]
    assert not (tmp_path / "out").exists()  # nothing written there: no empty output left


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for top in ("data", "rejects", "metrics", "logs")
                  for p in (root / top).rglob("*")
                  if p.name.endswith(".tmp") or SCRATCH_NAME in p.parts or ".spill" in p.parts)


def _dvc(root: Path, env: dict, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, f"dvc {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_a_step_killed_mid_write_leaves_nothing_after_dvc_restores_it_from_the_run_cache(tmp_path):
    """``dvc repro build`` (run cache saved), then a forced rerun SIGKILLed while its first output is
    a temporary (the write paused by ``CASCADE_TEST_PAUSE_IN_WRITE``), then ``dvc repro build``: DVC
    restores the stage from its run cache without running ``cascade build``, and no temporary, spill
    or scratch is left; the outputs are the first run's."""
    copy_repo(tmp_path)
    _params(tmp_path)
    _decontaminated(tmp_path)
    (tmp_path / "metrics").mkdir(exist_ok=True)
    (tmp_path / "metrics/validate.json").write_text("{}\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(tmp_path)}  # the copy's code, not the editable install's checkout
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    _dvc(tmp_path, env, "repro", "--single-item", "build")
    lock = yaml.safe_load((tmp_path / "dvc.lock").read_text())["stages"]["build"]

    proc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "--force", "--single-item", "build"],
                            cwd=tmp_path, env={**env, "CASCADE_TEST_PAUSE_IN_WRITE": "60"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not [p for p in (tmp_path / "data/sets" / SCRATCH_NAME).glob("*") if p.name.endswith(".tmp")]:
        assert proc.poll() is None and time.monotonic() < deadline, "the step wrote no temporary"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _leftovers(tmp_path), "the kill left no temporary: nothing was tested"

    out = _dvc(tmp_path, env, "repro", "--single-item", "build")
    assert "is cached - skipping run" in out  # restored, `cascade build` did not run
    assert _leftovers(tmp_path) == []
    assert yaml.safe_load((tmp_path / "dvc.lock").read_text())["stages"]["build"] == lock
    assert pq.read_table(tmp_path / "rejects/build.parquet").num_rows == 2

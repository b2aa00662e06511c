"""End to end: ``dvc repro`` of the whole training cascade, in the paper's order
SFT -> IF-RL -> multi-domain RL -> MOPD -> RLHF -> long-context RL -> code RL, then ``cascade report``,
with the default params (SmolLM2-135M-Instruct, the default CPU step budgets, real RL sets), in a
temporary copy of the repository. As in tests/test_stages_repro.py the data stages are not rerun:
their outputs are copied in, ``data/packed`` is built there when the repository has none, and the
training stages are reproduced with ``--single-item``."""

import json
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from stages.checkpoints import read_record
from tests.repo_copy import cascade_copy, run_checked

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cascade(tmp_path_factory, smollm2_dir):
    dst = tmp_path_factory.mktemp("cascade")
    env, dvc = cascade_copy(dst)
    # one torch thread per stage: on a shared CPU, multi-thread spin-waits slow steps down many times
    env["OMP_NUM_THREADS"] = "1"
    order = yaml.safe_load((dst / "params.yaml").read_text())["cascade"]["order"]
    t0 = time.perf_counter()
    out = run_checked([*dvc, "repro", "--single-item", *order, "report"], dst, env)
    wall = time.perf_counter() - t0
    print(f"\ndvc repro {' '.join(order)} report: {wall:.0f} s")
    return dst, env, order, out


def test_the_whole_cascade_runs_in_the_papers_order(cascade):
    dst, _, order, out = cascade
    assert order == ["sft", "if_rl", "multidomain_rl", "mopd", "rlhf", "long_context_rl", "code_rl"]
    for stage in [*order, "report"]:
        assert f"Running stage '{stage}'" in out
    record = read_record(dst / "data/checkpoints/code_rl")
    assert record["lineage"] == order
    # mopd reads the difficulty-filtered mix; rlhf and long_context_rl read full sets the filter does not measure
    assert set(record["parent_datasets"]) >= {"data/packed", "data/filtered/rl/mopd", "data/sets/rl/rlhf",
                                              "data/sets/rl/long_context"}
    mopd = read_record(dst / "data/checkpoints/mopd")
    # a teacher per domain of the difficulty-filtered MOPD mix (SmolLM2 scores all or nothing on tool calling and
    # structured output, so the filter keeps none of those rows on a laptop budget)
    mixed = set(pl.read_parquet(dst / "data/filtered/rl/mopd/train.parquet")["domain"])
    assert set(mopd["teachers"]) == mixed and {"math", "instruction_following", "stem_mcqa"} <= mixed
    assert all(Path(p).parent == Path("data/checkpoints") and Path(p).name in order[:3]
               for p in mopd["teachers"].values())
    summary = json.loads((dst / "metrics/train/mopd.json").read_text())
    assert summary["steps"] == 3 and "reverse_kl" in summary["final"] and summary["counts"]["teacher_loads"] >= 1


def test_cascade_report_shows_every_stage_and_each_checkpoints_lineage(cascade):
    dst, env, order, _ = cascade
    out = run_checked([sys.executable, "-m", "curation.cli", "report"], dst, env)
    print(out)
    report = json.loads((dst / "metrics/cascade_report.json").read_text())
    assert [r["stage"] for r in report["stages"]] == order
    assert all(r["status"] == "trained" for r in report["stages"])
    assert {"math", "stem_mcqa", "code"} <= set(report["domains"])
    for stage in order:
        assert stage in out
        for domain, value in report["table"][stage].items():
            assert value is None or 0.0 <= value <= 1.0, (stage, domain)
        assert all(h.startswith("md5:") for h in report["lineage"][stage]["datasets"].values())
    assert (dst / "plots/cascade_report.png").read_bytes()[:4] == b"\x89PNG"
    rows = (dst / "plots/cascade_report.csv").read_text().splitlines()
    assert rows[0].split(",") == ["stage", *report["domains"]] and len(rows) == 1 + len(order)

"""``cascade report`` (stages/report.py): regressions, what MOPD recovered, lineage, outputs; and a
disabled stage passing its init checkpoint through (stages/cli.py)."""

import json

import pytest
import yaml

from common.io import write_parquet
from curation.cli import main as cascade_main
from stages.checkpoints import read_record, write_record
from stages.cli import train
from stages.report import build_report
from tests.rows import rl_table
from tests.tiny_lm import tiny_llama

ORDER = ["sft", "if_rl", "mdrl", "mopd", "rlhf"]
# math regresses at if_rl (0.6 -> 0.2) and mdrl (0.1); MOPD brings it to 0.5: 0.4 of the 0.5 gap to sft
VALIDATION = {"sft": {"math": 0.6, "mcqa": 0.2}, "if_rl": {"math": 0.2, "mcqa": 0.3},
              "mdrl": {"math": 0.1, "mcqa": 0.5}, "mopd": {"math": 0.5, "mcqa": 0.5},
              "rlhf": {"math": 0.5, "mcqa": 0.25}}


def _cascade(tmp_path, stages=ORDER):
    data = tmp_path / "set"
    write_parquet(rl_table(["a"]), data / "train.parquet")
    root, init = tmp_path / "ckpt", tmp_path / "base"
    for stage in stages:
        write_record(root / stage, stage=stage, runner="mopd" if stage == "mopd" else "grpo", init=init,
                     datasets=[data], validation={d: {"reward": v} for d, v in VALIDATION[stage].items()},
                     train={"final": {}, "counts": {}})
        init = root / stage
    return root, data


def test_regressions_and_mopd_recovery_against_the_best_earlier_stage(tmp_path):
    root, data = _cascade(tmp_path)
    report = build_report([*ORDER, "code_rl"], root)
    assert report["domains"] == ["math", "mcqa"]
    assert [(r["stage"], r["domain"], r["best_stage"]) for r in report["regressions"]] == [
        ("if_rl", "math", "sft"), ("mdrl", "math", "sft"), ("mopd", "math", "sft"), ("rlhf", "math", "sft"),
        ("rlhf", "mcqa", "mdrl")]
    assert report["recovered"] == [{"stage": "mopd", "domain": "math", "before": 0.1, "after": 0.5, "best": 0.6,
                                    "best_stage": "sft", "recovered": pytest.approx(0.4),
                                    "fraction": pytest.approx(0.8), "regressed": True}]
    assert [r["status"] for r in report["stages"]] == ["trained"] * 5 + ["missing"]
    assert report["lineage"]["rlhf"]["lineage"] == ORDER
    assert report["lineage"]["mdrl"]["datasets"] == {str(data): read_record(root / "mdrl")["datasets"][str(data)]}
    # a tolerance absorbs small drops: rlhf's mcqa 0.25 is within 0.3 of 0.5
    tolerant = build_report(ORDER, root, tolerance=0.3)["regressions"]
    assert ("rlhf", "mcqa") not in {(r["stage"], r["domain"]) for r in tolerant}
    with pytest.raises(ValueError, match="no checkpoint record under .* run the cascade first"):
        build_report(ORDER, tmp_path / "empty")


def test_cascade_report_cli_writes_table_png_and_json(tmp_path, monkeypatch, capsys):
    root, _ = _cascade(tmp_path)
    params = {"cascade": {"order": ORDER, "defaults": {"checkpoint_root": str(root)},
                          "report": {"metric": "reward", "tolerance": 0.0}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    assert cascade_main(["report"]) == 0
    out = capsys.readouterr().out
    assert "MOPD (mopd) math: 0.100 -> 0.500 (best earlier 0.600 at sft; 80% of the gap closed)" in out
    assert "0.500 +0.400" in out and "0.200 v" in out
    assert (tmp_path / "plots/cascade_report.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "plots/cascade_report.csv").read_text().splitlines()[:3] == [
        "stage,math,mcqa", "sft,0.6000,0.2000", "if_rl,0.2000,0.3000"]
    saved = json.loads((tmp_path / "metrics/cascade_report.json").read_text())
    assert saved["recovered"][0]["fraction"] == pytest.approx(0.8)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"cascade": {"order": ["nothing"]}}))
    assert cascade_main(["report"]) == 1
    assert "cascade report: error: no checkpoint record" in capsys.readouterr().err


def test_a_disabled_stage_passes_its_init_through_and_reports_as_skipped(tmp_path, smollm2_dir):
    from transformers import AutoTokenizer

    root, data = _cascade(tmp_path, ORDER[:3])
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tiny_llama(len(tok), hidden=32).save_pretrained(root / "mdrl")
    tok.save_pretrained(root / "mdrl")
    params = {"cascade": {"model": "unused", "order": ORDER[:4], "defaults": {
        "checkpoint_root": str(root), "metrics_dir": str(tmp_path / "m"), "plots_dir": str(tmp_path / "p")},
        "stages": {"mopd": {"runner": "mopd", "enabled": False, "datasets": [str(data)]}}}}
    result = train("mopd", params)
    record = read_record(result.checkpoint)
    assert record["lineage"] == ORDER[:4] and record["datasets"] == {}
    assert record["validation"] == read_record(root / "mdrl")["validation"]
    assert (root / "mopd" / "model.safetensors").read_bytes() == (root / "mdrl" / "model.safetensors").read_bytes()
    # every output dvc.yaml declares for a stage exists although no step ran (DVC fails the stage otherwise)
    assert (tmp_path / "m" / "mopd" / "plots" / "metrics").is_dir() and (tmp_path / "m" / "mopd.json").exists()
    assert (tmp_path / "p" / "mopd.csv").exists() and (tmp_path / "p" / "mopd.png").read_bytes()[:4] == b"\x89PNG"
    report = build_report(ORDER[:4], root)
    assert report["stages"][-1] == {"stage": "mopd", "runner": "mopd", "status": "skipped"}
    assert report["regressions"][-1]["stage"] == "mopd" and report["recovered"] == []


def _scores(passed: list[int]) -> dict:
    return {"uuid": [f"u{i}" for i in range(len(passed))], "reward": [float(p) for p in passed],
            "passed": [bool(p) for p in passed]}


def test_an_alternative_branch_and_the_benchmark_table(tmp_path, monkeypatch, capsys):
    """compare {mopd: grpo_more}: the alternative from MOPD's init, its recovery and MOPD minus it paired per
    prompt; the benchmark table's rows are the stages with a `cascade eval` result, deltas against the init."""
    from stages.checkpoints import SCORES_FILE

    data = tmp_path / "set"
    write_parquet(rl_table(["a"]), data / "train.parquet")
    root = tmp_path / "ckpt"
    math = {"sft": [1, 1, 1, 0], "if_rl": [0, 0, 1, 0], "mopd": [1, 1, 1, 0], "grpo_more": [0, 1, 1, 0]}
    for stage, init in (("sft", tmp_path / "base"), ("if_rl", root / "sft"), ("mopd", root / "if_rl"),
                        ("grpo_more", root / "if_rl")):
        write_record(root / stage, stage=stage, runner={"mopd": "mopd"}.get(stage, "grpo"), init=init,
                     datasets=[data], validation={"math": {"reward": sum(math[stage]) / 4}},
                     train={"final": {}, "counts": {}})
        (root / stage / SCORES_FILE).write_text(json.dumps({"math": _scores(math[stage])}))
    bench = tmp_path / "bench"
    gsm = {"sft": [1, 0, 0, 0], "if_rl": [1, 1, 0, 0], "grpo_more": [1, 1, 1, 0]}
    for stage, passed in gsm.items():
        block = {"scores": _scores(passed), "accuracy": {"mean": sum(passed) / 4, "ci_low": 0.0, "ci_high": 1.0,
                                                          "n": 4}}
        (bench / f"{stage}.json").parent.mkdir(exist_ok=True)
        (bench / f"{stage}.json").write_text(json.dumps({"benchmarks": {"gsm8k": block}, "wall_s": 1.0}))
    params = {"cascade": {"order": ["sft", "if_rl", "mopd"], "defaults": {"checkpoint_root": str(root)},
                          "report": {"compare": {"mopd": "grpo_more"}, "benchmarks_dir": str(bench)}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    assert cascade_main(["report", "--docs", str(tmp_path / "docs")]) == 0
    saved = json.loads((tmp_path / "metrics/cascade_report.json").read_text())
    branch = saved["branches"]["grpo_more"]
    assert branch["init"] == "if_rl" and branch["replaces"] == "mopd"
    assert branch["recovered"][0]["fraction"] == pytest.approx((0.5 - 0.25) / (0.75 - 0.25))
    assert branch["versus"]["math"]["delta"] == pytest.approx(0.25) and branch["versus"]["math"]["n"] == 4
    table = saved["benchmarks"]
    assert table["stages"] == ["sft", "if_rl", "grpo_more"] and table["missing"] == ["mopd"]
    assert table["deltas"]["if_rl"]["gsm8k"]["delta"] == pytest.approx(0.25)
    assert table["deltas"]["grpo_more"]["gsm8k"] == {**table["deltas"]["grpo_more"]["gsm8k"], "init": "if_rl",
                                                     "delta": pytest.approx(0.25)}
    md = (tmp_path / "docs/report.md").read_text()
    assert "Alternative `grpo_more` (from `if_rl`, as `mopd`)" in md and "| grpo_more | 0.750 [0.000, 1.000]" in md
    params["cascade"]["report"]["compare"] = {"nope": "grpo_more"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert cascade_main(["report"]) == 1
    assert "cascade.report.compare: 'nope' is not in cascade.order" in capsys.readouterr().err

"""Measuring learning (presets/learning.yaml): the bootstrap intervals, the report's paired deltas,
regressions and MOPD recovery on hand-made per-prompt scores; and a tiny cascade: the base model
validated by a disabled first stage, then a GRPO stage in partial-layer mode with KL tracking."""

import csv
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from common.io import write_json, write_parquet
from stages.bootstrap import domain_mean_delta_ci, mean_ci, paired_delta_ci
from stages.checkpoints import SCORES_FILE, read_scores, write_record
from stages.cli import pass_through
from stages.grpo import GRPOConfig, GRPOStage
from stages.report import build_report, curve_summary, markdown_table, summary_json
from tests.rows import StartsWith, rl_table
from tests.tiny_lm import smollm2_tokenizer, tiny_llama


def test_mean_ci_matches_the_normal_interval_of_a_proportion():
    m, lo, hi = mean_ci([1.0] * 50 + [0.0] * 50)
    # 0.5 +- 1.96 * sqrt(0.25 / 100) = [0.402, 0.598]; percentile bootstrap of 10,000 resamples
    assert m == 0.5 and lo == pytest.approx(0.402, abs=0.015) and hi == pytest.approx(0.598, abs=0.015)
    assert mean_ci([1.0] * 7) == (1.0, 1.0, 1.0)  # no spread: the degenerate interval
    with pytest.raises(ValueError, match="0 prompts"):
        mean_ci([])


def test_pairing_finds_a_gain_the_unpaired_interval_cannot():
    before = np.array([1.0] * 40 + [0.0] * 60)
    after = before.copy()
    after[40:50] = 1.0  # 10 prompts flip 0 -> 1, none the other way
    delta, lo, hi = paired_delta_ci(after, before)
    # 10 flips in 100: 0.1 +- 1.96 * sqrt(0.1 * 0.9 / 100) = [0.041, 0.159]
    assert delta == pytest.approx(0.1) and lo == pytest.approx(0.041, abs=0.02) and hi == pytest.approx(0.159, abs=0.02)
    rng = np.random.default_rng(0)  # the same data resampled independently: the interval holds 0
    unpaired = [rng.choice(after, 100).mean() - rng.choice(before, 100).mean() for _ in range(4000)]
    assert np.percentile(unpaired, 2.5) < 0 < lo
    with pytest.raises(ValueError, match="same prompts: 3 after vs 2 before"):
        paired_delta_ci([1.0, 0.0, 1.0], [1.0, 0.0])


def test_domain_mean_delta_resamples_each_domain_on_its_own():
    up = ([1.0] * 30 + [0.0] * 70, [0.0] * 100)     # +0.3 on one domain
    flat = ([1.0] * 20, [1.0] * 20)                 # 0 on a domain of 20 prompts
    d, lo, hi = domain_mean_delta_ci([up, flat])
    # (0.3 + 0) / 2; the first domain's delta 0.3 +- 1.96 * sqrt(0.21 / 100), halved: 0.15 +- 0.045
    assert d == pytest.approx(0.15) and lo == pytest.approx(0.105, abs=0.012) and hi == pytest.approx(0.195, abs=0.012)
    assert domain_mean_delta_ci([flat]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="same, non-empty prompts: 2 after vs 1 before"):
        domain_mean_delta_ci([([1.0, 0.0], [1.0])])


STAGES = ["sft", "if_rl", "mdrl", "mopd"]
# passes out of 100 prompts per domain: `a` gains at if_rl, loses 30 at mdrl (a regression), MOPD gets 20
# of the 30 back; `b` dips by one prompt at if_rl (not a regression: the paired interval holds 0)
PASSES = {"sft": {"a": 50, "b": 50}, "if_rl": {"a": 70, "b": 49}, "mdrl": {"a": 40, "b": 70},
          "mopd": {"a": 60, "b": 70}}


def _scored_cascade(root, data):
    init = root / "base"
    for stage in STAGES:
        scores = {d: {"uuid": [f"u{i}" for i in range(100)], "reward": [float(i < k) for i in range(100)],
                      "passed": [i < k for i in range(100)], "sample_rewards": [[float(i < k + 5)] * 2 for i in range(100)],
                      "sample_passed": [[i < k + 5, False] for i in range(100)]} for d, k in PASSES[stage].items()}
        validation = {d: {"reward": k / 100, "pass@2": (k + 5) / 100} for d, k in PASSES[stage].items()}
        write_record(root / stage, stage=stage, runner="mopd" if stage == "mopd" else "grpo", init=init,
                     datasets=[data], validation=validation,
                     train={"final": {}, "counts": {"skipped": 1} if stage == "sft" else {}})
        write_json(scores, root / stage / SCORES_FILE)
        init = root / stage


def test_report_pairs_deltas_flags_significant_regressions_and_measures_mopd_recovery(tmp_path):
    write_parquet(rl_table(["x"]), tmp_path / "set" / "train.parquet")
    _scored_cascade(tmp_path / "ckpt", tmp_path / "set")
    report = build_report(STAGES, tmp_path / "ckpt", domain_groups={"mdrl": ["a", "b"]})
    [group] = report["group_deltas"]  # mdrl against if_rl: (-0.30 + 0.21) / 2
    assert (group["init"], group["delta"]) == ("if_rl", pytest.approx(-0.045))
    assert group["ci_low"] < -0.045 < group["ci_high"]
    deltas = {(d["stage"], d["domain"]): d for d in report["deltas"]}
    assert set(deltas) == {(s, d) for s in STAGES[1:] for d in "ab"}  # the skipped base has no delta
    assert deltas[("if_rl", "a")]["delta"] == pytest.approx(0.2) and deltas[("if_rl", "a")]["ci_low"] > 0.1
    assert deltas[("if_rl", "b")]["delta"] == pytest.approx(-0.01) and deltas[("if_rl", "b")]["ci_high"] == 0.0
    assert [(r["stage"], r["domain"]) for r in report["regressions"]] == [("mdrl", "a"), ("mopd", "a")]
    assert report["regressions"][0]["delta"] == pytest.approx(-0.3) and report["regressions"][0]["ci_high"] < 0
    [rec] = report["recovered"]
    assert (rec["stage"], rec["domain"], rec["regressed"]) == ("mopd", "a", True)
    assert rec["fraction"] == pytest.approx(2 / 3) and rec["change_ci_low"] > 0
    assert report["intervals"]["mdrl"]["a"]["mean"] == pytest.approx(0.4)
    assert report["pass_at_k"]["mopd"]["a"]["mean"] == pytest.approx(0.65)

    summary = summary_json(report, wall_s=12.5)
    assert summary["wall_s"] == 12.5 and [s["stage"] for s in summary["stages"]] == STAGES
    assert set(summary["stages"][0]["domains"]["a"]) == {"mean", "ci_low", "ci_high", "n", "pass_at_k"}
    assert summary["stages"][0]["domains"]["a"]["n"] == 100
    assert set(summary["deltas"][0]) == {"stage", "domain", "delta", "ci_low", "ci_high", "n", "init"}
    table = markdown_table(report)
    assert "| sft (skipped: the base model) | 0.500 [" in table and "Δ -0.300 [" in table and "**v**" in table
    assert "mdrl: mean over a, b of the paired deltas against if_rl: -0.045 [" in table


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def test_tiny_cascade_validates_the_base_then_learns_in_partial_layer_mode(tmp_path, tok):
    """The base model (no record) is validated by the disabled first stage; a GRPO stage training only
    the top decoder layer learns to start answers with the base model's third most likely first token:
    its paired delta against the base is +1 on every prompt, the frozen weights are untouched, and the
    step log has the entropy and KL-to-init curves."""
    prompts = ["Say yes."] * 4  # four held-out rows (uuids b0-b3) of one prompt
    model = tiny_llama(len(tok), initializer_range=0.5)
    model.save_pretrained(tmp_path / "init")
    tok.save_pretrained(tmp_path / "init")
    for split in ("train", "validation"):
        write_parquet(rl_table(prompts), tmp_path / "set" / f"{split}.parquet")
    ids = tok.apply_chat_template([{"role": "user", "content": prompts[0]}], add_generation_prompt=True,
                                  return_dict=False)
    with torch.no_grad():
        target = tok.decode([int(model(torch.tensor([ids])).logits[0, -1].topk(3).indices[2])])
    common = {"runner": "grpo", "datasets": [str(tmp_path / "set")], "seed": 0, "rollout_engine": "hf",
              "checkpoint_root": str(tmp_path / "ckpt"), "metrics_dir": str(tmp_path / "metrics"),
              "plots_dir": str(tmp_path / "plots"),
              "eval": {"datasets": [str(tmp_path / "set")], "rows": 4, "max_new_tokens": 2, "samples": 4}}
    base = GRPOConfig.model_validate({**common, "name": "base", "enabled": False})
    pass_through(GRPOStage(base, environment=StartsWith(target)), tmp_path / "init")
    rl = GRPOConfig.model_validate({**common, "name": "toy_rl", "steps": 8, "prompts_per_step": 2, "group_size": 8,
                                    "trainable_layers": 1, "track_kl": True, "mask_truncated": False,
                                    "sampling": {"max_new_tokens": 2, "batch_size": 16},
                                    "optim": {"lr": 3e-3, "min_lr_ratio": 1.0}})
    result = GRPOStage(rl, environment=StartsWith(target)).run(rl.datasets, tmp_path / "ckpt" / "base")

    before, after = read_scores(tmp_path / "ckpt" / "base")["set"], read_scores(result.checkpoint)["set"]
    assert before["uuid"] == after["uuid"] == ["b0", "b1", "b2", "b3"]
    assert before["reward"] == [0.0] * 4 and after["reward"] == [1.0] * 4
    assert [len(s) for s in after["sample_passed"]] == [4] * 4
    report = build_report(["base", "toy_rl"], tmp_path / "ckpt")
    assert [(d["stage"], d["delta"], d["ci_low"], d["ci_high"]) for d in report["deltas"]] == [("toy_rl", 1.0, 1.0, 1.0)]
    assert result.summary["validation"]["set"]["pass@4"] == report["pass_at_k"]["toy_rl"]["set"]["mean"]
    assert "scores" not in json.loads(result.metrics.read_text())["validation"]["set"]  # the record keeps aggregates

    trained, init = load_file(result.checkpoint / "model.safetensors"), load_file(tmp_path / "init" / "model.safetensors")
    frozen = [k for k in init if not k.startswith(("model.layers.1.", "model.norm."))]
    assert frozen and all(torch.equal(trained[k], init[k]) for k in frozen)
    assert not torch.equal(trained["model.layers.1.mlp.up_proj.weight"], init["model.layers.1.mlp.up_proj.weight"])
    assert result.summary["counts"]["trainable_parameters"] == sum(init[k].numel() for k in init if k not in frozen)
    rows = list(csv.DictReader((tmp_path / "plots" / "toy_rl.csv").open()))
    kl = [float(r["kl"]) for r in rows if r["kl"]]  # a step whose groups were all filtered trains nothing
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and max(kl) > 1e-3
    assert all(float(r["entropy"]) > 0 for r in rows if r["entropy"])
    curves = curve_summary(["base", "toy_rl"], tmp_path / "metrics")["toy_rl"]  # the skipped base logs no steps
    assert curves["reward_mean"]["steps"] == 8 and curves["reward_mean"]["last"] > curves["reward_mean"]["first"]
    assert curves["kl"]["last"] > 1e-3

"""SWE RL: the masked multi-turn policy gradient, and the stage end to end (tiny model fast,
SmolLM2-135M slow)."""

from __future__ import annotations

import json

import pytest
import torch

from stages.grpo import accumulate_policy_gradient
from stages.logprobs import policy_batch, response_logprobs
from stages.rollout import Rollouts
from stages.swe_rl import SWERLConfig, SWERLStage
from tests.swe_rows import build_set
from tests.tiny_lm import tiny_llama


def test_tool_tokens_get_no_gradient_and_do_not_dilute_the_normalizer():
    model = tiny_llama(64, seed=1)
    ro = Rollouts([[3, 4], [5]], [[6, 7, 8, 9], [10, 11, 12]], [[0.0] * 4, [0.0] * 3], [False, False], ["", ""], 2)
    masks = [[1, 0, 0, 1], [1, 1, 0]]
    adv = torch.tensor([1.0, -1.0])
    cfg = SWERLConfig(name="t", runner="swe_rl", datasets=[], group_size=2, micro_batch_size=1)
    stats = accumulate_policy_gradient(model, lambda loss: loss.backward(), ro, adv, [0, 1], cfg, 0, loss_masks=masks)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    lp = response_logprobs(model, policy_batch(ro, [0, 1], 0))
    # REINFORCE over the 4 model tokens only: -(A_0 (lp00 + lp03) + A_1 (lp10 + lp11)) / 4
    (-(adv[0] * (lp[0, 0] + lp[0, 3]) + adv[1] * (lp[1, 0] + lp[1, 1])) / 4).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-7)
    assert stats["trained_tokens"] == 4.0


def _stage(tmp_path, init, **over):
    data = tmp_path / "swe"
    build_set(data, task_ids=(13,))
    cfg = SWERLConfig.model_validate({
        "name": "swe_rl", "runner": "swe_rl", "rollout_engine": "hf", "datasets": [str(data)], "steps": 1,
        "prompts_per_step": 1,
        "group_size": 2, "micro_batch_size": 2, "max_prompt_tokens": 2048, "max_context_tokens": 4096,
        "validation_rows": 1, "checkpoint_root": str(tmp_path / "ckpt"), "metrics_dir": str(tmp_path / "metrics"),
        "plots_dir": str(tmp_path / "plots"), "eval": {"datasets": []}, "dynamic_filtering": False,
        "sampling": {"max_new_tokens": 8}, "agent": {"max_steps": 2}, **over})
    return SWERLStage(cfg).run([data], init)


def test_stage_runs_episodes_trains_and_records_a_checkpoint(tmp_path, smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    init = tmp_path / "init"
    tiny_llama(len(tok), initializer_range=0.5).save_pretrained(init)
    tok.save_pretrained(init)
    result = _stage(tmp_path, init)
    final = result.summary["final"]
    assert final["steps"] == 2.0 and final["finish/max_steps"] == 1.0  # random model: no submit, 2 turns each
    assert 0 < final["model_tokens"] <= 16 < final["episode_tokens"]     # 2 turns x 8 sampled tokens; tool turns masked
    assert final["trained_tokens"] == final["model_tokens"] * 2 and final["reward_mean"] == 0.0
    record = json.loads((result.checkpoint / "cascade_checkpoint.json").read_text())
    assert record["lineage"] == ["swe_rl"] and record["validation"]["swe"]["rows"] == 1.0


@pytest.mark.slow
def test_swe_rl_on_smollm2_end_to_end(tmp_path, smollm2_dir):
    result = _stage(tmp_path, smollm2_dir, steps=2, sampling={"max_new_tokens": 96}, dynamic_filtering=True,
                    agent={"max_steps": 3})
    print(json.dumps(result.summary, indent=1))
    assert (result.checkpoint / "model.safetensors").exists()
    assert result.summary["final"]["steps"] >= 1.0

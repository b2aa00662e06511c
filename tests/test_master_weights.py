"""bf16 parameters with fp32 master weights (``param_dtype: bfloat16``, stages/master_weights.py): gradients
accumulate in fp32, AdamW steps the masters as it would fp32 weights, the parameters are the masters rounded,
saves and resumes hold the masters, and every model family trains this way."""

import copy

import pytest
import torch
from safetensors.torch import load_file

from stages.base import StageConfig
from stages.logprobs import policy_batch, response_logprobs
from stages.train_engine import OptimConfig, TorchEngine, build_optimizer, make_train_engine, train_top_layers
from tests.test_model_families import _rollouts
from tests.tiny_lm import FAMILIES, tiny_llama

OPTIM = OptimConfig(lr=1e-2, warmup_steps=0, max_grad_norm=0.5)


def _loss(model, seed: int) -> torch.Tensor:
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(seed))
    return model(input_ids=ids, labels=ids).loss.float()


def test_grads_accumulate_in_fp32_and_adamw_steps_the_masters_as_fp32_weights():
    model = tiny_llama(64)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    twin = copy.deepcopy(model)  # the same bf16 computation, by hand
    for p in twin.parameters():
        p.data = p.data.to(torch.bfloat16)
    engine = TorchEngine(model, OPTIM, total_steps=4, param_dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # buffers stay as loaded
    grads = []
    for seed in (0, 1):
        engine.backward(_loss(engine.model, seed))
        _loss(twin, seed).backward()
        grads.append({n: p.grad.clone() for n, p in twin.named_parameters()})
        twin.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())  # freed into the masters
    names = [n for n, _ in model.named_parameters()]
    for name, master in zip(names, engine.params, strict=True):
        assert master.dtype == torch.float32
        assert torch.equal(master.grad, grads[0][name].float() + grads[1][name].float())  # fp32 sum, not bf16

    # reference: fp32 weights stepped by the same AdamW on the same (clipped) gradients
    ref = [torch.nn.Parameter(start[n].clone()) for n in names]
    for p, n in zip(ref, names, strict=True):
        p.grad = grads[0][n].float() + grads[1][n].float()
    ref_opt, _ = build_optimizer(ref, OPTIM, 4)
    torch.nn.utils.clip_grad_norm_(ref, OPTIM.max_grad_norm)
    ref_opt.step()
    stats = engine.step()
    assert stats["grad_norm"] > OPTIM.max_grad_norm  # clipping was applied
    for name, p, master, r in zip(names, model.parameters(), engine.params, ref, strict=True):
        assert torch.equal(master, r), name
        assert torch.equal(p, master.to(torch.bfloat16)), name  # the parameters are the masters, rounded
        assert not torch.equal(master, start[name]), name


def test_a_later_step_reuses_the_gradient_buffers_and_leaves_unused_masters_without_a_gradient():
    model = tiny_llama(64)
    engine = TorchEngine(model, OPTIM, total_steps=4, param_dtype="bfloat16")
    engine.backward(_loss(engine.model, 0))
    storage = [m.grad.data_ptr() for m in engine.params]
    engine.step()
    assert all(m.grad is None for m in engine.params)
    twin = copy.deepcopy(model)  # bf16 parameters after the step: the same computation by hand
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    engine.backward(model.model.embed_tokens(ids).float().pow(2).sum())  # touches the embedding only
    twin.model.embed_tokens(ids).float().pow(2).sum().backward()
    embedding = next(i for i, (n, _) in enumerate(model.named_parameters()) if n == "model.embed_tokens.weight")
    for i, (master, (name, p)) in enumerate(zip(engine.params, twin.named_parameters(), strict=True)):
        if i == embedding:
            assert master.grad.data_ptr() == storage[i]  # the kept buffer, not a fresh one
            assert torch.equal(master.grad, p.grad.float())  # this step's gradient only, no stale sum
        else:
            assert master.grad is None and p.grad is None, name  # unused this step: no gradient, not a stale one


def test_saves_hold_the_masters_and_a_resumed_engine_steps_bitwise_alike(tmp_path):
    engine = TorchEngine(tiny_llama(64), OPTIM, total_steps=4, param_dtype="bfloat16")
    engine.backward(_loss(engine.model, 0))
    engine.step()
    engine.save(tmp_path / "ckpt")
    saved = load_file(tmp_path / "ckpt" / "model.safetensors")
    masters = dict(zip([n for n, _ in engine.module.named_parameters()], engine.params, strict=True))
    assert all(torch.equal(saved[n], m) for n, m in masters.items())  # fp32, not the bf16 rounding
    assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters())  # back to bf16 after the save
    (tmp_path / "state").mkdir()
    engine.save_state(tmp_path / "state")

    resumed = TorchEngine(tiny_llama(64, seed=5), OPTIM, total_steps=4, param_dtype="bfloat16")
    resumed.load_state(tmp_path / "state")
    for e in (engine, resumed):
        e.backward(_loss(e.model, 1))
        e.step()
    assert all(torch.equal(a, b) for a, b in zip(engine.params, resumed.params, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(engine.module.parameters(), resumed.module.parameters(), strict=True))


def test_frozen_layers_keep_their_fp32_values_in_the_saved_checkpoint(tmp_path):
    model = tiny_llama(64)
    train_top_layers(model, 1)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    engine = TorchEngine(model, OPTIM, total_steps=2, param_dtype="bfloat16")
    assert len(engine.params) == sum(p.requires_grad for p in model.parameters())
    engine.backward(_loss(engine.model, 0))
    engine.step()
    engine.save(tmp_path / "ckpt")
    saved = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert frozen and all(torch.equal(saved[n], v) for n, v in frozen.items() if n in saved)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "nemotron_h", "granitemoehybrid", "jamba"])
def test_every_family_trains_in_bf16_with_fp32_masters(family):
    """The prompt-shared scoring of rollouts runs in bf16 on each family (attention, MoE, Mamba caches),
    its log-probs within bf16 rounding of the fp32 model's, and one step moves every trained master."""
    model = FAMILIES[family](128)
    batch = policy_batch(_rollouts(), list(range(6)), pad_id=2)
    with torch.no_grad():
        full = response_logprobs(model, batch)
    engine = make_train_engine("torch", model, OPTIM, 2, dtype="bfloat16", param_dtype="bfloat16")
    assert engine.model is model  # no autocast wrapper
    logprobs = response_logprobs(engine.model, batch)
    mask = batch["response_mask"]
    assert float((logprobs - full)[mask].abs().mean()) < 0.05
    engine.backward(-(logprobs * mask).sum() / mask.sum())
    before = [m.detach().clone() for m in engine.params]
    engine.step()
    moved = [not torch.equal(b, m) for b, m in zip(before, engine.params, strict=True)]
    assert sum(moved) >= 0.9 * len(moved), f"{family}: {sum(moved)}/{len(moved)} masters moved"


def test_bf16_params_need_a_bf16_stage_and_the_torch_engine():
    with pytest.raises(ValueError, match="stage s: param_dtype bfloat16 needs dtype bfloat16"):
        StageConfig(name="s", runner="grpo", datasets=[], param_dtype="bfloat16")
    with pytest.raises(ValueError, match="param_dtype bfloat16 needs train_engine torch"):
        make_train_engine("deepspeed", tiny_llama(64), OPTIM, 1, dtype="bfloat16", param_dtype="bfloat16")
    with pytest.raises(ValueError, match="param_dtype must be float32 or bfloat16"):
        TorchEngine(tiny_llama(64), OPTIM, 1, param_dtype="float16")


def test_packed_sft_trains_with_bf16_params_as_under_autocast():
    """The SFT stage's packed forward (document-isolated attention) on bf16 parameters: the same losses as
    autocast with fp32 weights, to bf16 rounding, over two steps."""
    from packing.dataset import collate_packed
    from stages.sft import accumulate_sft
    from tests.tiny_lm import packed_row

    batch = [collate_packed([packed_row()])]
    losses = {}
    for param_dtype in ("float32", "bfloat16"):
        engine = make_train_engine("torch", tiny_llama(64), OPTIM, 2, dtype="bfloat16", param_dtype=param_dtype)
        losses[param_dtype] = []
        for _ in range(2):
            losses[param_dtype].append(accumulate_sft(engine.model, engine.backward, batch)["loss"])
            engine.step()
    assert losses["float32"][0] - losses["float32"][1] > 0.5  # the first step moved the model (4.25 -> 3.49)
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=2e-2)

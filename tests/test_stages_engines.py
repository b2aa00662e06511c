"""Train engines (stages/train_engine.py): torch == deepspeed (ZeRO-2, one process), AdamW + cosine knobs."""

import math
from pathlib import Path

import pytest
import torch
import yaml

from packing.dataset import collate_packed
from stages.sft import accumulate_sft
from stages.train_engine import OptimConfig, TorchEngine, make_train_engine, train_top_layers
from tests.tiny_lm import packed_row, tiny_llama

REPO = Path(__file__).resolve().parents[1]


def _two_steps(engine_name: str, zero_stage: int = 2, trainable_layers: int | None = None
               ) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = tiny_llama(64)
    if trainable_layers is not None:
        train_top_layers(model, trainable_layers)
    engine = make_train_engine(engine_name, model, OptimConfig(lr=1e-2, warmup_steps=0), total_steps=4,
                               zero_stage=zero_stage)
    batch = [collate_packed([packed_row()])]
    losses = []
    for _ in range(2):
        losses.append(accumulate_sft(engine.model, engine.backward, batch)["loss"])
        engine.step()
    with engine.gathered():
        return losses, {k: v.detach().clone() for k, v in engine.module.named_parameters()}


@pytest.mark.slow  # ~1.5 min: bash scripts/test.sh -m slow tests/test_stages_engines.py
def test_torch_and_deepspeed_zero2_give_the_same_loss_for_two_steps():
    """DeepSpeed's first initialize compiles its shm op (~40 s on a fresh machine, cached after)."""
    pytest.importorskip("deepspeed", reason="install the `distributed` extra")
    torch_losses, torch_params = _two_steps("torch")
    ds_losses, ds_params = _two_steps("deepspeed")
    assert torch_losses[0] != pytest.approx(torch_losses[1], abs=1e-4)  # the first step changed the model
    assert ds_losses == pytest.approx(torch_losses, abs=1e-6)
    assert all(torch.allclose(ds_params[k], torch_params[k], atol=1e-6) for k in torch_params)


@pytest.mark.slow  # DeepSpeed start-up (~45 s): bash scripts/test.sh -m slow tests/test_stages_engines.py
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_partial_layer_mode_trains_the_top_layer_alike_on_torch_and_deepspeed(zero_stage):
    """``trainable_layers`` (the learning preset's partial-layer mode) at scale: DeepSpeed ZeRO-2/3 step
    the same top layer as torch and leave the frozen layers and embeddings as they were."""
    pytest.importorskip("deepspeed", reason="install the `distributed` extra")
    initial = dict(tiny_llama(64).named_parameters())
    torch_losses, torch_params = _two_steps("torch", trainable_layers=1)
    ds_losses, ds_params = _two_steps("deepspeed", zero_stage, trainable_layers=1)
    frozen = [k for k in initial if not k.startswith(("model.layers.1.", "model.norm."))]
    assert frozen and all(torch.equal(torch_params[k], initial[k]) and torch.equal(ds_params[k], initial[k])
                          for k in frozen)
    assert not torch.equal(torch_params["model.layers.1.self_attn.q_proj.weight"],
                           initial["model.layers.1.self_attn.q_proj.weight"])
    assert ds_losses == pytest.approx(torch_losses, abs=1e-6)
    # ZeRO-3 sums partitioned gradients in another order: 5e-6 after two steps at lr 1e-2
    assert all(torch.allclose(ds_params[k], torch_params[k], atol=1e-6 if zero_stage < 3 else 2e-5) for k in torch_params)
    with pytest.raises(ValueError, match=r"trainable_layers must be in \[1, 2\] for LlamaForCausalLM, got 3"):
        train_top_layers(tiny_llama(64), 3)


@pytest.mark.parametrize(("family", "norm"), [("nemotron_h", "model.norm_f.weight"),
                                              ("jamba", "model.final_layernorm.weight")])
def test_partial_layer_mode_trains_the_final_norm_of_hybrid_families(family, norm):
    from tests.tiny_lm import FAMILIES

    model = FAMILIES[family](64)
    train_top_layers(model, 1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    last = f"model.layers.{len(model.get_decoder().layers) - 1}."
    assert norm in trainable and all(n == norm or n.startswith(last) for n in trainable)


def test_adamw_groups_and_cosine_warmup_schedule():
    model = tiny_llama(64)
    cfg = OptimConfig(lr=1e-3, warmup_steps=2, min_lr_ratio=0.1)
    engine = TorchEngine(model, cfg, total_steps=6)
    decayed, plain = engine.optimizer.param_groups
    assert decayed["betas"] == (0.9, 0.98) and decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decayed["params"]) and all(p.ndim == 1 for p in plain["params"])
    lrs = []
    for _ in range(6):
        model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
        lrs.append(engine.step()["lr"])
    cosine = [1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 4))) for s in range(2, 6)]
    assert lrs == pytest.approx([0.0, 5e-4, *cosine])


def test_params_carry_the_paper_optimizer_defaults():
    cascade = yaml.safe_load((REPO / "params.yaml").read_text())["cascade"]
    optim = OptimConfig.model_validate(cascade["defaults"]["optim"])
    assert optim.betas == (0.9, 0.98) and optim.weight_decay == 0.1
    with pytest.raises(ValueError, match="no train engine 'fsdp'"):
        make_train_engine("fsdp", tiny_llama(64), optim, 1)

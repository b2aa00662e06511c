"""Train engines (stages/train_engine.py): torch == deepspeed (ZeRO-2, one process), AdamW + cosine knobs."""

import math
from pathlib import Path

import pytest
import torch
import yaml

from packing.dataset import collate_packed
from stages.sft import accumulate_sft
from stages.train_engine import OptimConfig, TorchEngine, make_train_engine
from tests.tiny_lm import packed_row, tiny_llama

REPO = Path(__file__).resolve().parents[1]


def _two_steps(engine_name: str) -> tuple[list[float], torch.Tensor]:
    model = tiny_llama(64)
    engine = make_train_engine(engine_name, model, OptimConfig(lr=1e-2, warmup_steps=0), total_steps=4, zero_stage=2)
    batch = [collate_packed([packed_row()])]
    losses = []
    for _ in range(2):
        losses.append(accumulate_sft(engine.model, engine.backward, batch)["loss"])
        engine.step()
    return losses, torch.cat([p.detach().flatten() for p in engine.module.parameters()])


def test_torch_and_deepspeed_zero2_give_the_same_loss_for_two_steps():
    """DeepSpeed's first initialize compiles its shm op (~40 s on a fresh machine, cached after)."""
    pytest.importorskip("deepspeed", reason="install the `distributed` extra")
    torch_losses, torch_params = _two_steps("torch")
    ds_losses, ds_params = _two_steps("deepspeed")
    assert torch_losses[0] != pytest.approx(torch_losses[1], abs=1e-4)  # the first step changed the model
    assert ds_losses == pytest.approx(torch_losses, abs=1e-6)
    assert torch.allclose(ds_params, torch_params, atol=1e-6)


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

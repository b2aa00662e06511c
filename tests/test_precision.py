"""Mixed precision (a stage's ``dtype``): autocast with fp32 master weights, the sampler's settings and the
KL reference read from the init checkpoint (the push in the engine's dtype: tests/test_weight_push.py)."""

import pytest
import torch
from safetensors.torch import load_file

from stages.rollout import BF16_LOGPROB_DIFF, SamplingConfig
from stages.runtime import StageRun
from stages.train_engine import in_precision
from tests.test_grpo import _stage_setup
from tests.tiny_lm import smollm2_tokenizer, tiny_llama


def test_bf16_forward_computes_in_bf16_and_keeps_fp32_weights_and_gradients():
    model = tiny_llama(256)
    ids = torch.randint(3, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(input_ids=ids).logits
    forward = in_precision(model, model, "bfloat16")
    logits = forward(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16
    assert float((logits.float() - full).abs().max()) < 2e-2 * float(full.abs().max())  # bf16: 8 mantissa bits
    logits.float().logsumexp(-1).sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert in_precision(model, model, "float32") is model
    with pytest.raises(ValueError, match="float32 or bfloat16, got 'float16'"):
        in_precision(model, model, "float16")


def test_a_bf16_stage_samples_in_bf16_with__its_tolerance_unless_the_config_sets_them():
    default = SamplingConfig().for_dtype("bfloat16")
    assert default.vllm.dtype == default.hf.dtype == "bfloat16" and default.max_logprob_diff == BF16_LOGPROB_DIFF
    pinned = SamplingConfig(max_logprob_diff=0.5, vllm={"dtype": "float32"}).for_dtype("bfloat16")
    assert pinned.vllm.dtype == "float32" and pinned.hf.dtype == "bfloat16" and pinned.max_logprob_diff == 0.5
    fp32 = SamplingConfig()
    assert fp32.for_dtype("float32") is fp32


def test_the_kl_reference_is_the_init_checkpoint_not_the_trained_policy(tmp_path):
    _, cfg = _stage_setup(tmp_path, smollm2_tokenizer(), ["Say yes."], kl_beta=0.1, dtype="bfloat16")
    init = load_file(tmp_path / "init" / "model.safetensors")
    with StageRun(cfg, cfg.datasets, tmp_path / "init") as run:
        with torch.no_grad():
            for p in run.engine.module.parameters():
                p.add_(1.0)  # the policy moved away from its init
        ref = run.reference_model()
        weights = ref.forward.state_dict()  # bf16 stage: the reference runs under autocast
        assert all(torch.equal(weights[k], v) for k, v in init.items())
        assert not any(p.requires_grad for p in ref.forward.parameters()) and not ref.forward.training

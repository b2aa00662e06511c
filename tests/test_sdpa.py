"""The trainer's SDPA kernel on CPU (stages/sdpa.py): the math kernel for rows of up to MATH_MAX_KEYS keys,
PyTorch's flash kernel beyond, the same log-probs and gradients either way."""

import torch
from torch.profiler import profile
from transformers import DynamicCache

from stages import sdpa
from stages.lm_head import final_hidden_states
from stages.sdpa import MATH_MAX_KEYS, key_length
from stages.train_engine import checkpoint_activations
from tests.tiny_lm import tiny_llama

FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"


def _kernels(model, width: int) -> set[str]:
    ids = torch.randint(3, 64, (2, width), generator=torch.Generator().manual_seed(0))
    with profile() as prof:
        hidden, _ = final_hidden_states(model, input_ids=ids, attention_mask=torch.ones_like(ids))
        hidden.float().pow(2).sum().backward()
    return {e.key for e in prof.key_averages()}


def test_short_rows_run_the_math_kernel_and_long_rows_the_flash_kernel():
    model = tiny_llama(64)
    assert model.config._attn_implementation == "sdpa"
    assert FLASH not in _kernels(model, MATH_MAX_KEYS)
    assert FLASH in _kernels(model, MATH_MAX_KEYS + 1)
    ids = torch.randint(3, 64, (2, 8))
    with profile() as prof:  # outside the trainer's forward, PyTorch's own choice is untouched
        model(input_ids=ids)
    assert FLASH in {e.key for e in prof.key_averages()}


def test_recomputed_layers_keep_the_flash_kernel_on_short_rows():
    model = tiny_llama(64)
    checkpoint_activations(model)  # the backward recomputes each layer outside kernel_for: same kernel both times
    model.train()
    assert FLASH in _kernels(model, 8)  # and the backward ran (a kernel mismatch raises CheckpointError)


def test_math_and_flash_kernels_give_the_same_logprobs_and_gradients(monkeypatch):
    results = []
    for max_keys in (MATH_MAX_KEYS, 0):  # 0: the flash kernel on the same short rows
        monkeypatch.setattr(sdpa, "MATH_MAX_KEYS", max_keys)
        model = tiny_llama(64)
        ids = torch.randint(3, 64, (3, 40), generator=torch.Generator().manual_seed(1))
        mask = torch.ones_like(ids)
        mask[0, :5] = 0  # a left-padded row
        hidden, _ = final_hidden_states(model, input_ids=ids, attention_mask=mask)
        hidden[mask.bool()].pow(2).sum().backward()
        results.append((hidden[mask.bool()].detach(), model.model.layers[0].self_attn.q_proj.weight.grad))
    (h_math, g_math), (h_flash, g_flash) = results
    torch.testing.assert_close(h_math, h_flash, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_math, g_flash, rtol=1e-4, atol=1e-6)


def test_key_length_counts_the_cache_and_the_mask():
    ids = torch.zeros(2, 5, dtype=torch.long)
    assert key_length({"input_ids": ids}) == 5
    assert key_length({"input_ids": ids, "attention_mask": torch.ones(2, 12)}) == 12
    cache = DynamicCache()
    cache.update(torch.zeros(2, 1, 7, 4), torch.zeros(2, 1, 7, 4), 0)
    assert key_length({"input_ids": ids, "past_key_values": cache}) == 12
    assert key_length({"inputs_embeds": torch.zeros(2, 3, 4)}) == 3

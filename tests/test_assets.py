"""Model assets (corpora/assets.py): the same GGUF gives the same bytes under any transformers release."""

import json

from transformers import AutoConfig

from corpora.assets import _unstamp
from tests.tiny_lm import ensure_smollm2, tiny_llama


def test_saved_configs_carry_no_transformers_version_and_still_load(tmp_path):
    model = tiny_llama(64)
    model.save_pretrained(tmp_path)
    assert "transformers_version" in json.loads((tmp_path / "config.json").read_text())  # what transformers does
    _unstamp(tmp_path)
    for name in ("config.json", "generation_config.json"):
        assert "transformers_version" not in json.loads((tmp_path / name).read_text()), name
    assert AutoConfig.from_pretrained(tmp_path).hidden_size == 64


def test_the_saved_tokenizer_is_the_same_bytes_online_and_offline(tmp_path, monkeypatch):
    """transformers saves ``local_files_only`` into tokenizer_config.json, true under ``HF_HUB_OFFLINE=1``:
    the asset step's output (and ``dvc.lock``) depended on that variable until the flag was unstamped."""
    from transformers import AutoTokenizer

    saved = {}
    for offline in (False, True):
        monkeypatch.setattr("transformers.tokenization_utils_base.is_offline_mode", lambda offline=offline: offline)
        out = tmp_path / str(offline)
        AutoTokenizer.from_pretrained(ensure_smollm2()).save_pretrained(out)
        saved[offline] = json.loads((out / "tokenizer_config.json").read_text())["local_files_only"]
        _unstamp(out)
        saved[f"bytes {offline}"] = (out / "tokenizer_config.json").read_bytes()
    assert (saved[False], saved[True]) == (False, True)  # what transformers does
    assert saved["bytes False"] == saved["bytes True"]

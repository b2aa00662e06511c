"""Model assets (corpora/assets.py): the same GGUF gives the same bytes under any transformers release."""

import json

from transformers import AutoConfig

from corpora.assets import _unstamp
from tests.tiny_lm import tiny_llama


def test_saved_configs_carry_no_transformers_version_and_still_load(tmp_path):
    model = tiny_llama(64)
    model.save_pretrained(tmp_path)
    assert "transformers_version" in json.loads((tmp_path / "config.json").read_text())  # what transformers does
    _unstamp(tmp_path)
    for name in ("config.json", "generation_config.json"):
        assert "transformers_version" not in json.loads((tmp_path / name).read_text()), name
    assert AutoConfig.from_pretrained(tmp_path).hidden_size == 64

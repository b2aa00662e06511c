"""Params presets (curation/presets.py): the printed overrides, applied by DVC's own ``-S`` code, give
exactly params.yaml merged with the preset; values that need quoting survive the round trip."""

import re
import shutil
from pathlib import Path

import pytest
import yaml
from dvc.utils.hydra import apply_overrides

from curation.cli import main as cascade_main
from curation.presets import hydra_value, overrides, preset_overrides
from stages.cli import merge

REPO = Path(__file__).resolve().parents[1]


class _Yaml12(yaml.SafeLoader):
    """PyYAML reading floats as YAML 1.2 (and DVC, which writes ``3e-05``) does: ``3e-05`` is a float."""


_Yaml12.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def test_the_learning_preset_through_dvc_set_param_equals_the_merged_params(tmp_path):
    params = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", params)
    sets = preset_overrides(REPO / "presets/learning.yaml", params)
    apply_overrides(params, sets)
    expected = merge(yaml.safe_load((REPO / "params.yaml").read_text()),
                     yaml.safe_load((REPO / "presets/learning.yaml").read_text()))
    assert yaml.load(params.read_text(), _Yaml12) == expected
    # a mapping where params.yaml holds a scalar is replaced whole, not split into keys
    assert "++cascade.defaults.eval.max_new_tokens={instruction_following:128,stem_mcqa:64,tool_calling:128," \
           "structured_output:96}" in sets


@pytest.mark.parametrize("value", ["data/sets/rl/x", "a b", "it's", "true", "1e-5", "x:y", "", "back\\slash",
                                   "end\\", "q\\'x", None, True, 3, 2.5e-05, ["a b", 1, None], {"k": [1, "v w"]}])
def test_values_round_trip_through_dvc(tmp_path, value):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"a": {"b": 0}}))
    apply_overrides(params, overrides({"a": {"c": value}}, {"a": {"b": 0}}))
    assert yaml.load(params.read_text(), _Yaml12) == {"a": {"b": 0, "c": value}}
    assert hydra_value("plain_path/x.y") == "plain_path/x.y"


def test_cli_prints_overrides_and_names_a_bad_preset(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"a": {"b": 1}}))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"a": {"b": 2}}))
    (tmp_path / "bad.yaml").write_text("- 1\n")
    monkeypatch.chdir(tmp_path)
    assert cascade_main(["preset", "p.yaml"]) == 0
    assert capsys.readouterr().out == "++a.b=2\n"
    assert cascade_main(["preset", "bad.yaml"]) == 1
    assert "bad.yaml: a preset is a mapping of params keys, got list" in capsys.readouterr().err
    assert cascade_main(["preset", "missing.yaml"]) == 1
    assert "missing.yaml not found" in capsys.readouterr().err

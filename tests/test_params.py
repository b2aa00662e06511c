"""Typed params.yaml (curation/params.py): the repository's file is valid; a typo or an out-of-range
value stops a step before any work with one line naming the key; ``cascade stages`` lists the fields."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from curation.params import check_params

REPO = Path(__file__).resolve().parents[1]
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))


def _with(path: list[str], value):
    params = copy.deepcopy(PARAMS)
    block = params
    for key in path[:-1]:
        block = block[key]
    block[path[-1]] = value
    return params


def test_the_repository_params_are_valid_and_every_value_reaches_its_model_unchanged():
    params = check_params(PARAMS)
    dumped = params.model_dump()
    for block, values in PARAMS.items():  # every key the file sets, at the value it sets
        if block == "cascade":
            assert dumped[block] == values
            continue
        for key, value in values.items():
            got = dumped[block][key]
            assert (got == value if not isinstance(value, dict) else {k: got[k] for k in value} == value), (block, key)
    assert params.tokenize.check_every == 50 and params.dedup.near.alarms.max_cluster_size == 200


@pytest.mark.parametrize("path,value,message", [
    (["dedup", "near", "treshold"], 0.8, "params.yaml dedup.near.treshold: unknown key (did you mean 'threshold'?)"),
    (["dedup", "near", "threshold"], 1.7, "params.yaml dedup.near.threshold: Input should be less than or equal to 1 "
                                          "(got 1.7)"),
    (["pack", "pack_length"], 0, "params.yaml pack.pack_length: Input should be greater than or equal to 1 (got 0)"),
    (["export", "rows_per_shard"], 0, "params.yaml export.rows_per_shard: Input should be greater than or equal "
                                      "to 1 (got 0)"),
    (["tokenize", "overflow"], "drop", "params.yaml tokenize.overflow: Input should be 'reject', 'truncate' or "
                                       "'split' (got 'drop')"),
    (["difficulty", "min"], -0.5, "params.yaml difficulty.min: Input should be greater than or equal to 0 (got -0.5)"),
    (["decontaminate", "min_coverage"], [0.5], "params.yaml decontaminate.min_coverage: one coverage per n of "
                                               "ngrams [8, 13], got 1"),
])
def test_a_bad_key_is_one_line_naming_it(path, value, message):
    with pytest.raises(ValueError) as exc:
        check_params(_with(path, value))
    assert str(exc.value) == message


def test_the_cli_refuses_before_any_work(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(_with(["dedup", "near", "treshold"], 0.8)))
    cascade = Path(sys.executable).with_name("cascade")
    proc = subprocess.run([str(cascade), "dedup"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "cascade dedup: error: params.yaml dedup.near.treshold: unknown key (did you mean 'threshold'?)"]
    assert list(tmp_path.iterdir()) == [tmp_path / "params.yaml"]  # nothing written
    listing = subprocess.run([str(cascade), "stages"], cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    assert "runner grpo (stages.grpo.GRPOStage" in listing and "  group_size: int = 4" in listing
    assert "  mopd: runner mopd;" in listing


def test_a_block_checked_on_its_own_fails_in_the_same_words():
    from validators.verifiers.sandbox import SandboxParams

    for block in ({"requir": "bwrap"}, {"require": "chroot"}):
        with pytest.raises(ValueError) as alone:
            SandboxParams.from_block(block)
        with pytest.raises(ValueError) as whole:
            check_params({**PARAMS, "sandbox": block})
        assert str(alone.value) == str(whole.value)
    assert str(alone.value) == "params.yaml sandbox.require: Input should be 'bwrap', 'unshare' or 'rlimits' (got 'chroot')"

"""RL stages read the difficulty-filtered sets when the filter measured them, and say so in the record."""

from pathlib import Path

import pytest

from common.io import write_json, write_parquet
from stages.checkpoints import read_record, write_record
from stages.datasets import describe_dataset, resolve_datasets
from tests.rows import rl_table

MANIFEST = {"bounds": [0.0, 1.0], "model": "SmolLM2-135M-Instruct", "n": 4,
            "sets": {"rl/instruction_following": {"rows": 3, "measured": 2, "kept": 1},
                     "rl/mopd": {"rows": 3, "kept": 1, "unmeasured_domains": []}}}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A working directory with full sets, the filter's copies of two of them, and no manifest yet."""
    monkeypatch.chdir(tmp_path)
    full = rl_table(["a", "b", "c"])
    for name in ("instruction_following", "mopd", "code"):
        write_parquet(full, Path("data/sets/rl") / name / "train.parquet")
    for name in ("instruction_following", "mopd"):
        write_parquet(full.head(1), Path("data/filtered/rl") / name / "train.parquet")
    return tmp_path


DATASETS = ["data/sets/rl/instruction_following", "data/sets/rl/mopd", "data/sets/rl/code", "data/packed"]


def test_without_the_filter_every_set_is_read_in_full(repo):
    assert resolve_datasets(DATASETS) == [Path(d) for d in DATASETS]
    assert describe_dataset("data/sets/rl/code") == {"difficulty_filter": "not run"}


def test_measured_sets_and_mixes_are_read_filtered_and_the_record_says_which(repo):
    write_json(MANIFEST, Path("data/filtered/manifest.json"))
    read = resolve_datasets(DATASETS)
    assert read == [Path("data/filtered/rl/instruction_following"), Path("data/filtered/rl/mopd"),
                    Path("data/sets/rl/code"), Path("data/packed")]
    Path("data/packed").mkdir()
    record = write_record(repo / "ckpt", stage="if_rl", runner="grpo", init=repo / "base", datasets=read,
                          validation={}, train={})
    assert record == read_record(repo / "ckpt")
    assert record["difficulty_filter"] == {
        "data/filtered/rl/instruction_following": {"difficulty_filter": "applied", "bounds": [0.0, 1.0],
                                                   "full_set": "data/sets/rl/instruction_following",
                                                   "rows": 3, "measured": 2, "kept": 1},
        "data/filtered/rl/mopd": {"difficulty_filter": "applied", "bounds": [0.0, 1.0],
                                  "full_set": "data/sets/rl/mopd", "rows": 3, "kept": 1, "unmeasured_domains": []},
        "data/sets/rl/code": {"difficulty_filter": "not measured"},
        "data/packed": {"difficulty_filter": "not measured"}}
    assert set(record["datasets"]) == {str(d) for d in read}


def test_a_damaged_manifest_names_the_file(repo):
    Path("data/filtered/manifest.json").write_text('["rl/code"]')
    with pytest.raises(ValueError, match=r"data/filtered/manifest.json: not a difficulty manifest"):
        resolve_datasets(DATASETS)


def test_a_set_the_filter_emptied_is_an_error_naming_it(repo):
    write_json({**MANIFEST, "sets": {"rl/code": {"rows": 3, "measured": 3, "kept": 0}}},
               Path("data/filtered/manifest.json"))
    with pytest.raises(ValueError, match=r"data/sets/rl/code: the difficulty filter kept no row of rl/code"):
        resolve_datasets(DATASETS)

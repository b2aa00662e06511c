import json

import polars as pl
import pyarrow as pa
import pytest
import yaml
from datasets import load_dataset

from corpora.registry import SourceSpec
from corpora.schema import SFT_SCHEMA
from curation.release import check_split_names, export_release, push_release
from tests.handed import handed_case
from tests.rows import rl_table


def _tool_rows():
    calls = [{"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo", "days": 3})}},
             {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]
    rows = [
        {"uuid": "a", "domain": "conversational_agent", "source": "tools_src", "source_version": "1",
         "license": "MIT", "tools": json.dumps([{"type": "function", "function": {"name": "get_weather"}}]),
         "messages": [{"role": "user", "content": "weather?"},
                      {"role": "assistant", "content": "", "tool_calls": calls, "reasoning_content": "think"},
                      {"role": "tool", "content": "{\"t\": 3}", "tool_call_id": "c1"},
                      {"role": "assistant", "content": "3 degrees"}]},
        {"uuid": "b", "domain": "chat", "source": "chat_src", "source_version": "1", "license": "MIT",
         "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"uuid": "c", "domain": "chat", "source": "nc_src", "source_version": "1", "license": "CC-BY-NC-3.0",
         "messages": [{"role": "user", "content": "hey"}, {"role": "assistant", "content": "yo"}]},
    ]
    return pl.from_arrow(pa.Table.from_pylist(rows, schema=SFT_SCHEMA))


SPECS = [SourceSpec(name=n, kind="local", path="x", format="jsonl", adapter="a", output="sft", domain="chat",
                    role="train", license=lic) for n, lic in
         [("tools_src", "MIT"), ("chat_src", "MIT"), ("nc_src", "CC-BY-NC-3.0")]]


def _export(tmp_path, allow=()):
    df = _tool_rows()
    sets = {d: {"train": g} for (d,), g in df.group_by("domain", maintain_order=True)}
    return df, export_release(sets, "sft", tmp_path / "release", SPECS, {}, list(allow), rows_per_shard=1)


def test_export_round_trips_through_load_dataset_with_nested_fields(tmp_path):
    df, (refused, stats) = _export(tmp_path)
    assert stats == {"configs": {"chat": {"train": 1}, "conversational_agent": {"train": 1}}}
    assert refused["uuid"].to_list() == ["c"]
    assert refused["reason"][0] == "license_refused: CC-BY-NC-3.0 is not cleared for release"
    for config in ("chat", "conversational_agent"):
        loaded = load_dataset(str(tmp_path / "release"), config, split="train")
        want = df.filter((pl.col("domain") == config) & (pl.col("uuid") != "c")).to_dicts()
        assert loaded.to_list() == want
    msg = load_dataset(str(tmp_path / "release"), "conversational_agent", split="train")[0]["messages"][1]
    # tool-call arguments stay exact JSON strings: no null-padded keys from other rows
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo", "days": 3}
    assert json.loads(msg["tool_calls"][1]["function"]["arguments"]) == {}


def test_card_lists_configs_licenses_sizes_and_provenance(tmp_path):
    _export(tmp_path, allow=["CC-BY-NC-3.0"])
    text = (tmp_path / "release" / "README.md").read_text()
    header = yaml.safe_load(text.split("---")[1])
    assert {c["config_name"] for c in header["configs"]} == {"chat", "conversational_agent"}
    assert header["configs"][0]["data_files"] == [{"split": "train", "path": "chat/train-*.parquet"}]
    assert header["license_details"] == "CC-BY-NC-3.0, MIT"
    chat_info = next(i for i in header["dataset_info"] if i["config_name"] == "chat")
    assert chat_info["splits"][0]["name"] == "train" and chat_info["splits"][0]["num_examples"] == 2
    assert chat_info["splits"][0]["num_bytes"] > 0 and chat_info["download_size"] > 0
    assert "| nc_src |" in text and "| tools_src |" in text
    # rows_per_shard=1: the two chat rows are two shards
    assert sorted(p.name for p in (tmp_path / "release" / "chat").iterdir()) == [
        "train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]


def test_export02_split_names_validated_before_anything_is_written(tmp_path):
    case = handed_case("EXPORT-02")
    names = case["input"]["split_names"]
    accepted = [n for n in names if not _raises(n)]
    assert accepted == case["expected"]["accepted"]
    df = rl_table(["q"])
    sets = {"math": {n: df for n in names}}
    with pytest.raises(ValueError, match="invalid split names"):
        export_release(sets, "rl", tmp_path / "rel", [], {}, [], 10)
    assert not (tmp_path / "rel").exists()


def _raises(name):
    try:
        check_split_names([name])
    except ValueError:
        return True
    return False


class RecordingApi:
    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))

    def upload_folder(self, **kw):
        self.calls.append(("upload_folder", kw["repo_id"], kw))


def test_push_uploads_the_release_folder_with_token(tmp_path):
    _export(tmp_path)
    api = RecordingApi()
    files = push_release(tmp_path / "release", "me/cascade-sft", token="hf_x", api=api)
    assert "README.md" in files and "chat/train-00000-of-00001.parquet" in files
    assert [c[0] for c in api.calls] == ["create_repo", "upload_folder"]
    assert api.calls[1][2]["folder_path"] == str(tmp_path / "release")
    assert api.calls[1][2]["repo_type"] == "dataset"


def test_push_refuses_bad_split_file_before_any_call(tmp_path):
    bad = tmp_path / "rel" / "math"
    bad.mkdir(parents=True)
    (bad / "train-v2-00000-of-00001.parquet").write_bytes(b"")
    api = RecordingApi()
    with pytest.raises(ValueError, match="train-v2"):
        push_release(tmp_path / "rel", "me/x", token="t", api=api)
    assert api.calls == []


def test_mixed_license_rows_export_only_when_every_part_is_cleared():
    from curation.release import license_filter

    df = rl_table(["a", "b", "c"], license=["mixed:Apache-2.0,MIT", "mixed:MIT,none", "MIT"])
    ok, refused = license_filter(df, [])
    assert ok["uuid"].to_list() == ["b0", "b2"] and refused["uuid"].to_list() == ["b1"]
    ok, _ = license_filter(df, ["none"])
    assert len(ok) == 3

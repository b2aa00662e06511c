"""The Hub adapters through the real ``datasets.load_dataset`` path of ``corpora.readers.read_hf``.

Small local fixtures with the row layout of ``nvidia/Nemotron-Cascade-2-SFT-Data``
and ``nvidia/Nemotron-Cascade-2-RL-data`` are written as parquet (Arrow pads
every struct with the union of keys, nulls elsewhere) and as JSON lines, and
registered as ``kind: hf`` sources the way ``corpora/sources-hub.yaml`` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from common.io import Rejects
from corpora.registry import SourceSpec, load_registry
from corpora.schema import SCHEMAS
from curation.ingest import ingest_source

WEATHER_ARGS = '{"city": "Paris", "units": "celsius"}'
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "units": {"type": "string",
                                                                                "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time.",
                                      "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                                     "required": ["tz"]}}},
]

SFT_ROWS: list[dict[str, Any]] = [
    {"uuid": "sft-1", "license": "cc-by-4.0", "generator": "DeepSeek-V3.2", "category": "math",
     "used_in": ["cascade2"], "tools": [],
     "messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is 2+3?"},
                  {"role": "assistant", "content": "5", "reasoning_content": "2 plus 3 is 5.\n"}]},
    {"uuid": "sft-2", "license": "odc-by", "generator": "Qwen3-235B", "category": "conversational_agent",
     "used_in": ["cascade2"], "tools": TOOLS,
     "messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "reasoning_content": "Call the tool.",
                   "tool_calls": [{"id": "call_a", "type": "function",
                                   "function": {"name": "get_weather", "arguments": WEATHER_ARGS}}]},
                  {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_a"},
                  {"role": "assistant", "content": "It is 21 C in Paris."}]},
    {"uuid": "sft-bad", "license": "odc-by", "generator": "x", "category": "chat", "used_in": [], "tools": [],
     "messages": [{"role": "narrator", "content": "Once"}, {"role": "assistant", "content": "upon"}]},
]

RL_ROWS: list[dict[str, Any]] = [
    {"uuid": "rl-if", "id": 23621, "dataset": "IF-RL", "prompt": "Write 300+ words, no commas.",
     "responses_create_params": {"input": [{"role": "user", "content": "Write 300+ words, no commas."}]},
     "agent_ref": {"type": "responses_api_agents", "name": "instruction_following_simple_agent"},
     "instruction_id_list": ["length_constraints:number_words", "punctuation:no_comma"],
     "kwargs": [{"num_words": 300, "relation": "at least"}, {}],
     "pass_rate": 0.625, "pass_rate_total": 8, "pass_rate_passed": 5},
    {"uuid": "rl-mcqa", "dataset": "multi-domain-RL",
     "responses_create_params": {"input": [{"role": "system", "content": "Think step by step."},
                                           {"role": "user", "content": "Pick one. A. x B. y C. z"}],
                                 "temperature": 1.0},
     "agent_ref": {"type": "responses_api_agents", "name": "mcqa_simple_agent"},
     "expected_answer": "C", "options": ["x", "y", "z"], "pass_rate": 0.5, "pass_rate_total": 16,
     "pass_rate_passed": 8},
    {"uuid": "rl-tools", "dataset": "multi-domain-RL", "environment_name": "workbench",
     "responses_create_params": {
         "input": [{"role": "user", "content": "Weather in Paris?"}],
         "tools": [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"], "strict": False} for t in TOOLS]},
     "agent_ref": {"type": "responses_api_agents", "name": "workplace_assistant_simple_agent"},
     "ground_truth": [{"name": "get_weather", "arguments": WEATHER_ARGS}]},
]


def _arrow(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as one Arrow table whose schema is inferred from ALL rows (``from_pylist`` reads the first only)."""
    return pa.Table.from_struct_array(pa.array(rows))


def _write(rows: list[dict[str, Any]], directory: Path, fmt: str) -> None:
    directory.mkdir(parents=True)
    if fmt == "parquet":
        pq.write_table(_arrow(rows), directory / "train-00000-of-00001.parquet")
    else:
        with open(directory / "train.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)


def _spec(name: str, path: Path, adapter: str, output: str, options: dict[str, Any]) -> SourceSpec:
    return SourceSpec(name=name, kind="hf", format="hf", path=str(path), split="train", adapter=adapter,
                      output=output, domain="chat" if output == "sft" else "math", role="train", license="odc-by",
                      options=options)


LAYOUTS = {  # how a hub-layout fixture is registered: data_files pattern + builder, or a bare directory
    "parquet": lambda d: (d / "*.parquet", {"data_format": "parquet"}),
    "json": lambda d: (d / "*.jsonl", {"data_format": "json"}),
    "parquet-dir": lambda d: (d, {}),
}


def _ingest(tmp_path: Path, rows, adapter: str, output: str, layout: str):
    directory = tmp_path / f"{adapter}-{layout}"
    _write(rows, directory, "json" if layout == "json" else "parquet")
    path, options = LAYOUTS[layout](directory)
    rejects = Rejects("ingest")
    result = ingest_source(_spec(f"hub_{output}", path, adapter, output, options), tmp_path, rejects)
    pa.Table.from_pylist(result.rows, schema=SCHEMAS[output])
    return result, rejects


def test_arrow_pads_the_fixture_like_the_hub():
    """The fixture really exercises null padding: Arrow adds every key to every struct."""
    table = _arrow(RL_ROWS)
    assert table.column("kwargs").to_pylist()[0] == [{"num_words": 300, "relation": "at least"},
                                                     {"num_words": None, "relation": None}]
    msgs = _arrow(SFT_ROWS).column("messages").to_pylist()[0]
    assert msgs[0]["tool_calls"] is None and msgs[0]["reasoning_content"] is None
    assert table.column("expected_answer").to_pylist() == [None, "C", None]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_nemotron_sft_rows(tmp_path, layout):
    result, rejects = _ingest(tmp_path, SFT_ROWS, "nemotron_sft", "sft", layout)
    assert (result.records_in, len(result.rows)) == (3, 2)
    assert [r["reason"] for r in rejects.rows] == ["invalid record: messages[0].role: unknown role 'narrator'"]
    plain, tool = result.rows
    assert [(m["role"], m["content"], m["reasoning_content"]) for m in plain["messages"]] == [
        ("system", "You are a helpful assistant.", None), ("user", "What is 2+3?", None),
        ("assistant", "5", "2 plus 3 is 5.\n")]
    assert (plain["domain"], plain["license"], plain["generator"]) == ("math", "odc-by", "DeepSeek-V3.2")
    assert json.loads(plain["metadata"]) == {"upstream_uuid": "sft-1", "category": "math", "used_in": ["cascade2"],
                                             "row_license": "cc-by-4.0"}  # the registry's (card's) license governs
    assert json.loads(plain["tools"]) == []
    call = tool["messages"][1]
    assert (call["content"], call["reasoning_content"]) == ("", "Call the tool.")
    assert call["tool_calls"] == [{"id": "call_a", "type": "function",
                                   "function": {"name": "get_weather", "arguments": WEATHER_ARGS}}]
    assert tool["messages"][2] == {"role": "tool", "content": '{"temp": 21}', "reasoning_content": None,
                                   "tool_calls": None, "tool_call_id": "call_a"}
    assert json.loads(tool["tools"]) == TOOLS  # padded keys (city/tz in both schemas) removed again
    assert (tool["domain"], tool["license"]) == ("conversational_agent", "odc-by")


def test_nemotron_sft_object_arguments_and_missing_ids(tmp_path):
    rows = [{"uuid": "x", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1_0", "name": "get_weather"},
        {"role": "assistant", "content": "Sunny."}]}]
    result, rejects = _ingest(tmp_path, rows, "nemotron_sft", "sft", "json")
    assert len(rejects) == 0
    row = result.rows[0]
    assert row["messages"][0]["content"] == "Weather?"
    tc = row["messages"][1]["tool_calls"][0]
    assert tc["id"] == "call_1_0" and json.loads(tc["function"]["arguments"]) == {"city": "Paris"}
    meta = json.loads(row["metadata"])
    assert meta["generated_tool_call_ids"] == 1 and meta["message_extras"] == {"2": {"name": "get_weather"}}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_nemo_gym_rl_rows(tmp_path, layout):
    result, rejects = _ingest(tmp_path, RL_ROWS, "nemo_gym_rl", "rl", layout)
    assert (result.records_in, len(result.rows), len(rejects)) == (3, 3, 0)
    if_row, mcqa, tools = result.rows
    assert if_row["agent_ref"] == "instruction_following"
    assert if_row["domain"] == "instruction_following"
    assert json.loads(if_row["kwargs"]) == [{"num_words": 300, "relation": "at least"}, {}]
    assert if_row["instruction_id_list"] == RL_ROWS[0]["instruction_id_list"]
    assert (if_row["pass_rate"], if_row["pass_rate_total"], if_row["pass_rate_passed"]) == (0.625, 8, 5)
    assert if_row["ground_truth"] == "null"
    meta = json.loads(if_row["metadata"])
    assert (meta["upstream_uuid"], meta["id"], meta["dataset"]) == ("rl-if", 23621, "IF-RL")
    assert "prompt" not in meta  # the same text as the input turn
    assert meta["nemo_gym_agent_ref"] == {"type": "responses_api_agents", "name": "instruction_following_simple_agent"}

    assert (mcqa["agent_ref"], mcqa["domain"]) == ("mcqa", "stem_mcqa")
    assert json.loads(mcqa["ground_truth"]) == {"answer": "C", "options": {"A": "x", "B": "y", "C": "z"}}
    assert [m["role"] for m in mcqa["responses_create_params"]["input"]] == ["system", "user"]
    assert json.loads(mcqa["metadata"])["sampling"] == {"temperature": 1.0}

    assert (tools["agent_ref"], tools["domain"]) == ("workplace", "tool_calling")
    assert json.loads(tools["ground_truth"]) == {"calls": [{"name": "get_weather", "arguments": json.loads(WEATHER_ARGS)}]}
    got = json.loads(tools["responses_create_params"]["tools"])
    assert got == [{"type": "function", "function": {**t["function"], "strict": False}} for t in TOOLS]


def test_nemo_gym_agent_ref_as_string_and_bad_kwargs(tmp_path):
    rows = [{"uuid": "a", "responses_create_params": {"input": "Solve x+1=2."}, "agent_ref": "math_with_judge_simple_agent",
             "expected_answer": "1"},
            {"uuid": "b", "responses_create_params": {"input": [{"role": "user", "content": "Hi"}]},
             "agent_ref": {"type": "t", "name": "instruction_following_simple_agent"},
             "instruction_id_list": ["a:b", "c:d"], "kwargs": [{}]}]
    result, rejects = _ingest(tmp_path, rows, "nemo_gym_rl", "rl", "json")
    assert [(r["agent_ref"], r["domain"]) for r in result.rows] == [("math", "math")]
    assert result.rows[0]["responses_create_params"]["input"][0]["content"] == "Solve x+1=2."
    assert [r["reason"] for r in rejects.rows] == [
        "invalid record: kwargs: expected a list of 2 objects (one per instruction)"]


def test_hub_registry_is_valid():
    everything = load_registry(Path(__file__).resolve().parents[1] / "corpora" / "sources-hub.yaml")
    default = {s.name for s in load_registry() if s.role == "benchmark"}
    hub_benchmarks = {"aime24", "aime25", "gpqa_diamond", "livecodebench"}  # `cascade eval`'s Hub benchmarks
    assert {s.name for s in everything if s.role == "benchmark"} == default | hub_benchmarks  # + sources.yaml's
    specs = [s for s in everything if s.role == "train"]
    assert {s.adapter for s in specs} == {"nemotron_sft", "nemo_gym_rl"}
    assert {s.hf_config for s in specs if s.output == "rl"} == {"IF-RL", "multi-domain-RL", "MOPD", "SWE-RL"}
    assert all(s.kind == "hf" and s.format == "hf" for s in specs)


def test_a_registry_includes_another_registrys_sources_by_role_and_its_sections(tmp_path):
    from corpora.registry import load_models

    def src(name, role):
        return {"name": name, "kind": "local", "path": "x", "format": "jsonl", "adapter": "sharegpt",
                "output": "sft" if role == "train" else "rl", "domain": "chat" if role == "train" else "math",
                "role": role, "license": "MIT"}

    model = {"name": "m", "kind": "pypi", "package": "p", "version": "1", "path": "m.gguf", "format": "gguf",
             "license": "MIT"}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(
        {"sources": [src("base_train", "train"), src("base_bench", "benchmark")], "models": [model]}))
    (tmp_path / "sub").mkdir()
    top = tmp_path / "sub" / "top.yaml"
    top.write_text(yaml.safe_dump({"include": [{"path": "../base.yaml", "roles": ["benchmark"]}],
                                   "sources": [src("mine", "train")]}))
    assert [s.name for s in load_registry(top)] == ["base_bench", "mine"]
    assert [m.name for m in load_models(top)] == ["m"]
    top.write_text(yaml.safe_dump({"include": ["../base.yaml"], "sources": []}))
    with pytest.raises(ValueError, match="include: each entry is"):
        load_registry(top)

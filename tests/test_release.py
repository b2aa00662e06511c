import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
import yaml
from datasets import load_dataset

from corpora.registry import SourceSpec
from corpora.schema import SCHEMAS, SFT_SCHEMA
from curation import release
from curation.release import CARD_PATH, check_split_names, export_release, push_release, shard_count
from curation.release_loader import drop_absent_keys, load_release
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


# ------------------------------------------------------------------ releases render like their sources
#: A chat template that tests key presence the way real ones do: with Arrow's padding a plain
#: turn gains ``keys=role,content,reasoning_content,...`` and ``for call in None`` fails.
KEY_TEMPLATE = """{%- if tools is defined and tools %}<tools>{{ tools | tojson }}</tools>
{% endif %}
{%- for message in messages %}
<{{ message['role'] }} keys={{ message | list | join(',') }}>
{%- if 'reasoning_content' in message %}<think>{{ message['reasoning_content'] }}</think>{% endif %}
{{- message['content'] }}
{%- if 'tool_calls' in message %}{% for call in message['tool_calls'] %}
<call {{ call['id'] }} {{ call['type'] }}>{{ call['function']['name'] }}{{ call['function']['arguments'] }}</call>
{%- endfor %}{% endif %}
{%- if 'tool_call_id' in message %} (answers {{ message['tool_call_id'] }}){% endif %}
{%- endfor %}
"""
#: Tool-call arguments with nested objects, unicode, numbers at the edges and nulls inside.
ARGS = {"city": "Zürich 東京 🚀", "days": 3, "range": {"lo": -1.5e-300, "hi": 2**64, "unit": None},
        "flags": [True, False, None], "empty": {}, "ratio": 0.1}
ARGS_TEXT = '{"b": 1, "a": {"x": [1, 2.50, null], "s": "\\u00e9"}}'  # a JSON string: kept byte for byte
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter für eine Stadt ☀",
          "parameters": {"type": "object", "properties": {
              "city": {"type": "string"}, "range": {"type": "object", "properties": {"lo": {"type": "number"}}}},
              "required": ["city"]}}}]
#: Hub-format records (``nvidia/Nemotron-Cascade-2-*-Data``) read by the real adapters.
NEMOTRON_SFT = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"},
                  {"role": "assistant", "content": None, "reasoning_content": "Call the tool.",
                   "tool_calls": [{"id": "c1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ARGS}},
                                  {"id": "c2", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ARGS_TEXT}}]},
                  {"role": "tool", "content": "{\"t\": 3}", "tool_call_id": "c1"},
                  {"role": "tool", "content": "{\"t\": 4}", "tool_call_id": "c2"},
                  {"role": "assistant", "content": "3 °C", "reasoning_content": ""}],
     "tools": TOOLS, "generator": "teacher"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
]
SHAREGPT = {"id": "g1", "conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}
NEMO_GYM_RL = [
    {"responses_create_params": {"input": [{"role": "user", "content": "Weather in Zürich?"}], "tools": TOOLS},
     "agent_ref": {"type": "responses_api_agents", "name": "workplace_assistant_simple_agent"},
     "ground_truth": [{"name": "get_weather", "arguments": ARGS}]},
    {"responses_create_params": {"input": [{"role": "system", "content": "Solve."},
                                           {"role": "user", "content": "1+1?"}]},
     "agent_ref": "math_with_judge_simple_agent", "expected_answer": "2"},
]


def _source_rows() -> dict[str, list[dict]]:
    """``{kind: rows}``: real adapter output completed by ingest, one row per record and config,
    messages holding the keys the adapter set (the values as ingest stores them)."""
    from corpora.adapters import get_adapter
    from corpora.schema import SFT_DOMAINS, rl_domains
    from curation.ingest import finalize_row

    def rows(kind, adapter, records, domains):
        out = []
        for domain in domains:
            spec = SourceSpec(name=adapter, kind="local", path="x", format="jsonl", adapter=adapter, output=kind,
                              domain=domain, role="train", license="MIT")
            for k, raw in enumerate(records):
                partial = get_adapter(adapter)({**raw, "domain": domain}, spec, Path("."))
                row = finalize_row(partial, spec, f"{domain}-{k}", 0)
                msgs = partial["messages"] if kind == "sft" else partial["responses_create_params"]["input"]
                exact = [{k: m[k] for k in src} for m, src in zip(_messages(row, kind), msgs, strict=True)]
                if kind == "sft":
                    row["messages"] = exact
                else:
                    row["responses_create_params"]["input"] = exact
                out.append(row)
        return out

    return {"sft": rows("sft", "nemotron_sft", NEMOTRON_SFT, SFT_DOMAINS)
            + rows("sft", "sharegpt", [SHAREGPT], SFT_DOMAINS),
            "rl": rows("rl", "nemo_gym_rl", NEMO_GYM_RL, rl_domains())}


def _messages(row, kind):
    return row["messages"] if kind == "sft" else row["responses_create_params"]["input"]


def _render(row, kind, template):
    from transformers.utils.chat_template_utils import render_jinja_template

    tools = json.loads(row["tools"] if kind == "sft" else row["responses_create_params"]["tools"]) or None
    return render_jinja_template([_messages(row, kind)], tools=tools, chat_template=template)[0][0]


def _try_render(row, kind, template):
    try:
        return _render(row, kind, template)
    except TypeError as exc:  # 'NoneType' object is not iterable
        return f"failed: {exc}"


@pytest.fixture(scope="module")
def templates(qwen3_tokenizer_dir):
    qwen3 = json.loads((qwen3_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]
    return {"keys": KEY_TEMPLATE, "qwen3": qwen3}


def _release(rows, kind, out, rows_per_shard=2):
    table = pl.from_arrow(pa.Table.from_pylist(rows, schema=SCHEMAS[kind]))
    sets = {c: {"train": g} for (c,), g in table.group_by("domain", maintain_order=True)}
    export_release(sets, kind, out, [], {}, [], rows_per_shard)
    return sorted(sets)


def _assert_renders_like_sources(release_dir, kind, sources, templates):
    """``sources[config, split]``: source rows. Each row of the release equals its source, the
    messages' key sets included, and renders to the same text with every template."""
    for (config, split), rows in sources.items():
        by_uuid = {r["uuid"]: r for r in rows}
        loaded = load_release(release_dir, config, split)
        assert sorted(loaded["uuid"]) == sorted(by_uuid)
        for row in loaded:
            src = by_uuid[row["uuid"]]
            assert _messages(row, kind) == _messages(src, kind)
            for template in templates.values():
                assert _render(row, kind, template) == _render(src, kind, template)


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_every_config_renders_like_its_source_rows(tmp_path, kind, templates):
    sources = _source_rows()[kind]
    configs = _release(sources, kind, tmp_path / kind)
    assert configs == sorted({r["domain"] for r in sources})  # every SFT domain / RL domain
    by_config = {(c, "train"): [r for r in sources if r["domain"] == c] for c in configs}
    _assert_renders_like_sources(tmp_path / kind, kind, by_config, templates)
    # plain load_dataset pads each message with null keys: the key template renders otherwise or fails
    raw = load_dataset(str(tmp_path / kind), configs[0], split="train")
    src = {r["uuid"]: r for r in sources}
    assert all(_try_render(r, kind, KEY_TEMPLATE) != _render(src[r["uuid"]], kind, KEY_TEMPLATE) for r in raw)


def test_tool_schemas_and_arguments_round_trip_exactly(tmp_path):
    sources = _source_rows()["sft"]
    _release(sources, "sft", tmp_path / "sft")
    row = load_release(tmp_path / "sft", "conversational_agent", "train")[0]
    calls = row["messages"][2]["tool_calls"]
    assert json.loads(calls[0]["function"]["arguments"]) == ARGS
    assert json.loads(calls[0]["function"]["arguments"])["range"]["hi"] == 2**64  # an int, not a float
    assert calls[1]["function"]["arguments"] == ARGS_TEXT
    assert json.loads(row["tools"]) == TOOLS
    assert row["messages"][2]["content"] == "" and row["messages"][-1] == {
        "role": "assistant", "content": "3 °C", "reasoning_content": ""}  # an empty reasoning stays present
    _release(_source_rows()["rl"], "rl", tmp_path / "rl")
    rl = load_release(tmp_path / "rl", "tool_calling", "train")[0]
    assert json.loads(rl["responses_create_params"]["tools"]) == TOOLS
    assert json.loads(rl["ground_truth"]) == {"calls": [{"name": "get_weather", "arguments": ARGS}]}


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_the_cards_loading_snippet_restores_the_source_rows_with_datasets_alone(tmp_path, kind):
    sources = _source_rows()[kind]
    configs = _release(sources, kind, tmp_path / kind)
    card = (tmp_path / kind / "README.md").read_text()
    snippet = card.split("## Loading")[1].split("```python\n")[1].split("```")[0]
    assert "curation" not in snippet and "cascade" not in snippet
    namespace = {}
    exec(snippet.replace(CARD_PATH, str(tmp_path / kind)), namespace)  # noqa: S102
    first = next(r for r in sources if r["domain"] == configs[0] and r["uuid"] == namespace["row"]["uuid"])
    assert namespace["messages"] == _messages(first, kind)
    tools = json.loads(first["tools"] if kind == "sft" else first["responses_create_params"]["tools"]) or None
    assert namespace["tools"] == tools


def test_the_card_snippet_drops_exactly_the_schemas_optional_message_keys():
    from corpora.schema import Message

    optional = [k for k, f in Message.model_fields.items() if not f.is_required()]
    padded = {"messages": [[{"role": "user", "content": "", **dict.fromkeys(optional)}]]}
    assert drop_absent_keys(padded) == {"messages": [[{"role": "user", "content": ""}]]}


SETS = Path(__file__).resolve().parents[1] / "data" / "sets"


def _set_samples(kind, per_split=25):
    """``{config: {split: rows}}`` of ``data/sets``: the first rows of each, and every row with tool calls."""
    files = ([(d.name, f) for d in sorted((SETS / "rl").iterdir()) for f in sorted(d.glob("*.parquet"))]
             if kind == "rl" else [(None, f) for f in sorted((SETS / "sft").glob("*.parquet"))])
    msgs = pl.col("messages") if kind == "sft" else pl.col("responses_create_params").struct.field("input")
    with_calls = msgs.list.eval(pl.element().struct.field("tool_calls").is_not_null()).list.any()
    sets = {}
    for config, f in files:
        df = pl.read_parquet(f)
        for (domain,), part in df.group_by("domain" if config is None else pl.lit(config)):
            sample = pl.concat([part.head(per_split), part.filter(with_calls).head(per_split)]).unique(
                "uuid", keep="first", maintain_order=True)
            sets.setdefault(domain, {})[f.stem] = sample.with_columns(license=pl.lit("MIT"))  # all exported
    return sets


@pytest.mark.skipif(not (SETS / "sft").is_dir() or not (SETS / "rl").is_dir(),
                    reason="data/sets not built (`dvc repro build`)")
@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_real_set_rows_render_like_their_sources_in_every_config(tmp_path, kind, templates):
    sets = _set_samples(kind)
    export_release(sets, kind, tmp_path / kind, [], {}, [], 10)
    sources = {}
    for config, splits in sets.items():
        for split, df in splits.items():
            rows = sources[config, split] = df.to_dicts()
            for row in rows:
                # the canonical convention: role and content are always strings, a null optional key is absent
                assert all(isinstance(m["role"], str) and isinstance(m["content"], str) for m in _messages(row, kind))
                exact = [{k: v for k, v in m.items() if v is not None} for m in _messages(row, kind)]
                if kind == "sft":
                    row["messages"] = exact
                else:
                    row["responses_create_params"]["input"] = exact
    rows = [r for part in sources.values() for r in part]  # the sample holds tool calls (SFT), tool schemas (RL)
    assert any("tool_calls" in m for r in rows for m in _messages(r, kind)) if kind == "sft" else any(
        r["responses_create_params"]["tools"] != "[]" for r in rows)
    _assert_renders_like_sources(tmp_path / kind, kind, sources, templates)


# ------------------------------------------------------------------ export never loses a row
def _shard_sets():
    return {"math": {"train": rl_table([f"q{i}" for i in range(7)]), "validation": rl_table(["v"], prefix="v")},
            "code": {"train": rl_table(["c0", "c1", "c2"], prefix="c")}}


@pytest.mark.parametrize("rows_per_shard", [1, 2, 3, 6, 7, 8, 10**9])
def test_every_shard_setting_writes_every_row_and_the_card_counts_the_files(tmp_path, rows_per_shard):
    sets, out = _shard_sets(), tmp_path / "rel"
    _, stats = export_release(sets, "rl", out, [], {}, [], rows_per_shard)
    card = (out / "README.md").read_text()
    info = {(i["config_name"], s["name"]): s["num_examples"]
            for i in yaml.safe_load(card.split("---")[1])["dataset_info"] for s in i["splits"]}
    table = {(c, sp): int(n) for c, sp, n in
             (line.strip("|").replace(" ", "").split("|") for line in card.splitlines()
              if line.startswith("| ") and line.count("|") == 4 and not line.startswith("| config"))}
    for config, splits in sets.items():
        for split, df in splits.items():
            files = sorted((out / config).glob(f"{split}-*.parquet"))
            n = -(-len(df) // rows_per_shard)
            assert [f.name for f in files] == [f"{split}-{i:05d}-of-{n:05d}.parquet" for i in range(n)]
            back = pl.concat([pl.read_parquet(f) for f in files])
            assert back["uuid"].to_list() == df["uuid"].to_list()
            assert info[config, split] == table[config, split] == stats["configs"][config][split] == len(back)


@pytest.mark.parametrize("bad", [0, -1, 2.5, 1.0, "12", True, None])
def test_a_bad_rows_per_shard_names_the_key_and_writes_nothing(tmp_path, bad):
    out = tmp_path / "rel"
    out.mkdir()
    (out / "README.md").write_text("the earlier release")
    with pytest.raises(ValueError) as exc:
        export_release(_shard_sets(), "rl", out, [], {}, [], bad)
    assert str(exc.value) == f"params.yaml export.rows_per_shard: expected a whole number >= 1, got {bad!r}"
    assert [p.name for p in tmp_path.iterdir()] == ["rel"] and [p.name for p in out.iterdir()] == ["README.md"]
    assert (out / "README.md").read_text() == "the earlier release"


def test_more_shards_than_five_digit_names_hold_fail_before_writing(tmp_path, monkeypatch):
    assert shard_count(99_999, 1, "rl/math/train") == 99_999
    with pytest.raises(ValueError, match=r"export.rows_per_shard: 1 gives 100000 shards .* set at least 2$"):
        shard_count(100_000, 1, "rl/math/train")
    monkeypatch.setattr(release, "MAX_SHARDS", 3)
    with pytest.raises(ValueError) as exc:
        export_release(_shard_sets(), "rl", tmp_path / "rel", [], {}, [], 2)
    assert str(exc.value) == ("params.yaml export.rows_per_shard: 2 gives 4 shards for rl/math/train (7 rows), "
                              "file names hold at most 3; set at least 3")
    assert not (tmp_path / "rel").exists()


def _export_repo(tmp_path, monkeypatch, sft: pl.DataFrame, rows_per_shard: int):
    """A data/ with ``sft`` as the SFT train set and _shard_sets' rl/math/train; the params to export it."""
    from curation.params import check_params

    (tmp_path / "data/sets/sft").mkdir(parents=True)
    (tmp_path / "data/sets/rl/math").mkdir(parents=True)
    (tmp_path / "data/sources").mkdir()
    (tmp_path / "data/sources/manifest.json").write_text("{}")
    sft.write_parquet(tmp_path / "data/sets/sft/train.parquet")
    _shard_sets()["math"]["train"].write_parquet(tmp_path / "data/sets/rl/math/train.parquet")
    repo = Path(release.__file__).parents[1]
    monkeypatch.chdir(tmp_path)
    return check_params({**yaml.safe_load((repo / "params.yaml").read_text()),
                         "sources": {"registry": str(repo / "corpora/sources.yaml")}, "executor": {"kind": "local"},
                         "export": {"rows_per_shard": rows_per_shard, "allow_licenses": []}})


def test_the_export_step_checks_both_kinds_before_writing_either(tmp_path, monkeypatch):
    from curation.pipeline import step_export
    from tests.rows import sft_table

    params = _export_repo(tmp_path, monkeypatch, sft_table(["a", "b"], domain=["chat", "chat"]), 2)
    monkeypatch.setattr(release, "MAX_SHARDS", 3)  # rl/math/train: 7 rows in 4 shards; sft/chat/train fits in 1
    with pytest.raises(ValueError, match=r"4 shards for rl/math/train"):
        step_export(params)
    assert not (tmp_path / "release").exists()
    monkeypatch.setattr(release, "MAX_SHARDS", 4)
    metrics = step_export(params)
    assert metrics["releases"] == {"sft": {"configs": {"chat": {"train": 2}}},
                                   "rl": {"configs": {"math": {"train": 7}}}}


def test_the_export_step_shards_each_domain_of_an_interleaved_file_in_row_order(tmp_path, monkeypatch):
    """SFT configs are the domains of one file, each read by a scan filtered on ``domain`` in batches:
    every domain's shards hold its rows in file order, across batch boundaries, and the refused rows go
    to the rejects config by config."""
    from curation import pipeline
    from tests.rows import sft_table

    domains = ["chat", "math", "math", "chat", "code", "chat", "math", "chat", "chat"]
    sft = sft_table([f"q{i}" for i in range(9)], domain=domains, license=["MIT"] * 5 + ["CC-BY-NC-4.0"] + ["MIT"] * 3)
    params = _export_repo(tmp_path, monkeypatch, sft, 2)
    monkeypatch.setattr(pipeline, "MAP_BATCH_ROWS", 2)
    metrics = pipeline.step_export(params)
    assert metrics["releases"]["sft"] == {"configs": {"chat": {"train": 4}, "code": {"train": 1},
                                                      "math": {"train": 3}}}
    for domain in ("chat", "code", "math"):
        files = sorted((tmp_path / "release/sft" / domain).glob("train-*.parquet"))
        n = -(-sum(1 for i, d in enumerate(domains) if d == domain and i != 5) // 2)
        assert [f.name for f in files] == [f"train-{i:05d}-of-{n:05d}.parquet" for i in range(n)]
        back = pl.concat([pl.read_parquet(f) for f in files])
        assert back["uuid"].to_list() == [u for u, d, lic in sft.select("uuid", "domain", "license").iter_rows()
                                          if d == domain and lic == "MIT"]
    rejects = pl.read_parquet(tmp_path / "rejects/export.parquet")
    assert rejects["record_id"].to_list() == [sft["uuid"][5]]
    assert metrics["rejected_by_reason"] == {"license_refused": 1}


def test_a_split_that_differs_from_its_count_raises_and_writes_nothing(tmp_path):
    sets, out = _shard_sets(), tmp_path / "rel"
    counted = {("math", "train"): 7, ("math", "validation"): 1, ("code", "train"): 3}
    export_release(sets, "rl", tmp_path / "plain", [], {}, [], 2)
    export_release(sets, "rl", out, [], {}, [], 2, counts=counted)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == {
        p.relative_to(tmp_path / "plain"): p.read_bytes() for p in (tmp_path / "plain").rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"^rl/math/train: read 7 rows to export in 4 shards, counted 6 rows "
                                         r"\(3 shards\) before: did the set change while it was exported\?$"):
        export_release(sets, "rl", tmp_path / "changed", [], {}, [], 2, counts={**counted, ("math", "train"): 6})
    assert not (tmp_path / "changed").exists()

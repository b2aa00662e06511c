"""Every default source through its adapter on the REAL fetched files: counts, rejects, spot values.

The whole registry is ingested once per module (~25 s, most of it MMLU's 57
``load_from_disk`` calls and reasoning-gym's sympy generator).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from common.io import Rejects
from corpora.adapters import get_adapter
from corpora.registry import SourceSpec, load_registry
from corpora.schema import SCHEMAS, RecordError
from curation.ingest import finalize_row, ingest_source, source_root
from tests.handed import handed_case

#: source -> (records_in, rows_out, {reject reason prefix: count})
EXPECTED: dict[str, tuple[int, int, dict[str, int]]] = {
    # 17,671 complete elements + the cut tail. 6,358 chunks of split conversations start with the
    # assistant; 130 have no turn left (126 empty, 4 only user turns), 13 no user turn, 20 an empty turn.
    "sharegpt": (17672, 17322, {"truncated file": 1, "invalid record": 349}),
    "fastchat_conversations": (500, 500, {}),
    "tooltalk_conversations": (50, 50, {}),
    "arena_hard_answers": (1498, 1498, {}),  # gemini 748 + o3-mini 750
    "math_solutions": (5000, 5000, {}),
    "mbpp_solutions": (500, 500, {}),
    "math_problems": (5000, 5000, {}),
    "reasoning_gym_math": (1, 1000, {}),  # one generator record -> 5 x 200 rows
    "mbpp_problems": (500, 500, {}),
    "ifbench_prompts": (294, 294, {}),
    "arc": (2675, 2675, {}),  # easy test 2376 + challenge validation 299
    "arc_challenge": (1172, 1172, {}),  # the benchmark: ARC-Challenge's test split
    "openbookqa": (500, 500, {}),
    "sciq": (1000, 1000, {}),
    "medmcqa": (4183, 4183, {}),
    "bfcl": (3475, 3475, {}),
    "bfcl_multi_turn": (800, 799, {"invalid record": 1}),  # miss_func_49 calls `tail` before it is offered
    "tooltalk_episodes": (78, 78, {}),
    "arena_hard_prompts": (750, 750, {}),
    "healthbench": (500, 500, {}),
    "gsm8k": (1319, 1319, {}),
    "math500": (500, 500, {}),
    "humaneval": (164, 164, {}),
    "mmlu": (14042, 14042, {}),
    "ifeval": (541, 541, {}),
    "mtbench": (80, 80, {}),
}


@pytest.fixture(scope="module")
def ingested(sources_cache: Path) -> dict[str, tuple[Any, Rejects]]:
    out = {}
    for spec in load_registry(include_disabled=True):
        if spec.kind == "derived":  # built from other sources' rows: tests/test_rl_builders.py
            continue
        rejects = Rejects("ingest")
        out[spec.name] = (ingest_source(spec, source_root(spec, sources_cache), rejects), rejects)
    return out


def _rows(ingested, name: str) -> list[dict[str, Any]]:
    return ingested[name][0].rows


def _meta(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row["metadata"])


def _find(rows: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    hits = [r for r in rows if all(_meta(r).get(k) == v for k, v in meta.items())]
    assert len(hits) == 1, f"{len(hits)} rows with metadata {meta}"
    return hits[0]


def _prompt(row: dict[str, Any]) -> str:
    return row["responses_create_params"]["input"][-1]["content"]


def test_every_registered_source_has_expected_counts():
    assert sorted(EXPECTED) == sorted(s.name for s in load_registry(include_disabled=True) if s.kind != "derived")


def test_fetch_downloads_the_disabled_sources_too_unless_only_names_some(monkeypatch):
    # the tests read disabled sources from data/sources; fetched by the stage, the tests leave its output alone
    import yaml

    import corpora.fetch
    from curation.params import check_params
    from curation.pipeline import step_fetch

    fetched = []
    monkeypatch.setattr(corpora.fetch, "run_fetch", lambda specs, cache, models: fetched.append({s.name for s in specs}))
    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    step_fetch(check_params(params))
    every = load_registry(include_disabled=True)
    disabled = {s.name for s in every if not s.enabled}
    assert "fastchat_conversations" in disabled and fetched[0] == {s.name for s in every}
    params["sources"]["only"] = ["math500"]
    step_fetch(check_params(params))
    assert fetched[1] == {"math500"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_source_counts(ingested, name):
    result, rejects = ingested[name]
    records_in, rows_out, reasons = EXPECTED[name]
    assert (result.records_in, len(result.rows), rejects.by_reason()) == (records_in, rows_out, reasons)
    assert result.records_in == result.records_mapped + len(rejects)
    spec = load_registry(only=[name])[0]
    pa.Table.from_pylist(result.rows, schema=SCHEMAS[spec.output])  # every row fits the arrow schema
    assert len({r["uuid"] for r in result.rows}) == len(result.rows)


def test_sharegpt_rows_and_rejects(ingested):
    rows, rejects = _rows(ingested, "sharegpt"), ingested["sharegpt"][1]
    first = rows[0]
    assert _meta(first) == {"id": "QWJhYvA_0"}
    assert [m["role"] for m in first["messages"]] == ["user", "assistant"] * 6
    assert first["messages"][0]["content"].startswith("Summarize the main ideas of Jeff Walker's Product Launch")
    reasons = Counter(r["reason"] for r in rejects.rows)
    assert sum(v for k, v in reasons.items() if "messages: no messages" in k) == 266
    dropped = [r for r in rows if "dropped_leading_turns" in _meta(r)]
    assert len(dropped) > 6000 and all(r["messages"][0]["role"] in ("system", "user") for r in dropped)
    assert [r["record_id"] for r in rejects.rows if r["reason"].startswith("truncated file")] == \
        ["ShareGPT_V3_unfiltered_cleaned_split.json:17671"]
    roles = Counter(m["role"] for r in rows for m in r["messages"])
    assert set(roles) == {"system", "user", "assistant"}  # chatgpt/bing/bard/User aliases all mapped
    trimmed = [r for r in rows if "trimmed_turns" in _meta(r)]
    assert trimmed and all(r["messages"][-1]["role"] == "assistant" for r in trimmed)


def test_tooltalk_tool_calls_and_schemas(ingested):
    row = _find(_rows(ingested, "tooltalk_conversations"), name="golden_conversation_1")
    msgs = row["messages"]
    assert msgs[0]["role"] == "system" and "location: San Francisco" in msgs[0]["content"]
    calls = [(m["tool_calls"][0], msgs[i + 1]) for i, m in enumerate(msgs) if m["tool_calls"]]
    assert [c["function"]["name"] for c, _ in calls] == \
        ["UserLogin", "QueryCalendar", "QueryUser", "QueryUser", "QueryUser", "SendEmail"]
    login, result = calls[0]
    assert json.loads(login["function"]["arguments"]) == {"username": "justinkool", "password": "justforkicks123"}
    assert result["role"] == "tool" and result["tool_call_id"] == login["id"]
    assert json.loads(result["content"]) == {"response": {"session_token": "e149636f-d9ca-0792"}, "exception": None}
    assert msgs[-1]["role"] == "assistant" and _meta(row)["trimmed_turns"] == 1
    tools = {t["function"]["name"]: t["function"] for t in json.loads(row["tools"])}
    assert sorted(tools) == ["QueryCalendar", "QueryUser", "SendEmail", "UserLogin"]
    assert tools["QueryCalendar"]["parameters"]["required"] == ["session_token", "start_time", "end_time"]
    assert "session_token" not in tools["UserLogin"]["parameters"]["properties"]


def test_arena_hard_answers_keep_the_generator(ingested):
    rows = _rows(ingested, "arena_hard_answers")
    assert Counter(r["generator"] for r in rows) == {"gemini-2.0-flash-001": 748, "o3-mini-2025-01-31": 750}
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in rows)


def test_math_rows(ingested):
    m500 = _find(_rows(ingested, "math500"), index=0)
    assert json.loads(m500["ground_truth"]) == {"answer": "\\left( 3, \\frac{\\pi}{2} \\right)"}
    assert _meta(m500)["normalized_answer"] == "\\le(3,\\frac{\\pi}{2}\\right)"  # oe-eval's damaged value
    assert _meta(m500)["level"] == 2 and "\\boxed{}" in _prompt(m500)
    algebra = _rows(ingested, "math_problems")[0]
    sol = _rows(ingested, "math_solutions")[0]
    assert sol["messages"][1]["content"].endswith("the graph has $\\boxed{2}$ vertical asymptotes.")
    assert _meta(algebra) == {"level": 3, "type": "Algebra", "index": 0, "normalized_answer": "2",
                              "question": "How many vertical asymptotes does the graph of $y=\\frac{2}{x^2+x-6}$ have?",
                              "solution": sol["messages"][1]["content"]}  # indexed by decontamination
    assert json.loads(algebra["ground_truth"]) == {"answer": "2"}
    gsm = _rows(ingested, "gsm8k")[0]
    assert json.loads(gsm["ground_truth"]) == {"answer": "18"} and "Janet" in _prompt(gsm)
    assert _meta(gsm)["solution"].endswith("every day at the farmer’s market.\n#### 18")


def test_reasoning_gym_rows_rebuild_from_ground_truth(ingested):
    import reasoning_gym

    rows = _rows(ingested, "reasoning_gym_math")
    assert Counter(_meta(r)["generator"] for r in rows) == {g: 200 for g in (
        "basic_arithmetic", "fraction_simplification", "prime_factorization",
        "simple_equations", "polynomial_equations")}
    gt = json.loads(rows[205]["ground_truth"])
    item = reasoning_gym.create_dataset(gt["generator"], size=200, seed=gt["seed"])[gt["index"]]
    assert (gt["answer"], gt["version"], _prompt(rows[205])) == (item["answer"], "0.1.25", item["question"])


def test_reasoning_gym_version_must_match(sources_cache):
    spec = load_registry(only=["reasoning_gym_math"])[0].model_copy(update={"version": "0.0.1"})
    rejects = Rejects("ingest")
    result = ingest_source(spec, source_root(spec, sources_cache), rejects)
    assert result.rows == [] and "registry pins 0.0.1" in rejects.rows[0]["reason"]


def test_code_rows(ingested):
    mbpp = _find(_rows(ingested, "mbpp_problems"), task_id=11)
    truth = json.loads(mbpp["ground_truth"])
    assert truth["mode"] == "assert" and len(truth["tests"]) == 3 and len(truth["challenge_tests"]) == 2
    assert truth["tests"][0] in _prompt(mbpp) and truth["tests"][1] not in _prompt(mbpp)
    sol = _find(_rows(ingested, "mbpp_solutions"), task_id=11)["messages"][1]["content"]
    assert sol.startswith("```python\ndef remove_Occ(s,ch):") and "\r" not in sol
    he = _find(_rows(ingested, "humaneval"), task_id="HumanEval/0")
    truth = json.loads(he["ground_truth"])
    assert truth["entry_point"] == "has_close_elements" and truth["mode"] == "check_candidate"
    assert "def check(candidate)" in truth["test"] and truth["prompt"] in _prompt(he) + "\n"
    namespace: dict[str, Any] = {}  # the kept canonical solution passes the kept test
    exec(truth["prompt"] + _meta(he)["canonical_solution"] + truth["test"], namespace)  # noqa: S102
    namespace["check"](namespace[truth["entry_point"]])


def test_mcq_rows(ingested):
    mmlu = _rows(ingested, "mmlu")[0]  # abstract_algebra, "Find the degree ... sqrt(18)": 4
    truth = json.loads(mmlu["ground_truth"])
    assert truth == {"answer": "B", "options": {"A": "0", "B": "4", "C": "2", "D": "6"}}
    assert _prompt(mmlu).endswith("A. 0\nB. 4\nC. 2\nD. 6\n\nAnswer with the letter of the correct option "
                                  "in \\boxed{}, e.g. \\boxed{A}.")
    regex = _meta(mmlu)["output_regex"]
    assert re.search(regex, "so the answer is \\boxed{B}.").group(1) == "B"
    assert re.search(regex, "\\boxed{\\text{ C }}").group(1) == "C"
    assert re.search(regex, "\\boxed{E}") is None
    arc = _find(_rows(ingested, "arc_challenge"), id="Mercury_7175875")
    assert json.loads(arc["ground_truth"])["answer"] == "C" and arc["domain"] == "stem_mcqa"
    five = [r for name in ("arc", "arc_challenge") for r in _rows(ingested, name)
            if len(json.loads(r["ground_truth"])["options"]) == 5]
    assert len(five) == 8 and "E. " in _prompt(five[0])
    sciq = _find(_rows(ingested, "sciq"), id=0)
    assert json.loads(sciq["ground_truth"])["options"]["D"] == "darwin"
    med = _find(_rows(ingested, "medmcqa"), id="45258d3d-b974-44dd-a161-c3fccbdadd88")
    assert json.loads(med["ground_truth"])["answer"] == "A" and _meta(med)["subject"] == "Physiology"


def test_bfcl_rows(ingested):
    rows = _rows(ingested, "bfcl")
    simple = _find(rows, id="simple_python_0")
    assert json.loads(simple["ground_truth"]) == {
        "calls": [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]}
    tool = json.loads(simple["responses_create_params"]["tools"])[0]
    assert tool["type"] == "function" and tool["function"]["parameters"]["type"] == "object"
    assert json.loads(_find(rows, id="irrelevance_0")["ground_truth"]) == {"calls": []}
    assert Counter(_meta(r)["category"] for r in rows)["live_irrelevance"] == 884
    blob = " ".join(r["responses_create_params"]["tools"] for r in rows)
    assert not re.search(r'"type": "(dict|float|tuple|any)"', blob)
    assert '"default": null' in blob  # BFCL's own nulls are kept


def test_chat_benchmark_rows(ingested):
    mt = _rows(ingested, "mtbench")
    assert sum(r["ground_truth"] != "null" for r in mt) == 39
    assert len(_meta(mt[0])["turns"]) == 2 and _prompt(mt[0]) == _meta(mt[0])["turns"][0]
    hb = _rows(ingested, "healthbench")
    assert all(r["responses_create_params"]["input"][-1]["role"] == "user" for r in hb)
    assert sum(len(json.loads(r["ground_truth"])["rubrics"]) for r in hb) == 5965
    ah = _rows(ingested, "arena_hard_prompts")
    assert Counter(_meta(r)["category"] for r in ah) == {"hard_prompt": 500, "creative_writing": 250}
    assert all(r["agent_ref"] == "genrm" and r["ground_truth"] == "null" for r in ah + mt[:1])


def test_instruction_rows(ingested):
    ifb = _rows(ingested, "ifbench_prompts")[0]
    assert json.loads(ifb["kwargs"]) == [{"keyword1": "kaleidoscope", "keyword2": "nebula", "keyword3": "whisper",
                                          "keyword4": "labyrinth", "keyword5": "paradox"}]
    ife = _find(_rows(ingested, "ifeval"), key=1000)
    assert ife["instruction_id_list"] == ["punctuation:no_comma", "detectable_format:number_highlighted_sections",
                                          "length_constraints:number_words"]
    assert json.loads(ife["kwargs"]) == [{}, {"num_highlights": 3}, {"relation": "at least", "num_words": 300}]


# ------------------------------------------------------------------ adapter behaviour on small records
def _spec(adapter: str, output: str = "sft", **kw: Any) -> SourceSpec:
    return SourceSpec(name="t", kind="local", path="x", format="jsonl", adapter=adapter, output=output,
                      domain=kw.pop("domain", "chat"), role="train", license="MIT", **kw)


def _adapt(adapter: str, raw: Any, output: str = "sft", root: Path = Path("."), **kw: Any) -> dict[str, Any]:
    spec = _spec(adapter, output, **kw)
    return finalize_row(get_adapter(adapter)(raw, spec, root), spec, "r", 0)


def test_chat01_sharegpt_roles_all_turns_and_system():
    case = handed_case("CHAT-01")
    row = _adapt("sharegpt", case["input"]["row"])
    assert [{"role": m["role"], "content": m["content"]} for m in row["messages"]] == case["expected"]["messages"]
    assert any(m["role"] == "assistant" and m["content"] for m in row["messages"])  # something to train on
    with pytest.raises(RecordError, match=r"conversations\[0\]\.role: unknown role 'narrator'"):
        _adapt("sharegpt", case["input"]["bad_row"])


@pytest.mark.parametrize("turns, error", [
    ([("gpt", "hi"), ("human", "q")], r"messages: no (messages|user turn)"),
    ([("human", "q"), ("  Robot ", "a")], r"conversations\[1\]\.role: unknown role '  Robot '"),
    ([("human", "q"), ("gpt", "  ")], r"messages\[[12]\]: empty turn"),
])
@pytest.mark.parametrize("system", [None, "Be brief."])
def test_sharegpt_rejects(turns, error, system):
    with pytest.raises(RecordError, match=error):
        _adapt("sharegpt", {"id": "x", "system": system,
                            "conversations": [{"from": f, "value": v} for f, v in turns]})


def test_sharegpt_drops_leading_assistant_turns_of_split_chunks_visibly():
    row = _adapt("sharegpt", {"id": "x_1", "conversations": [
        {"from": "gpt", "value": "...rest of a long answer"}, {"from": "human", "value": "q2"},
        {"from": "gpt", "value": "a2"}]})
    assert [(m["role"], m["content"]) for m in row["messages"]] == [("user", "q2"), ("assistant", "a2")]
    assert _meta(row) == {"id": "x_1", "dropped_leading_turns": 1}


def test_sharegpt_trims_trailing_user_turns_visibly():
    row = _adapt("sharegpt", {"id": "x", "system": " ", "conversations": [  # an empty system adds no turn
        {"from": " HUMAN", "value": "q"}, {"from": "ChatGPT", "value": "a"}, {"from": "user", "value": "q2"},
        {"from": "human", "value": "q3"}]})
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
    assert json.loads(row["metadata"]) == {"id": "x", "trimmed_turns": 2}


def test_mcq_gold_out_of_range_is_rejected():
    raw = {"question": "q", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": 4}
    with pytest.raises(RecordError, match="gold: index 4 is outside the 4 options"):
        _adapt("mmlu", raw, "rl", domain="stem_mcqa")


def test_bfcl_multi_turn_and_missing_answers_are_rejected(tmp_path):
    fn = [{"name": "f", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float"}, "t": {"type": "tuple", "items": {"type": "any"}}}}}]
    with pytest.raises(RecordError, match="only single-turn"):
        _adapt("bfcl", {"id": "multi_turn_base_0", "question": [[{"role": "user", "content": "a"}]] * 2,
                        "function": fn}, "rl", tmp_path, domain="tool_calling")
    with pytest.raises(RecordError, match="no possible-answer file"):
        _adapt("bfcl", {"id": "simple_python_0", "question": [[{"role": "user", "content": "a"}]],
                        "function": fn}, "rl", tmp_path, domain="tool_calling")
    row = _adapt("bfcl", {"id": "irrelevance_3", "question": [[{"role": "user", "content": "a"}]], "function": fn},
                 "rl", tmp_path, domain="tool_calling")
    params = json.loads(row["responses_create_params"]["tools"])[0]["function"]["parameters"]
    assert params == {"type": "object", "properties": {"x": {"type": "number"}, "t": {"type": "array", "items": {}}}}


def test_tooltalk_without_api_docs_notes_it():
    raw = {"name": "n", "apis_used": ["AddAlarm"], "metadata": {"location": "L", "timestamp": "T"},
           "conversation": [{"role": "user", "text": "set an alarm"},
                            {"role": "assistant", "text": "done", "apis": [
                                {"request": {"api_name": "AddAlarm", "parameters": {"time": "07:00:00"}},
                                 "response": {"alarm_id": "a"}, "exception": None}]}]}
    row = _adapt("tooltalk", raw, domain="conversational_agent")
    assert row["tools"] == "[]" and "not available" in json.loads(row["metadata"])["tools_note"]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]

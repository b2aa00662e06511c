"""The verifier registry through TRL's, verl's and NeMo-Gym's reward signatures gives ``verify``'s
verdicts on real rows of every domain of the RL release (right answers, wrong ones and attacks),
one reward per completion, and ``None`` (TRL) or a clear error (verl, NeMo-Gym) where a domain has
no single-response verifier."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks.verifiers import bfcl_response, real_rows
from corpora.chat import trl_prompt
from curation.release_loader import load_release
from curation.trainer_layouts import load_for_trl, write_verl
from validators.rewards import nemo_gym, verl
from validators.rewards.trl import completion_text, reward_func, reward_funcs
from validators.verifiers import verify

DOMAINS = ("code", "instruction_following", "long_context", "math", "rlhf", "stem_mcqa", "structured_output",
           "tool_calling")
ROWS_PER_DOMAIN = 6


@pytest.fixture(scope="module")
def release(trainer_releases) -> Path:
    return trainer_releases


def _instance(schema: dict):
    """A small JSON value valid under ``schema`` (the subset the structured-output tasks use)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _instance(props.get(k, {})) for k in schema.get("required", [])}
    if kind == "array":
        return [_instance(schema.get("items") or {}) for _ in range(schema.get("minItems", 0))]
    return {"string": "x" * max(1, schema.get("minLength", 1)), "integer": max(1, schema.get("minimum", 1)),
            "number": float(max(1, schema.get("minimum", 1))), "boolean": True, "null": None}[kind]


def _right(row: dict, code: dict[int, str]) -> str | None:
    """A response that should pass ``row``'s verifier, where one is known."""
    gt = json.loads(row["ground_truth"]) if row["ground_truth"] else {}
    ref = row["agent_ref"]
    if ref in ("math", "mcqa", "reasoning_gym"):
        return f"<think>Work it out.</think>The answer is $\\boxed{{{gt['answer']}}}$."
    if ref == "tool_call":
        return bfcl_response(row)
    if ref == "long_context":
        return ", ".join(gt["answers"])
    if ref == "structured_output":
        return json.dumps(_instance(gt["schema"]))
    if ref == "code":
        return code.get(json.loads(row["metadata"]).get("task_id"))
    return None


def _responses(row: dict, code: dict[int, str]) -> list[str]:
    """Right (when known), wrong and attacking responses to ``row``."""
    right = _right(row, code)
    prompt = row["responses_create_params"]["input"][-1]["content"]
    out = ["", "I cannot answer.", prompt[:400], "\\boxed{ZZZ}", "<think>unclosed " + (right or prompt[:50])]
    if right:
        out += [right, f"<think>{right}</think>no answer here", f"{right}\n\n{right}"]
    return out


@pytest.fixture(scope="module")
def cases(release) -> list[tuple[str, dict]]:
    """(response, row) over the first rows of every domain config of the RL release (both splits)."""
    code = {json.loads(r["metadata"])["task_id"]: r["messages"][-1]["content"] for r in real_rows("mbpp_solutions")}
    out = []
    for domain in DOMAINS:
        rows = [r for split in ("validation", "train") for r in load_release(release / "rl", domain, split)]
        for row in rows[:ROWS_PER_DOMAIN]:
            out += [(resp, row) for resp in _responses(row, code)]
    return out


@pytest.fixture(scope="module")
def verdicts(cases) -> list:
    """``verify``'s verdict of each case; None where the row's verifier grades no single response
    (rlhf: a judge compares a group; its ``verify`` refuses any response that has a final answer)."""
    out = []
    for response, row in cases:
        if row["agent_ref"] == "genrm":
            with pytest.raises(ValueError, match="scored per group by a judge model"):
                verify("An answer.", row)
            out.append(None)
        else:
            out.append(verify(response, row))
    return out


def _rewards(verdicts) -> list[float | None]:
    return [None if v is None else v.reward for v in verdicts]


def test_cases_cover_every_domain_with_passes_and_failures(cases, verdicts):
    expected = [(row["domain"], r) for (_, row), r in zip(cases, _rewards(verdicts))]
    assert {d for d, _ in expected} == set(DOMAINS)
    for domain in set(DOMAINS) - {"rlhf", "instruction_following"}:
        rewards = [r for d, r in expected if d == domain]
        assert 1.0 in rewards and 0.0 in rewards, (domain, rewards)


def test_trl_rewards_equal_verify_per_completion(cases, verdicts):
    """Plain and conversational completions, every row repeated with different completions (as TRL
    repeats columns per generation): each value is its own completion's verdict, never broadcast."""
    rows = [row for _, row in cases]
    columns = {k: [row[k] for row in rows] for k in rows[0]}
    expected = _rewards(verdicts)
    plain = [resp for resp, _ in cases]
    chat = [[{"role": "assistant", "content": resp}] for resp in plain]
    prompts = [trl_prompt(row["responses_create_params"]) for row in rows]
    everything = reward_func()
    assert everything.__name__ == "verifier"
    assert everything(prompts, plain, None, **columns, trainer_state=None) == expected
    assert everything(prompts, chat, completion_ids=None, **columns) == expected
    per_verifier = reward_funcs()
    outputs = [f(prompts=prompts, completions=plain, completion_ids=None, **columns) for f in per_verifier]
    for i, row in enumerate(rows):  # exactly one function grades a row: its own verifier's
        graded = [out[i] for f, out in zip(per_verifier, outputs) if f.__name__ == row["agent_ref"]]
        others = [out[i] for f, out in zip(per_verifier, outputs) if f.__name__ != row["agent_ref"]]
        assert graded == ([] if row["agent_ref"] == "genrm" else [expected[i]]) and set(others) == {None}


def test_trl_conversational_completions_grade_the_policys_turns_only():
    row = {"uuid": "u", "agent_ref": "math", "ground_truth": json.dumps({"answer": "42"})}
    f = reward_func("math")
    cols = {"agent_ref": ["math"] * 4, "ground_truth": [row["ground_truth"]] * 4, "uuid": ["u"] * 4}
    completions = [
        [{"role": "assistant", "reasoning_content": "6 * 7", "content": "$\\boxed{42}$"}],  # reasoning kept apart
        [{"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"type": "function", "function": {"name": "calc", "arguments": {"x": "6*7"}}}]},
         {"role": "tool", "content": "\\boxed{42}"}],  # the tool's output is not the policy's answer
        [{"role": "assistant", "content": [{"type": "text", "text": "\\boxed{42}"}]}],
        [{"role": "assistant", "reasoning_content": "\\boxed{42}", "content": "no idea"}],  # answer hidden in reasoning
    ]
    logged = []
    assert f(["p"] * 4, completions, **cols, log_extra=lambda *a: logged.append(a),
             log_metric=lambda *a: logged.append(a)) == [1.0, 0.0, 1.0, 0.0]
    reasons = [verify(completion_text(c), row).reason for c in completions]
    assert logged == [("math/reason", reasons), ("math/grader_errors", 0.0)]
    assert completion_text(completions[0]) == "$\\boxed{42}$"
    assert completion_text(completions[1]) == ('Let me check.<tool_call>{"name": "calc", "arguments": {"x": "6*7"}}'
                                               '</tool_call>')
    assert verify(completion_text(completions[0]), row).reward == 1.0


def _no_call_row(release) -> dict:
    """A real tool-calling row whose right answer is no call (BFCL irrelevance)."""
    rows = [r for split in ("validation", "train") for r in load_release(release / "rl", "tool_calling", split)]
    return next(r for r in rows if json.loads(r["ground_truth"])["calls"] == [])


def test_cut_off_reasoning_has_no_final_answer_in_every_wrapper(release):
    """A completion cut off while thinking parses to reasoning alone (TRL's parser, a Responses API
    ``incomplete`` reasoning item): no final answer, reward 0, as ``verify`` gives the raw text, on a
    row that expects no call (a reply in words passes it; an empty one does not)."""
    row = _no_call_row(release)
    cut = "<think>Which tool? Let me think about the weather " * 20
    assert verify(cut, row).reward == 0.0 and verify("", row).reward == 0.0
    assert verify("None of these tools can answer that, sorry.", row).reward == 1.0
    cols = {k: [row[k]] for k in row}
    for reasoning in ("Which tool? Let me think", ""):
        assert reward_func()(["p"], [[{"role": "assistant", "reasoning_content": reasoning}]], **cols) == [0.0]
    for item in ({"type": "reasoning", "content": [{"type": "reasoning_text", "text": cut}]},
                 {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Thinking."}]},
                 {"type": "reasoning", "summary": []}):
        out = nemo_gym.verify({**row, "response": {"status": "incomplete", "output": [item]}})
        assert (out["reward"], out["reason"]) == (0.0, "unclosed <think> block: no final answer")


def test_every_turn_of_a_trajectory_is_graded_not_only_the_last(release):
    """A thinking model reasons again after each tool result: the tool calls of earlier turns still
    count (a call on a no-call row fails; the expected calls followed by a final reply pass; a final
    turn of reasoning alone has no final answer)."""
    row = _no_call_row(release)
    tool = json.loads(row["responses_create_params"]["tools"])[0]["function"]["name"]
    turns = [{"role": "assistant", "reasoning_content": "Call it anyway.", "content": "",
              "tool_calls": [{"type": "function", "function": {"name": tool, "arguments": {}}}]},
             {"role": "tool", "content": "{}"}, {"role": "assistant", "reasoning_content": "ok", "content": "Done."}]
    assert reward_func()(["p"], [turns], **{k: [row[k]] for k in row}) == [0.0]
    output = [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "Call it."}]},
              {"type": "function_call", "name": tool, "arguments": "{}", "call_id": "c0"},
              {"type": "function_call_output", "call_id": "c0", "output": "{}"},
              {"type": "reasoning", "summary": [{"type": "summary_text", "text": "ok"}]},
              {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}]
    assert nemo_gym.verify({**row, "response": {"output": output}})["reward"] == 0.0
    expecting = next(r for r in load_release(release / "rl", "tool_calling", "validation")
                     if json.loads(r["ground_truth"])["calls"])
    calls = json.loads("[" + bfcl_response(expecting).replace("<tool_call>", "").replace("</tool_call>", ",")[:-1] + "]")
    turns = [{"role": "assistant", "reasoning_content": "Call them.", "content": "",
              "tool_calls": [{"type": "function", "function": c} for c in calls]},
             {"role": "tool", "content": "{}"}, {"role": "assistant", "reasoning_content": "ok", "content": ""}]
    cols = {k: [expecting[k]] for k in expecting}
    done = turns[:2] + [{**turns[2], "content": "Done."}]
    assert reward_func()(["p"] * 3, [turns[:1], done, turns], **{k: v * 3 for k, v in cols.items()}) == [1.0, 1.0, 0.0]


def test_trl_refuses_rows_without_their_verifier_columns_or_an_installed_verifier():
    f = reward_func()
    with pytest.raises(ValueError, match="row 'u1': ground_truth must be a JSON object, got NoneType"):
        f(["p"], ["\\boxed{1}"], agent_ref=["math"], uuid=["u1"])  # a lost column is an error, never a 0
    with pytest.raises(ValueError, match="completion message 0: tool_calls must be a list of call objects"):
        f(["p"], [[{"role": "assistant", "content": "", "tool_calls": "calc"}]], agent_ref=["math"])
    with pytest.raises(ValueError, match="completion message 1: content must be a string or a list of content parts"):
        f(["p"], [[{"role": "assistant", "content": "a"}, {"role": "assistant", "content": 5}]], agent_ref=["math"])
    with pytest.raises(ValueError, match="no agent_ref column"):
        f(["p"], ["x"], ground_truth=["{}"])
    with pytest.raises(ValueError, match=r"row 'u7': agent_ref 'nope'"):
        f(["p"], ["x"], agent_ref=["nope"], uuid=["u7"])
    with pytest.raises(ValueError, match="column 'ground_truth' has 1 values for 2 completions"):
        f(["p", "p"], ["x", "y"], agent_ref=["math", "math"], ground_truth=["{}"])
    with pytest.raises(KeyError):
        reward_func("nope")


def test_verl_layout_and_compute_score_equal_verify_on_every_domain(release, tmp_path, cases, verdicts):
    """``cascade verl``'s parquet carries each row's verifier inputs: compute_score on the written
    rows equals verify on the release rows, and refuses rlhf rows (a judge's) like verify does."""
    by_uuid = {}
    for domain in DOMAINS:
        counts = write_verl(release / "rl", domain, tmp_path / domain)
        for split, n in counts.items():
            table = pq.read_table(tmp_path / domain / f"{split}.parquet").to_pylist()
            assert len(table) == n == len(load_release(release / "rl", domain, split))
            by_uuid.update({r["extra_info"]["uuid"]: r for r in table})
    for (response, row), verdict in zip(cases, verdicts, strict=True):
        sample = by_uuid[row["uuid"]]
        assert sample["data_source"] == row["domain"] and sample["prompt"] == trl_prompt(row["responses_create_params"])
        args = (sample["data_source"], response, sample["reward_model"]["ground_truth"], sample["extra_info"])
        if verdict is None:
            with pytest.raises(ValueError, match="grades groups or episodes"):
                verl.compute_score(*args)
            continue
        assert verl.compute_score(*args) == {"score": verdict.reward, "acc": float(verdict.passed), "grader_error": 0.0}


def test_verl_refuses_a_sample_without_its_row():
    with pytest.raises(ValueError, match="extra_info lacks agent_ref; write the parquet with `cascade verl`"):
        verl.compute_score("math", "\\boxed{1}", '{"answer": "1"}', {"index": 0})
    info = {"uuid": "m", "agent_ref": "math"}
    with pytest.raises(TypeError, match="solution_str must be the decoded response \\(str\\), got list"):
        verl.compute_score("math", [1, 2], '{"answer": "1"}', info)
    with pytest.raises(TypeError, match="timeout_s must be positive seconds, got 0"):
        verl.compute_score("math", "\\boxed{1}", '{"answer": "1"}', info, timeout_s=0)


def _responses_api(response: str) -> dict:
    return {"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": response}]}]}


def test_nemo_gym_verify_equals_verify_on_release_rows(cases, verdicts):
    for (response, row), verdict in list(zip(cases, verdicts, strict=True))[::3]:
        body = {**row, "response": _responses_api(response)}
        if verdict is None:
            with pytest.raises(ValueError, match="grades groups or episodes"):
                nemo_gym.verify(body)
            continue
        out = nemo_gym.verify(body)
        assert (out["reward"], out["reason"], out["uuid"], out["grader_error"]) == (
            verdict.reward, verdict.reason, row["uuid"], None)


def test_nemo_gym_grades_reasoning_and_function_calls_but_not_tool_outputs(release):
    row = next(r for r in load_release(release / "rl", "tool_calling", "validation")
               if json.loads(r["ground_truth"])["calls"])
    blocks = json.loads("[" + bfcl_response(row).replace("<tool_call>", "").replace("</tool_call>", ",")[:-1] + "]")
    calls = [{"type": "function_call", "name": b["name"], "arguments": json.dumps(b["arguments"]), "call_id": f"c{i}"}
             for i, b in enumerate(blocks)]
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Call the tools."}]}
    assert nemo_gym.verify({**row, "response": {"output": [reasoning, *calls]}})["reward"] == 1.0
    echoed = [{"type": "function_call_output", "call_id": "c0", "output": bfcl_response(row)}]
    assert nemo_gym.verify({**row, "response": {"output": echoed}})["reward"] == 0.0
    think_only = [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": bfcl_response(row)}]}]
    assert nemo_gym.verify({**row, "response": {"output": think_only}})["reward"] == 0.0
    with pytest.raises(ValueError, match="response.output must be the Responses API output list"):
        nemo_gym.verify({**row, "response": {"text": "x"}})


def test_trl_dataset_keeps_every_column_and_renders_tools_into_the_prompt(release):
    ds = load_for_trl(release / "rl", "tool_calling", "validation")
    raw = load_release(release / "rl", "tool_calling", "validation")
    for row, src in zip(ds, raw):
        assert {k: v for k, v in row.items() if k != "prompt"} == src
        tools = json.loads(src["responses_create_params"]["tools"])
        assert row["prompt"][0]["role"] == "system" and all(t["function"]["name"] in row["prompt"][0]["content"]
                                                            for t in tools)
        assert [m["content"] for m in row["prompt"] if m["role"] != "system"] == [
            m["content"] for m in src["responses_create_params"]["input"] if m["role"] != "system"]


def test_cascade_verl_writes_every_split_and_refuses_an_sft_release(release, tmp_path, capsys):
    from curation.cli import main

    assert main(["verl", str(release / "rl"), "stem_mcqa", str(tmp_path / "v")]) == 0
    written = {p.name: pq.read_metadata(p).num_rows for p in (tmp_path / "v").iterdir()}
    assert written == {f"{s}.parquet": len(load_release(release / "rl", "stem_mcqa", s)) for s in ("train", "validation")}
    assert main(["verl", str(release / "sft"), "math", str(tmp_path / "w")]) == 1
    assert "config 'math' has no responses_create_params column: not an RL release" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    with pytest.raises(ValueError, match="not an RL release"):
        load_for_trl(release / "sft", "math")

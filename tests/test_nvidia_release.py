"""NVIDIA's Cascade-2 releases end to end on local Hub-layout fixtures (:mod:`tests.nvidia_fixtures`):
every config and agent ingested, graded (a correct response 1, a wrong one 0, through ``verify_batch``
and the TRL, verl and NeMo-Gym wrappers) and exported back byte for byte. The sources are
``corpora/sources-hub.yaml``'s, pointed at the fixtures.
"""

from __future__ import annotations

import json

import pytest

from common.io import Rejects
from corpora.readers import read_records
from curation.ingest import check_yields, ingest_source
from curation.trainer_layouts import nemo_gym_line, verl_row
from tests.nvidia_fixtures import (
    RESPONSES,
    ROOT,
    calc_mirror,
    hub_specs,
    ingest,
    responses_api,
    upstream_lines,
    upstream_uuid,
)
from validators.rewards.nemo_gym import verify as nemo_gym_verify
from validators.rewards.trl import reward_func
from validators.rewards.verl import compute_score
from validators.verifiers.batch import verify_batch


@pytest.fixture(scope="module")
def rl():
    """``{source: (rows, rejects)}`` of every RL config."""
    return ingest("rl")


def test_every_config_and_agent_ingests(rl):
    got = {name: (sorted((r["agent_ref"], r["domain"]) for r in rows), sorted(x["reason"] for x in rejects.rows))
           for name, (rows, rejects) in rl.items()}
    assert got == {
        "cascade2_rl_if": ([("instruction_following", "instruction_following")] * 4, []),
        "cascade2_rl_multi_domain": (
            [("mcqa", "stem_mcqa")] * 2 + [("structured_output", "structured_output")]
            + [("workplace", "tool_calling")] * 2,
            ["no_ground_truth: nothing to verify against (ground_truth has no calls)",
             "no_ground_truth: nothing to verify against (no expected_answer)"]),
        "cascade2_rl_mopd": (
            [("instruction_following", "instruction_following"), ("math", "math"), ("mcqa", "stem_mcqa"),
             ("structured_output", "structured_output"), ("workplace", "tool_calling")],
            ["no_ground_truth: nothing to verify against (no expected_answer)"]),
        "cascade2_rl_swe": ([("swe", "swe")] * 2, []),
    }


def test_ground_truth_shapes_are_translated(rl):
    rows = {upstream_uuid(r): r for rows, _ in rl.values() for r in rows}
    if_row = rows["8d0c63d2-6a0b-5d2e-9a51-0c3f1f7e2a01"]
    assert json.loads(if_row["kwargs"]) == [{"relation": "at least", "num_words": 60}, {}]  # null-padded, null
    assert json.loads(rows["8d0c63d2-6a0b-5d2e-9a51-0c3f1f7e2a02"]["kwargs"]) == [{}, {"keywords": ["tide"]}]  # JSON strings
    mcqa = rows["5a1e0b7c-2f43-5c1d-8e77-4d2b9c0a1f11"]
    assert json.loads(mcqa["ground_truth"]) == {"answer": "C", "options": {
        "A": "Momentum", "B": "Total energy", "C": "Kinetic energy", "D": "Mass"}}
    assert json.loads(mcqa["metadata"])["output_regex"] == "Answer:\\s*\\(?([A-D])\\)?"
    stem = rows["0f6a4c1e-8b2d-5f3a-a7c9-1e2d3c4b5a63"]  # no options field: read from the question's lines
    assert json.loads(stem["ground_truth"])["options"] == {"A": "Gluon", "B": "W boson", "C": "Photon", "D": "Graviton"}
    work = json.loads(rows["b7f2c9e4-1d3a-5e8b-9c6f-2a4d8e1f3b50"]["ground_truth"])["calls"]
    assert work[1] == {"name": "email_reply_email", "arguments": {
        "email_id": "00000057", "body": "Thanks for the update - I will get back to you tomorrow."}}
    element = rows["0f6a4c1e-8b2d-5f3a-a7c9-1e2d3c4b5a64"]  # strict as NeMo-Gym validates: all required, no extra
    assert json.loads(element["ground_truth"])["schema"] == {
        "type": "object", "properties": {"symbol": {"type": "string"}, "atomic_number": {"type": "integer"}},
        "required": ["symbol", "atomic_number"], "additionalProperties": False}
    assert json.loads(element["metadata"])["fenced"] == "reject"
    swe = json.loads(rows["a9e3f1d2-5b6c-5d7e-8f90-1a2b3c4d5e01"]["ground_truth"])
    assert (swe["repo"], swe["FAIL_TO_PASS"], swe["PASS_TO_PASS"]) == (
        "cascade-fixtures/calc", ["tests/test_calc.py::test_pair"], ["tests/test_calc.py::test_one"])
    meta = json.loads(if_row["metadata"])
    assert meta["nemo_gym_agent_ref"] == {"type": "responses_api_agents", "name": "instruction_following_simple_agent"}
    assert (if_row["pass_rate"], if_row["pass_rate_total"], if_row["pass_rate_passed"]) == (0.625, 8, 5)


def _graded(rl):
    """``[(row, correct, wrong)]`` of every RL row graded by one response (SWE: by episodes, below)."""
    return [(r, RESPONSES[upstream_uuid(r)]["correct"], RESPONSES[upstream_uuid(r)]["wrong"])
            for rows, _ in rl.values() for r in rows if r["agent_ref"] != "swe"]


def test_correct_scores_1_and_wrong_0_through_verify_batch(rl):
    cases = _graded(rl)
    assert len(cases) == 14
    verdicts = verify_batch([c for _, c, _ in cases] + [w for _, _, w in cases], [r for r, _, _ in cases] * 2)
    rewards = [v.reward for v in verdicts]
    reasons = {r["agent_ref"]: v.reason for (r, _, _), v in zip(cases, verdicts)}
    assert rewards == [1.0] * len(cases) + [0.0] * len(cases), reasons


def test_correct_scores_1_and_wrong_0_through_trl_and_verl(rl):
    cases = _graded(rl)
    rows = [r for r, _, _ in cases] * 2
    columns = {k: [r.get(k) for r in rows] for k in rows[0]}
    completions = [[{"role": "assistant", "content": c}] for _, c, _ in cases] + [
        [{"role": "assistant", "content": w}] for _, _, w in cases]
    assert reward_func()([None] * len(rows), completions, **columns) == [1.0] * len(cases) + [0.0] * len(cases)
    for i, (row, correct, wrong) in enumerate(cases):
        v = verl_row(row, "train", i)
        args = (v["data_source"], v["reward_model"]["ground_truth"], v["extra_info"])
        assert [compute_score(args[0], text, *args[1:])["score"] for text in (correct, wrong)] == [1.0, 0.0], row["uuid"]


def test_correct_scores_1_and_wrong_0_through_nemo_gym_on_upstream_rows(rl):
    """NeMo-RL sends the upstream row whole: the verify server translates its agent's fields itself."""
    upstream = {u: json.loads(line) for c in ("IF-RL", "multi-domain-RL", "MOPD") for u, line in upstream_lines(c).items()}
    for row, correct, wrong in _graded(rl):
        body = upstream[upstream_uuid(row)]
        got = [nemo_gym_verify({**body, "response": responses_api(t)})["reward"] for t in (correct, wrong)]
        assert got == [1.0, 0.0], (row["uuid"], body["agent_ref"])


def test_swe_rows_scored_by_episodes(rl, tmp_path):
    from tests.swe_policies import ScriptedPolicy, tool_call
    from validators.episodes import run_episodes
    from validators.swe.environment import AgentConfig, SWEEnvironment

    rows = rl["cascade2_rl_swe"][0]
    assert {json.loads(r["ground_truth"])["base_commit"] for r in rows} == {"292e2d3b4e2de5834bd3661f369e02428cc53f90"}
    env = SWEEnvironment(tmp_path, AgentConfig(mirrors=str(calc_mirror(tmp_path))))
    fix = tool_call("edit_file", path="calc/__init__.py", old_text="(len(xs) + 1)", new_text="len(xs)")
    fixed = run_episodes(env, ScriptedPolicy(lambda ep: [fix]), rows)
    noop = run_episodes(env, ScriptedPolicy.noop(), rows)
    assert [e.grade.reward for e in fixed] == [1.0, 1.0] and [e.grade.reward for e in noop] == [0.0, 0.0]


#: Patches a policy might answer a SWE row with, and what they earn (the row's own ``patch`` is the fix).
CHEATS = {
    "docstring_only": ('-    """The arithmetic mean of a non-empty list."""\n+    """The mean."""\n', "calc/__init__.py"),
    "test_made_true": ("-    assert mean([2]) in (1, 2)\n+    assert True\n", "tests/test_calc.py"),
}


def _edit(path: str, hunk: str) -> str:
    old, new = hunk.split("\n+")
    start = "1,3" if path == "calc/__init__.py" else "5,1"
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -{start} +{start} @@\n"
            f"{old}\n+{new}")


def test_swe_rows_scored_as_patches_through_every_wrapper(rl, tmp_path, monkeypatch):
    """One response to a SWE row is graded as SWE-bench grades a model patch (agentless)."""
    monkeypatch.setenv("CASCADE_SWE_MIRRORS", str(calc_mirror(tmp_path)))
    rows = rl["cascade2_rl_swe"][0]
    gold = json.loads(rows[0]["ground_truth"])["patch"]
    answers = [f"The divisor was off by one.\n```diff\n{gold}```", "I fixed it.",
               *(_edit(path, hunk) for hunk, path in CHEATS.values())]
    got = verify_batch(answers, [rows[0]] * len(answers), timeout_s=60)
    assert [v.reward for v in got] == [1.0, 0.0, 0.0, 0.0], [v.reason for v in got]
    assert [got[1].reason, got[3].details["restored"]] == ["no unified diff in the final answer", ["tests/test_calc.py"]]
    columns = {k: [rows[1].get(k)] * 2 for k in rows[1]}
    assert reward_func(timeout_s=60)([None] * 2, [answers[0], answers[1]], **columns) == [1.0, 0.0]
    v = verl_row(rows[1], "train", 0)
    assert compute_score(v["data_source"], answers[0], v["reward_model"]["ground_truth"], v["extra_info"],
                         timeout_s=60)["score"] == 1.0
    body = json.loads(upstream_lines("SWE-RL")[upstream_uuid(rows[1])])
    assert nemo_gym_verify({**body, "response": responses_api(answers[0])}, timeout_s=60)["reward"] == 1.0
    monkeypatch.delenv("CASCADE_SWE_MIRRORS")
    assert verify_batch(answers[:1], rows[:1], timeout_s=60)[0].error == "no_environment"


def test_export_back_is_the_upstream_line_byte_for_byte(rl):
    for name, config in (("cascade2_rl_if", "IF-RL"), ("cascade2_rl_multi_domain", "multi-domain-RL"),
                         ("cascade2_rl_mopd", "MOPD"), ("cascade2_rl_swe", "SWE-RL")):
        lines = upstream_lines(config)
        for row in rl[name][0]:
            assert nemo_gym_line(row) == lines[upstream_uuid(row)]
    row = rl["cascade2_rl_if"][0][0]
    measured = json.loads(nemo_gym_line({**row, "pass_rate": 0.5, "pass_rate_passed": 4}))
    assert (measured["pass_rate"], measured["pass_rate_passed"], measured["pass_rate_total"]) == (0.5, 4, 8)
    assert measured["kwargs"] == json.loads(upstream_lines("IF-RL")[upstream_uuid(row)])["kwargs"]


def test_unknown_agents_are_rejected_by_name_and_fail_the_step(tmp_path):
    config = tmp_path / "MYSTERY"
    config.mkdir()
    row = {"uuid": "u1", "responses_create_params": {"input": [{"role": "user", "content": "Hi"}]},
           "agent_ref": {"type": "responses_api_agents", "name": "calendar_simple_agent"}}
    (config / "train.jsonl").write_text(json.dumps(row) + "\n")
    spec = hub_specs("rl")[0].model_copy(update={"name": "mystery", "path": str(tmp_path), "hf_config": "MYSTERY"})
    rejects = Rejects("ingest")
    result = ingest_source(spec, tmp_path, rejects)
    assert result.rows == [] and rejects.rows[0]["reason"].startswith(
        "unknown_agent: NeMo-Gym agent 'calendar_simple_agent' names no verifier here")
    with pytest.raises(Exception, match="'mystery'.*yielded no rows.*unknown_agent: 1"):
        check_yields([spec], {"mystery": {"rows_out": 0, "records_in": 1, "records_rejected": 1}}, rejects)


def test_sft_configs_ingest_with_the_cards_license(tmp_path):
    got = {}
    for spec in hub_specs("sft"):
        rejects = Rejects("ingest")
        rows = ingest_source(spec, ROOT, rejects).rows
        assert len(rejects) == 0, [r["reason"] for r in rejects.rows]
        got[spec.hf_config] = (len(rows), rows[0]["domain"], rows[0]["license"])
    assert set(got) == {"math", "science", "chat", "instruction_following", "safety", "conversational_agent", "swe",
                        "terminal_agent"}
    assert {lic for _, _, lic in got.values()} == {"nvidia-open-model-license"}  # the card's, not a row's own
    assert {d for _, d, _ in got.values()} == set(got)  # terminal_agent rows are terminal_agent, not swe
    assert list(read_records(hub_specs("sft")[0], ROOT))[0].data["uuid"] == "s-math-1"

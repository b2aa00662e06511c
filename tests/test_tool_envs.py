"""Multi-turn tool environments (validators/tools): scripted policies on real BFCL multi-turn and ToolTalk
rows. The ground truth scores 1 in every category; a wrong order, a missing call, an extra write, or a call
where the ground truth makes none scores 0. The full sets: ``pytest -m slow tests/test_tool_envs.py``
(799 BFCL + 78 ToolTalk rows, all 1; benchmarks/tool_envs.py prints the table)."""

from __future__ import annotations

import json

import pytest

from tests.tool_policies import TurnScript, edited, truth_turns
from tests.tool_rows import by_category, episode_rows
from validators.episodes import run_episodes
from validators.tools.bfcl import BFCLEnvironment
from validators.tools.tooltalk import ToolTalkEnvironment


@pytest.fixture(scope="module")
def bfcl_rows(sources_cache):
    rows, rejected = episode_rows(sources_cache, "bfcl_multi_turn")
    assert rejected == ["multi_turn_miss_func_49"]  # its ground truth calls `tail` before it is offered
    return rows


@pytest.fixture(scope="module")
def tooltalk_rows(sources_cache):
    rows, rejected = episode_rows(sources_cache, "tooltalk_episodes")
    assert not rejected and len(rows) == 78
    return rows


def row(rows, uuid):
    return next(r for r in rows if r["uuid"] == uuid)


def test_bfcl_rows_per_category(bfcl_rows):
    counts = {}
    for r in bfcl_rows:
        counts[r["metadata"]["category"]] = counts.get(r["metadata"]["category"], 0) + 1
    assert counts == {"multi_turn_base": 200, "multi_turn_miss_func": 199, "multi_turn_miss_param": 200,
                      "multi_turn_long_context": 200}
    miss = row(bfcl_rows, "multi_turn_miss_func_0")
    gt = json.loads(miss["ground_truth"])
    offered = {t["function"]["name"] for t in json.loads(miss["responses_create_params"]["tools"])}
    assert "sort" not in offered  # held out until turn 3, where BFCL's "I have updated ..." turn offers it
    assert [t["function"]["name"] for t in gt["missed_function"]["3"]] == ["sort"]
    assert gt["user_turns"][2][0]["content"].startswith("I have updated some more functions")


def test_ground_truth_scores_one_in_every_category(bfcl_rows, tooltalk_rows):
    rows = by_category(bfcl_rows, 3) + tooltalk_rows[:3] + tooltalk_rows[-2:]
    results = run_episodes(BFCLEnvironment(), TurnScript(), rows[:12]) + \
        run_episodes(ToolTalkEnvironment(), TurnScript(), rows[12:])
    assert [(r.uuid, r.grade.reward, r.finish) for r in results] == [(r["uuid"], 1.0, "finished") for r in rows]


@pytest.mark.slow
def test_ground_truth_scores_one_on_every_row(bfcl_rows, tooltalk_rows):
    for env, rows in ((BFCLEnvironment(), bfcl_rows), (ToolTalkEnvironment(), tooltalk_rows)):
        failed = [(r.uuid, r.grade.reason) for r in run_episodes(env, TurnScript(), rows) if r.grade.reward != 1.0]
        assert failed == []


def _first_turn(edit):
    return edited(lambda turns: [edit(turns[0]), *turns[1:]])


@pytest.mark.parametrize("name,policy,why", [
    ("wrong order", _first_turn(lambda calls: [calls[0], calls[2], calls[1]]), "state differs"),  # mv before mkdir
    ("missing call", _first_turn(lambda calls: calls[:2]), "state differs"),
    ("extra write", _first_turn(lambda calls: [*calls, ("touch", {"file_name": "notes.txt"})]), "state differs"),
    ("missing read", edited(lambda turns: [turns[0], [c for c in turns[1] if c[0] != "grep"], *turns[2:]]),
     "result(s) missing"),
])
def test_bfcl_edits_of_the_ground_truth_score_zero(bfcl_rows, name, policy, why):
    base = row(bfcl_rows, "multi_turn_base_0")
    assert [c[0] for c in truth_turns(base)[0]] == ["cd", "mkdir", "mv"]
    (res,) = run_episodes(BFCLEnvironment(), policy, [base])
    assert res.grade.reward == 0.0 and why in res.grade.reason, (name, res.grade.reason)


def test_bfcl_call_where_the_ground_truth_makes_none_scores_zero(bfcl_rows):
    """miss_param: the user left a parameter out; the ground truth asks instead of calling."""
    r = next(x for x in bfcl_rows if x["metadata"]["category"] == "multi_turn_miss_param"
             and any(not t for t in json.loads(x["ground_truth"])["turns"]))
    empty = next(i for i, t in enumerate(json.loads(r["ground_truth"])["turns"]) if not t)
    guess = truth_turns(r)[empty + 1][:1]  # acts on the turn before the user gave the parameter
    policy = edited(lambda turns: [*turns[:empty], guess, *turns[empty + 1:]])
    (res,) = run_episodes(BFCLEnvironment(), policy, [r])
    assert res.grade.reward == 0.0 and "where the ground truth makes none" in res.grade.reason


def test_tooltalk_edits_score_zero(tooltalk_rows):
    """A missing call lowers ToolTalk's recall; a second successful write is a bad action (and a
    different database)."""
    writes = ("SendMessage", "SendEmail", "AddAlarm", "AddReminder", "CreateEvent")
    convo = next(r for r in tooltalk_rows if any(c[0] in writes for t in truth_turns(r) for c in t))
    at = next(i for i, t in enumerate(truth_turns(convo)) if any(c[0] in writes for c in t))
    missing = edited(lambda turns: [t[:-1] if i == at else t for i, t in enumerate(turns)])
    extra = edited(lambda turns: [t + [c for c in t if c[0] in writes][:1] if i == at else t
                                  for i, t in enumerate(turns)])
    res = run_episodes(ToolTalkEnvironment(), missing, [convo]) + run_episodes(ToolTalkEnvironment(), extra, [convo])
    assert [r.grade.reward for r in res] == [0.0, 0.0]
    assert "recall" in res[0].grade.reason
    assert res[1].grade.details["bad_actions"] == 1 and res[1].grade.details["database_differences"]


def test_tooltalk_free_text_is_compared_lexically(tooltalk_rows):
    """Free text at ToolTalk's thresholds: contractions are the same words; reordered words, other words
    or a negation fail (red-team finding: a bag of words paid "I have NOT changed ...")."""
    from validators.tools.tooltalk_utils import semantic_str_compare

    assert semantic_str_compare("I'll see you at noon tomorrow", "I will see you at noon tomorrow") == 1.0
    assert semantic_str_compare("meeting cancelled", "lunch is at noon") < 0.8
    assert semantic_str_compare("tomorrow noon at you see", "see you at noon tomorrow") < 0.8  # order counts
    assert semantic_str_compare("I have NOT changed my number. Please do not update your records.",
                                "I've changed my number. Please update your records.") == 0.0  # negation
    assert semantic_str_compare(None, "x") == 0.0


def test_tooltalk_databases_compare_free_text_fields_only_loosely(monkeypatch):
    """The database check: a message body reworded within ToolTalk's threshold is the same record; a start
    time one hour off, or a different receiver, is not (only free-text fields compare by similarity)."""
    import sys

    from validators.tools import tooltalk_utils, tooltalk_world

    monkeypatch.setitem(sys.modules, "tooltalk.apis.utils", tooltalk_utils)  # as the sandbox registers it
    base = {"Calendar": {"u": {"e1": {"name": "Client Meeting", "start_time": "2023-09-12 08:00:00"}}},
            "Message": {"m1": {"receiver": "alice59", "message": "see you at the client meeting tomorrow"}}}
    reworded = json.loads(json.dumps(base))
    reworded["Message"]["m1"]["message"] = "see you tomorrow at the client meeting"
    assert tooltalk_world.same_database(base, reworded) == []
    late = json.loads(json.dumps(base))
    late["Calendar"]["u"]["e1"]["start_time"] = "2023-09-12 09:00:00"
    other = json.loads(json.dumps(base))
    other["Message"]["m1"]["receiver"] = "bob"
    assert tooltalk_world.same_database(base, late) == [["Calendar", "u"]]
    assert tooltalk_world.same_database(base, other) == [["Message", "m1"]]

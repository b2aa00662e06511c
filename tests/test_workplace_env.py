"""NVIDIA's workplace rows played on the workbench's tables (validators/tools/workplace.py), on the fixture
rows of tests/fixtures/nvidia and the tiny tables of tests/fixtures/workbench: the ground truth scores 1,
reads are free, case follows NeMo-Gym's rule, and doing nothing, an extra write or the wrong record score 0;
a row whose ground truth changes nothing pays nobody."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nvidia_fixtures import ingest, upstream_uuid
from tests.tool_policies import TurnScript, edited
from validators.episodes import is_episodic, run_episodes
from validators.tools.workplace import WORKBENCH_ENV, WorkplaceEnvironment

TABLES = Path(__file__).parent / "fixtures" / "workbench"
REPLY, EVENT, REFUSED = ("b7f2c9e4-1d3a-5e8b-9c6f-2a4d8e1f3b50", "b7f2c9e4-1d3a-5e8b-9c6f-2a4d8e1f3b51",
                         "0f6a4c1e-8b2d-5f3a-a7c9-1e2d3c4b5a62")


@pytest.fixture(scope="module")
def rows():
    out = {}
    for found, _ in ingest("rl").values():
        for row in found:
            if row["agent_ref"] == "workplace":
                out[upstream_uuid(row)] = row
    assert {REPLY, EVENT, REFUSED} <= set(out)
    return out


def play(policy, row):
    (res,) = run_episodes(WorkplaceEnvironment(str(TABLES)), policy, [row])
    return res


def test_workplace_rows_are_episodes_only_where_the_tables_are(monkeypatch):
    monkeypatch.delenv(WORKBENCH_ENV, raising=False)
    assert not is_episodic("workplace")  # graded from the calls (WorkplaceVerifier), as before
    monkeypatch.setenv(WORKBENCH_ENV, str(TABLES))
    assert is_episodic("workplace")
    monkeypatch.delenv(WORKBENCH_ENV)
    with pytest.raises(ValueError, match=WORKBENCH_ENV):
        WorkplaceEnvironment()


def test_the_ground_truth_scores_one_and_reads_are_free(rows):
    for uuid in (REPLY, EVENT):
        res = play(TurnScript(), rows[uuid])
        assert (res.grade.reward, res.finish) == (1.0, "finished"), res.grade.reason
    no_search = edited(lambda turns: [[c for c in turns[0] if c[0] != "email_search_emails"]])
    assert play(no_search, rows[REPLY]).grade.reward == 1.0


def test_case_follows_nemo_gyms_rule(rows):
    shouted = edited(lambda turns: [[(n, {**a, "event_name": a["event_name"].upper()}) for n, a in turns[0]]])
    assert play(shouted, rows[EVENT]).grade.reward == 1.0


@pytest.mark.parametrize("name,edit", [
    ("nothing", lambda turns: [[]]),
    ("extra write", lambda turns: [turns[0] + [("email_send_email", {"recipient": "aisha.chen@atlas.com",
                                                                      "subject": "hi", "body": "hello"})]]),
    ("wrong record", lambda turns: [[(n, {**a, "email_id": "00000055"} if "email_id" in a else a)
                                     for n, a in turns[0]]]),
    ("twice", lambda turns: [turns[0] + turns[0][-1:]]),
])
def test_edits_score_zero(rows, name, edit):
    res = play(edited(edit), rows[REPLY])
    assert res.grade.reward == 0.0 and "tables differ" in res.grade.reason, (name, res.grade.reason)


def test_a_ground_truth_that_changes_nothing_pays_nobody(rows):
    """MOPD's fixture row asks to move a task to list "Done", which the workbench refuses: NeMo-Gym pays
    any policy that writes nothing; here neither the ground truth nor doing nothing is paid."""
    gt = json.loads(rows[REFUSED]["ground_truth"])
    assert gt["calls"][0]["arguments"]["new_value"] == "Done"
    for policy in (TurnScript(), edited(lambda turns: [[]])):
        res = play(policy, rows[REFUSED])
        assert res.grade.reward == 0.0 and "change no table" in res.grade.reason

"""Attacks on the multi-turn tool environments: each scores 0 or ends the episode with a reason, and none
reaches the trainer's process (the backends run in the episode's sandbox)."""

from __future__ import annotations

import json
import os

import pytest

from tests.tool_policies import TurnScript, edited, tool_call, truth_turns
from tests.tool_rows import episode_rows
from validators.episodes import run_episodes
from validators.tools.bfcl import BFCLEnvironment
from validators.tools.environment import MAX_ERRORS
from validators.verifiers import sandbox


@pytest.fixture(scope="module")
def base0(sources_cache):
    rows, _ = episode_rows(sources_cache, "bfcl_multi_turn")
    return next(r for r in rows if r["uuid"] == "multi_turn_base_0")


class Replies:
    """A policy that answers every turn with ``reply(ep)``."""

    def __init__(self, reply):
        self.reply = reply

    def act(self, episodes):
        return [self.reply(ep) for ep in episodes]


def test_reaching_the_goal_state_without_the_users_answer_scores_zero(base0):
    """Turn 2 asks for a grep: the writes alone leave the same state, but the result the user asked for is missing."""
    (res,) = run_episodes(BFCLEnvironment(), edited(
        lambda turns: [turns[0], [c for c in turns[1] if c[0] != "grep"], *turns[2:]]), [base0])
    assert res.grade.reward == 0.0 and "missing" in res.grade.reason


def test_an_endless_tool_loop_ends_the_episode(base0):
    (res,) = run_episodes(BFCLEnvironment({"max_steps_per_turn": 5}), Replies(lambda ep: tool_call("ls", {})), [base0])
    assert (res.finish, res.grade.reward, res.steps) == ("max_steps", 0.0, 5)


def test_calls_of_tools_that_do_not_exist_or_are_private_are_errors_to_the_model(base0):
    bad = ["os.system", "__import__", "_load_scenario", "eval", "__class__", "sort_by_magic"]
    env = BFCLEnvironment()
    ep = env.reset(base0)
    try:
        out = env.step(ep, "".join(tool_call(n, {"command": "id"}) for n in bad) + '<tool_call>{"name": 3}</tool_call>')
        assert out[0]["content"].startswith("error: ") and "Call a tool with <tool_call>" in out[0]["content"]
        assert sum(m["content"].startswith("error: unknown tool") for m in out) == MAX_ERRORS  # the rest counted
        assert not ep.done and ep.session.request("compare")["equal"]  # nothing ran
    finally:
        env.close(ep)


def test_huge_tool_outputs_are_cut(base0):
    big = "x" * 300_000
    calls = [("touch", {"file_name": "big.txt"}), ("echo", {"content": big, "file_name": "big.txt"}),
             ("cat", {"file_name": "big.txt"})]
    env = BFCLEnvironment({"max_output_chars": 1000})
    ep = env.reset(base0)
    try:
        out = env.step(ep, "".join(tool_call(n, a) for n, a in calls))
        assert len(out) == 3 and all(len(m["content"]) < 1200 for m in out) and "characters cut" in out[2]["content"]
    finally:
        env.close(ep)


FAKE_BACKEND = '''
import os, socket, time

class MathAPI:
    def read_host(self, path):
        return open(path).read()[:100]

    def connect(self, host):
        s = socket.create_connection((host, 80), timeout=2)
        return "connected"

    def environ(self):
        return sorted(os.environ)

    def spin(self, seconds):
        time.sleep(seconds)
        return "done"

    def leave(self):
        os._exit(3)
'''


@pytest.fixture
def fake(tmp_path):
    backend = tmp_path / "pkg" / "backend"
    backend.mkdir(parents=True)
    (backend / "math_api.py").write_text(FAKE_BACKEND)
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
             for n in ("read_host", "connect", "environ", "spin", "leave")]
    row = {"uuid": "fake", "agent_ref": "bfcl_multi_turn",
           "responses_create_params": {"input": [{"role": "user", "content": "hi"}], "tools": json.dumps(tools)},
           "ground_truth": json.dumps({"turns": [[]], "user_turns": [], "initial_config": {},
                                       "involved_classes": ["MathAPI"], "backend": "pkg/backend"})}
    return row, str(tmp_path)


def test_backend_code_runs_in_the_sandbox_not_the_trainer(fake):
    row, root = fake
    if sandbox.isolation() != "bwrap":
        pytest.skip("bubblewrap is not available here")
    env = BFCLEnvironment({"sources_root": root})
    ep = env.reset(row)
    try:
        secret = os.path.abspath(__file__)
        out = env.step(ep, tool_call("read_host", {"path": secret}) + tool_call("connect", {"host": "1.1.1.1"})
                       + tool_call("environ", {}))
        assert "No such file" in out[0]["content"]  # the repository is not mounted
        assert "Error during execution" in out[1]["content"]  # no network namespace route
        seen = set(json.loads(out[2]["content"].replace("'", '"')))  # the scrubbed environment, nothing of ours
        assert seen <= {"HOME", "LANG", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE"}
    finally:
        env.close(ep)


def test_a_slow_or_dying_backend_ends_the_episode_with_a_reason(fake):
    row, root = fake
    env = BFCLEnvironment({"sources_root": root, "call_timeout_s": 1.0})
    for call, reason in ((tool_call("spin", {"seconds": 30}), "tool_timeout"), (tool_call("leave", {}), "tool_crashed")):
        (res,) = run_episodes(env, Replies(lambda ep, c=call: c), [row])
        assert (res.finish, res.grade.reward) == (reason, 0.0)


def test_ground_truth_replay_is_deterministic(base0):
    """Two resets give the same state: the reward does not depend on which episode ran first."""
    a = run_episodes(BFCLEnvironment(), TurnScript(), [base0, base0])
    assert [r.grade.reward for r in a] == [1.0, 1.0] and truth_turns(base0)


@pytest.fixture(scope="module")
def tooltalk_rows(sources_cache):
    rows, _ = episode_rows(sources_cache, "tooltalk_episodes")
    return rows


def _edit_writes(api, field, value):

    return edited(lambda turns: [[(n, {**a, field: value(a[field])} if n == api else a) for n, a in t]
                                 for t in turns])


def test_tooltalk_messages_to_the_wrong_person_or_saying_the_opposite_score_zero(tooltalk_rows):
    """Red-team findings: ToolTalk's own SendMessage check compares the prediction's receiver with itself,
    and a bag-of-words similarity paid a negated e-mail body; both are refused here."""
    from tests.tool_policies import truth_turns
    from validators.tools.tooltalk import ToolTalkEnvironment

    msg = next(r for r in tooltalk_rows if any(c[0] == "SendMessage" for t in truth_turns(r) for c in t))
    mail = next(r for r in tooltalk_rows if any(c[0] == "SendEmail" for t in truth_turns(r) for c in t))
    env = ToolTalkEnvironment()
    assert [r.grade.reward for r in run_episodes(env, TurnScript(), [msg, mail])] == [1.0, 1.0]
    wrong_person = _edit_writes("SendMessage", "receiver", lambda _: "attacker_account")
    opposite = _edit_writes("SendEmail", "body", lambda body: "I do not mean it: " + body + " Never mind.")
    res = run_episodes(env, wrong_person, [msg]) + run_episodes(env, opposite, [mail])
    assert [r.grade.reward for r in res] == [0.0, 0.0]


def test_a_turn_is_not_passed_by_a_call_of_an_absent_tool(base0, sources_cache):
    """Red-team finding: base_55's turn 3 asks for a ticket whose text an earlier call already returned; a
    call of a tool that does not exist no longer counts as the turn's call."""
    from tests.tool_policies import truth_turns

    rows, _ = episode_rows(sources_cache, "bfcl_multi_turn")
    row = next(r for r in rows if r["uuid"] == "multi_turn_base_55")
    bogus = [("fetch_it_please", {})]
    (res,) = run_episodes(BFCLEnvironment(), edited(lambda turns: [*turns[:3], bogus, *turns[4:]]), [row])
    assert res.grade.reward == 0.0 and "turn 3: no tool call" in res.grade.reason
    assert truth_turns(row)[3] == [("get_ticket", {"ticket_id": 2})]

"""SWE agent loop: the oracle policy earns reward 1 through the real loop, a no-op 0, a policy that
edits the tests is caught; tools stay in the sandbox; multi-turn token masks (MASK-01)."""

from __future__ import annotations

import json
import time

import pytest

from stages.policy import ModelPolicy
from tests.handed import handed_case
from tests.swe_policies import ScriptedPolicy, oracle_edit, tool_call
from tests.swe_rows import build_set
from validators.episodes import Trajectory, run_episodes
from validators.swe.environment import AgentConfig, SWEEnvironment
from validators.swe.workspace import run_tests


@pytest.fixture(scope="module")
def task_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("swe")
    return out, build_set(out)


def test_oracle_gets_1_noop_gets_0_through_the_real_loop(task_set):
    root, rows = task_set
    env = SWEEnvironment(root, AgentConfig(max_steps=4))
    oracle = run_episodes(env, ScriptedPolicy.oracle(env), rows)
    assert [r.grade.reward for r in oracle] == [1.0, 1.0]
    assert [r.finish for r in oracle] == ["submitted", "submitted"] and [r.steps for r in oracle] == [3, 3]
    assert "edited solution.py" in oracle[0].messages[3]["content"]  # the edit tool's reply
    assert "PASSED" in oracle[0].messages[5]["content"]              # run_tests after the fix
    noop = run_episodes(env, ScriptedPolicy.noop(), rows)
    assert [r.grade.reward for r in noop] == [0.0, 0.0]
    assert set(noop[0].grade.failing) == set(json.loads(rows[0]["ground_truth"])["FAIL_TO_PASS"])


def test_a_policy_that_edits_the_tests_is_caught(task_set):
    root, rows = task_set
    env = SWEEnvironment(root, AgentConfig(max_steps=4))
    cheat = ScriptedPolicy.test_editor()
    ep = env.reset(rows[0])
    try:
        while not ep.done:
            env.step(ep, cheat.act([ep])[0])
        gt = ep.task
        unguarded = run_tests(ep.workdir, gt["test_files"], gt["pythonpath"])  # what a naive grader would see
        assert all(unguarded.passed(t) for t in gt["FAIL_TO_PASS"] + gt["PASS_TO_PASS"])
        grade = env.grade(ep)
    finally:
        env.close(ep)
    assert grade.reward == 0.0 and grade.restored == ["conftest.py", "tests/test_solution.py"]
    assert set(grade.failing) == set(gt["FAIL_TO_PASS"])


def test_tools_stay_in_the_workspace_and_refuse_bad_edits(task_set):
    root, rows = task_set
    env = SWEEnvironment(root, AgentConfig(tool_timeout_s=3))
    ep = env.reset(rows[0])
    try:
        assert "outside the repository" in env.call(ep, "view_file", {"path": "../../../etc/passwd"})
        assert "occurs 0 times" in env.call(ep, "edit_file", {"path": "solution.py", "old_text": "nope", "new_text": "x"})
        assert "solution.py:" in env.call(ep, "search", {"pattern": "def "})
        assert env.call(ep, "run", {"command": "cat /etc/hostname /root/.bashrc 2>&1; id -u"}).rstrip().endswith("65534")
        assert env.call(ep, "nope", {}).startswith("unknown tool 'nope'")
    finally:
        env.close(ep)


def test_commands_that_never_end_are_killed_at_the_tool_wall_clock(task_set):
    """CODE-01, applied to the agent's ``run`` tool: busy loops, ignored alarms and swallowed
    interrupts all end at the wall clock; the episode goes on."""
    case = handed_case("CODE-01")
    root, rows = task_set
    env = SWEEnvironment(root, AgentConfig(tool_timeout_s=2))
    ep = env.reset(rows[0])
    try:
        for name, program in case["input"]["solutions"].items():
            if name == "correct":
                continue
            t0 = time.monotonic()
            stdin = case["input"]["tests"][0]["stdin"]
            out = env.call(ep, "run", {"command": f"cat > p.py <<'EOF'\n{program}EOF\necho {stdin.strip()} | python3 p.py"})
            assert out.startswith("[timeout") and time.monotonic() - t0 < case["expected"]["each_call_returns_within_s"]
        assert env.call(ep, "run", {"command": "echo 3 | python3 -c 'print(int(input()) * 2)'"}).strip() == "6"
    finally:
        env.close(ep)


def test_oracle_edit_is_unique_and_minimal():
    original = "a = 1\nb = 1\nc = a + b\n"
    buggy = "a = 1\nb = 1\nc = a - b\n"
    assert oracle_edit(original, buggy) == ("c = a - b\n", "c = a + b\n")
    assert oracle_edit("x = 1\ny = 2\nx = 1\n", "x = 1\ny = 3\nx = 1\n") == ("y = 3\n", "y = 2\n")
    # the buggy line occurs twice: widened by one line of context until unique
    assert oracle_edit("x = 2\ny\nx = 1\n", "x = 2\ny\nx = 2\n") == ("y\nx = 2\n", "y\nx = 1\n")


def test_multi_turn_mask_trains_only_model_tokens(smollm2_dir):
    """MASK-01 for multi-turn episodes: the model's tokens (end-of-turn included) are trained, the
    rendered user/tool turns and assistant headers never; ids equal the template's own rendering."""
    from transformers import AutoTokenizer

    case = handed_case("MASK-01")
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    msgs = case["input"]["messages"]
    policy = ModelPolicy(engine=None, tokenizer=tok, builder=None)
    traj = Trajectory(tok.apply_chat_template(msgs[:1], add_generation_prompt=True, tokenize=True, return_dict=False))
    traj.extend(tok(msgs[1]["content"] + tok.eos_token, add_special_tokens=False)["input_ids"], trained=True)
    traj.extend(policy.observation_ids(msgs[:2], msgs[2:3], None), trained=False)
    traj.extend(tok(msgs[3]["content"] + tok.eos_token, add_special_tokens=False)["input_ids"], trained=True)
    assert traj.full_ids == tok.apply_chat_template(msgs, tokenize=True, return_dict=False)[:len(traj.full_ids)]
    spans, cur = [], []
    for t, m in zip(traj.ids, traj.loss_mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            spans, cur = spans + [cur], []
    spans.append(cur)
    assert [tok.decode(s) for s in spans] == case["expected"]["supervised_text_spans"]
    masked = tok.decode([t for t, m in zip(traj.ids, traj.loss_mask) if not m])
    assert "<|im_start|>user\nBye" in masked and masked.endswith("<|im_start|>assistant\n")
    assert 0 < sum(traj.loss_mask) < len(traj.loss_mask)


def test_tool_call_blocks_are_what_the_agent_parses():
    from validators.verifiers.tool_call import parse_calls

    text = "I will look.\n" + tool_call("view_file", path="solution.py", start_line=1)
    assert parse_calls(text) == ([("view_file", {"path": "solution.py", "start_line": 1})], [])

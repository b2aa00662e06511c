"""Registry and batch runner, pass@k (FILTER-01), structured output, long context and GenRM parsing."""

from __future__ import annotations

import json
import time

import pytest

from tests.handed import handed_case
from validators.verifiers import (
    Verdict,
    VerifierPool,
    check_row,
    get_verifier,
    pass_at_k,
    verify,
    verify_batch,
)
from validators.verifiers.genrm import (
    GenRMParseError,
    group_rewards,
    pair_indices,
    parse_judgement,
)


def test_filter_01_pass_at_k_is_unbiased_and_never_one_without_a_pass():
    case = handed_case("FILTER-01")
    ks = case["input"]["pass_at_k"]
    assert pass_at_k(**ks[0]) == 0.0                                    # c == 0 with k > n
    assert [pass_at_k(**x) for x in ks[1:]] == pytest.approx([1.0, 0.3, 1 - 21 / 252])
    results = case["input"]["filter"]["results"]
    rates = {p: pass_at_k(len(r), sum(r), 1) for p, r in results.items()}
    assert rates == pytest.approx(case["expected"]["pass_rate"])
    assert sorted(p for p, r in rates.items() if 0 < r < 1) == case["expected"]["kept"]
    assert pass_at_k(4, 1, 9) == 1.0                                    # k > n: every sample drawn
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_registry_errors_name_the_row_and_the_known_verifiers():
    with pytest.raises(KeyError, match="installed: bfcl_multi_turn, code, genrm, instruction_following"):
        get_verifier("nope")
    with pytest.raises(ValueError, match="row 'r1': no verifier 'nope'"):
        check_row({"uuid": "r1", "agent_ref": "nope"})
    with pytest.raises(ValueError, match="row 'r2': ground_truth is not valid JSON"):
        check_row({"uuid": "r2", "agent_ref": "math", "ground_truth": "{oops"})
    with pytest.raises(ValueError, match=r"reward 1.5 outside \[0, 1\]"):
        Verdict(1.5, True, "x")


def test_verify_batch_one_verdict_each_in_order_with_crash_and_timeout_isolated():
    math = {"uuid": "m", "agent_ref": "math", "ground_truth": json.dumps({"answer": "2"})}
    slow_code = {"uuid": "c", "agent_ref": "code",
                 "ground_truth": json.dumps({"mode": "assert", "tests": ["assert True"], "timeout_s": 60})}
    responses = [r"\boxed{2}", r"\boxed{3}", "```python\nwhile True: pass\n```", "x", r"\boxed{2}"]
    rows = [math, math, slow_code, {"uuid": "u", "agent_ref": "nope"}, math]
    start = time.monotonic()
    out = verify_batch(responses, rows, timeout_s=3, workers=2)
    assert time.monotonic() - start < 30
    assert [v.reward for v in out] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert out[2].reason == "timeout after 3s"
    assert out[3].reason.startswith("UnknownPlugin") and out[3].error == "unknown_verifier"  # no silent 0
    with pytest.raises(ValueError, match="2 responses but 1 rows"):
        verify_batch(["a", "b"], [math])
    assert verify_batch([], []) == []


def test_verifier_pool_keeps_its_workers_replaces_a_hung_one_and_never_shares_them_with_a_fork():
    import multiprocessing
    import threading

    math = {"uuid": "m", "agent_ref": "math", "ground_truth": json.dumps({"answer": "2"})}
    hang = {"uuid": "c", "agent_ref": "code",
            "ground_truth": json.dumps({"mode": "assert", "tests": ["assert True"], "timeout_s": 60})}
    with VerifierPool(workers=2, timeout_s=3) as pool:
        assert [v.reward for v in pool.verify([r"\boxed{2}", r"\boxed{3}"], [math, math])] == [1.0, 0.0]
        pids = {w.proc.pid for w in pool._pool}
        assert [v.reward for v in pool.verify([r"\boxed{2}"] * 3, [math] * 3)] == [1.0] * 3
        assert {w.proc.pid for w in pool._pool} == pids  # started once
        out = pool.verify(["```python\nwhile True: pass\n```", r"\boxed{2}"], [hang, math])
        assert [v.reason for v in out][0] == "timeout after 3s" and out[1].reward == 1.0
        assert len({w.proc.pid for w in pool._pool} & pids) == 1  # the hung worker was replaced
        results = []

        def grade(a):
            results.append((a, pool.verify([rf"\boxed{{{a}}}"], [math])[0].reward))
        threads = [threading.Thread(target=grade, args=(a,)) for a in (1, 2, 3, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [(1, 0.0), (2, 1.0), (2, 1.0), (3, 0.0)]
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_verify_in_child, args=(pool, math, queue))
        child.start()
        child_pids, reward = queue.get(timeout=120)
        child.join()
        assert reward == 1.0 and not child_pids & {w.proc.pid for w in pool._pool}
        assert pool.verify([r"\boxed{2}"], [math])[0].reward == 1.0  # the parent's workers still answer
    assert pool._pool == []


def _verify_in_child(pool, row, queue):
    reward = pool.verify([r"\boxed{2}"], [row])[0].reward
    queue.put(({w.proc.pid for w in pool._pool}, reward))
    pool.close()


def _so_row(schema, **meta):
    return {"uuid": "s", "agent_ref": "structured_output", "ground_truth": json.dumps({"schema": schema}),
            "metadata": json.dumps(meta)}


def test_structured_output_schema_and_fence_policy():
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}},
              "additionalProperties": False}
    row = _so_row(schema)
    assert verify('{"a": 1}', row).reward == 1.0
    assert verify('```json\n{"a": 1}\n```', row).reward == 1.0
    assert verify('```json\n{"a": 1}\n```', _so_row(schema, fenced="reject")).reward == 0.0
    assert verify('Here: {"a": 1}', row).reward == 0.0
    bad = verify('{"a": "1", "b": 2}', row)
    assert bad.reward == 0.0 and bad.reason.startswith("schema violation")
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        check_row(_so_row({"type": "objekt"}))


def test_long_context_normalized_exact_match():
    row = {"uuid": "l", "agent_ref": "long_context", "ground_truth": json.dumps({"answers": ["The Eiffel Tower"]})}
    assert verify("eiffel tower.", row).reward == 1.0
    assert verify("It is the Eiffel Tower", row).reward == 0.0
    multi = dict(row, ground_truth=json.dumps({"answers": ["5859107", "42"], "match": "all"}))
    assert verify(r"\boxed{42, 5859107}", multi).reward == 1.0
    half = verify("5859107", multi)
    assert (half.reward, half.passed, half.details["overlap"]) == (0.0, False, 0.5)  # binary: a share would pay padding


def test_genrm_parsing_pairing_and_rewards():
    judge = ("<think>compare</think>[The Begin of Individual Scores]\n\\boxed{4, 2}\n[The End of Individual Scores]\n"
             "[The Begin of Ranking Score]\n\\boxed{2}\n[The End of Ranking Score]")
    assert parse_judgement(judge) == parse_judgement(r"Scores \boxed{4, 2} then \boxed{2}")
    assert parse_judgement(judge).score_1 == 4
    for bad in [r"\boxed{4, 9} \boxed{2}", r"\boxed{4, 2}", r"\boxed{4.5, 2} \boxed{1}", "<think>\\boxed{4, 2}"]:
        with pytest.raises(GenRMParseError):
            parse_judgement(bad)
    assert pair_indices(3, "circular") == [(0, 1), (1, 2), (2, 0)]
    assert pair_indices(3, "all_pairs") == [(0, 1), (0, 2), (1, 2)]
    tie = r"\boxed{3, 3} \boxed{5}"                                      # tie broken towards response 2
    out = group_rewards(3, [(0, 1), (1, 2), (2, 0)], [r"\boxed{5, 1} \boxed{1}", tie, "garbage"])
    # tie-break b = (3.5 - 5)/5 = -0.3: response 1 of the pair gets 2.7, response 2 gets 3.3
    # r0 = (5 - .5)/5 = .9 ; r1 = (mean(1, 2.7) - .5)/5 = .27 ; r2 = (3.3 - .5)/5 = .56
    assert out.rewards == pytest.approx([0.9, 0.27, 0.56])
    assert out.malformed == [((2, 0), "no \\boxed{s1, s2} scores")] and out.n_judged == [1, 2, 1]
    lonely = group_rewards(3, [(0, 1), (2, 0)], [r"\boxed{5, 1} \boxed{1}", "garbage"])
    assert lonely.unjudged == [2] and lonely.rewards[2] == pytest.approx((0.9 + 0.1) / 2)
    row = {"uuid": "g", "agent_ref": "genrm", "responses_create_params": {"input": [{"role": "user", "content": "hi"}]}}
    check_row(row)
    with pytest.raises(ValueError, match="scored per group by a judge"):
        verify("an answer", row)


def test_one_callers_slow_answer_never_holds_another_callers_answers():
    """Issue #33: a hung answer holds one worker to its own timeout; another caller's answers get a
    worker of their own (``BURST_AFTER_S`` later) instead of waiting behind it. Workers' address
    space is capped."""
    import threading

    math = {"uuid": "m", "agent_ref": "math", "ground_truth": json.dumps({"answer": "2"})}
    hang = {"uuid": "c", "agent_ref": "code",
            "ground_truth": json.dumps({"mode": "assert", "tests": ["assert True"], "timeout_s": 60})}
    with VerifierPool(workers=1, timeout_s=20, memory_bytes=3 << 30) as pool:
        assert pool.verify([r"\boxed{2}"], [math])[0].reward == 1.0  # warm: the worker is up
        (worker,) = pool._pool
        limits = open(f"/proc/{worker.proc.pid}/limits").read()
        assert f"Max address space         {3 << 30}" in limits
        slow: list = []
        caller_a = threading.Thread(target=lambda: slow.extend(pool.verify(["```python\nwhile True: pass\n```"], [hang])))
        caller_a.start()
        time.sleep(0.3)
        start = time.monotonic()
        out = pool.verify([r"\boxed{2}", r"\boxed{3}"], [math, math])
        waited = time.monotonic() - start
        assert [v.reward for v in out] == [1.0, 0.0] and waited < 12, waited
        assert caller_a.is_alive()  # the hung answer is still on its own clock
        caller_a.join()
        assert slow[0].reason == "timeout after 20s"

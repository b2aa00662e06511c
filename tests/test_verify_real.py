"""Verifiers on real data: reference solutions and ground truths must pass their own verifiers.

Default suite: small real subsets (fast). ``-m slow``: the full sets the issue names — all 164
HumanEval canonical solutions, >= 499/500 MBPP reference solutions, >= 480/500 MATH-500 reference
solutions, the IF verifier on every IFEval and IFBench prompt, every BFCL ground truth.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.verifiers import (
    SOURCES_CACHE,
    bfcl_response,
    humaneval_cases,
    math500_cases,
    mbpp_cases,
    real_rows,
)
from validators.verifiers import check_row, verify, verify_batch


@pytest.fixture(scope="module", autouse=True)
def _sources(sources_cache: Path) -> None:
    """Make sure the fetched sources exist (conftest fetches what is missing) where the builders read them."""
    assert sources_cache.resolve() == Path(SOURCES_CACHE)


def _passed(cases, workers=2, timeout_s=30.0) -> tuple[int, list]:
    verdicts = verify_batch([c[0] for c in cases], [c[1] for c in cases], timeout_s=timeout_s, workers=workers)
    failed = [(json.loads(c[1]["metadata"]), v.reason) for c, v in zip(cases, verdicts) if not v.passed]
    return len(cases) - len(failed), failed


def test_real_subsets_pass_their_verifiers():
    """Every 20th item of each real set, through the batch runner (fast)."""
    cases = humaneval_cases()[::20] + mbpp_cases()[::25] + math500_cases()[::25]
    n_ok, failed = _passed(cases)
    assert n_ok == len(cases), failed[:5]


def _split_checked(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """(rows :func:`check_row` accepts, the error messages of those it refuses)."""
    accepted, rejected = [], []
    for row in rows:
        try:
            check_row(row)
        except ValueError as exc:
            rejected.append(str(exc))
            continue
        accepted.append(row)
    return accepted, rejected


def test_bfcl_ground_truths_pass_their_own_checker():
    rows = real_rows("bfcl")
    accepted, rejected = _split_checked(rows)
    failed = []
    for row in accepted:
        if not verify(bfcl_response(row), row).passed:
            failed.append(json.loads(row["metadata"])["id"])
    assert len(rows) == 3475 and failed == []
    # two live_simple items list an argument with no acceptable value: unsatisfiable, refused at build time
    assert len(rejected) == 2 and all("no acceptable value" in r for r in rejected)


def test_if_verifier_runs_on_every_ifeval_and_ifbench_prompt():
    for name, n, n_rejected in [("ifeval", 541, 2), ("ifbench_prompts", 294, 0)]:
        rows = real_rows(name)
        accepted, rejected = _split_checked(rows)
        for row in accepted:
            prompt = row["responses_create_params"]["input"][-1]["content"]
            for response in (prompt, "", "<think>x</think>A short answer. Done!"):
                assert verify(response, row).reward in (0.0, 1.0)
        # IFEval's two letter_frequency items targeting '#' and '!' (the reference substitutes a
        # random letter) are refused, never graded with a made-up letter
        assert (len(rows), len(rejected)) == (n, n_rejected), rejected
        assert all("letter must be one ASCII letter" in r for r in rejected)


@pytest.mark.slow
def test_all_humaneval_canonical_solutions_pass():
    n_ok, failed = _passed(humaneval_cases())
    assert n_ok == 164, failed


@pytest.mark.slow
def test_mbpp_reference_solutions_pass():
    n_ok, failed = _passed(mbpp_cases())
    assert n_ok >= 499, failed


@pytest.mark.slow
def test_math500_reference_solutions_verify():
    n_ok, failed = _passed(math500_cases())
    assert n_ok >= 480, failed[:20]

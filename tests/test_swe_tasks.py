"""SWE task builder: mutation operators, pytest outcome parsing, and tasks that pass before and
fail after the injected bug, from real MBPP problems and a real package (toolz)."""

from __future__ import annotations

import ast
import json
import random
import shutil

import pytest

from common.io import Rejects
from curation.params import MutantBudget
from curation.swe.mutate import KINDS, mutants
from curation.swe.repos import (
    humaneval_repo,
    load_repositories,
    mbpp_repo,
    package_repo,
)
from curation.swe.tasks import build_repo_tasks, gold_patch, problem_statement
from tests.swe_rows import mbpp_rows
from validators.swe.workspace import copy_repo, parse_pytest_summary, run_tests, tempdir

SRC = '''def f(xs, n):
    """Sum of doubled items below n."""
    total = 0
    for i in range(len(xs)):
        if xs[i] < n and i != 3:
            total += xs[i] * 2
        if xs[i] is None:
            continue
    return total - 1
'''


def test_mutants_cover_every_kind_and_change_one_site():
    ms = mutants(SRC)
    assert {m.kind for m in ms} == set(KINDS)
    by_desc = {m.description: m for m in ms}
    assert "    return total - 1\n" in SRC
    assert "    return None\n" in by_desc["return total - 1 -> return None"].source
    assert "if xs[i] <= n and i != 3:" in by_desc["< -> <="].source          # off-by-one in a comparison
    assert "if xs[i] < n or i != 3:" in by_desc["and -> or"].source           # boolean operator swap
    assert "total += xs[i] * 3" in by_desc["2 -> 3"].source                   # off-by-one in a literal
    removed = [m for m in ms if m.kind == "removed_branch"]
    assert sorted(m.line for m in removed) == [5, 7]
    assert "is None" not in next(m for m in removed if m.line == 7).source
    for m in ms:
        ast.parse(m.source)
        diff = gold_patch("f.py", m.source, SRC)
        assert diff.count("\n@@") + diff.startswith("@@") <= 1 and diff  # one hunk, never empty


def test_pytest_summary_keeps_the_worst_outcome_per_test():
    out = ("PASSED tests/t.py::test_a\nPASSED tests/t.py::C::test_b\nERROR tests/t.py::C::test_b - boom\n"
           "FAILED tests/t.py::test_c - assert 1 == 2\nSKIPPED [1] tests/t.py:9: no\n")
    assert parse_pytest_summary(out) == {"tests/t.py::test_a": "PASSED", "tests/t.py::C::test_b": "ERROR",
                                         "tests/t.py::test_c": "FAILED"}


def _assert_task_invariant(row, repo, tmp_path):
    """Re-run the tests on the original and on the buggy code: FAIL_TO_PASS + PASS_TO_PASS pass on
    the original, every FAIL_TO_PASS fails on the buggy version."""
    gt = json.loads(row["ground_truth"])
    root = tempdir("cascade-test-")
    clean = copy_repo(tmp_path / "repos" / repo.name, root / "clean")
    buggy = copy_repo(clean, root / "buggy", gt["bug"])
    before = run_tests(clean, gt["test_files"], gt["pythonpath"])
    after = run_tests(buggy, gt["test_files"], gt["pythonpath"])
    shutil.rmtree(root)
    assert gt["FAIL_TO_PASS"] and all(before.passed(t) for t in gt["FAIL_TO_PASS"] + gt["PASS_TO_PASS"])
    assert not any(after.passed(t) for t in gt["FAIL_TO_PASS"])
    assert all(after.passed(t) for t in gt["PASS_TO_PASS"])


def test_mbpp_tiny_repository_gives_a_task_that_fails_only_with_the_bug(tmp_path):
    repo = mbpp_repo(*mbpp_rows(13))
    assert repo.files["tests/test_solution.py"].count("def test_") == 2
    rejects = Rejects("swe_tasks")
    rows, stats = build_repo_tasks(repo, MutantBudget(mutants_per_repo=6, tasks_per_repo=1), random.Random(0),
                                   rejects, tmp_path / "repos", 60.0)
    assert len(rows) == 1 and stats["candidates"] == 1 + len(rejects)
    row = rows[0]
    gt = json.loads(row["ground_truth"])
    assert row["domain"] == "swe" and row["agent_ref"] == "swe" and gt["repo"] == "mbpp-13"
    statement = row["responses_create_params"]["input"][1]["content"]
    assert all(t in statement for t in gt["FAIL_TO_PASS"]) and "FAILURES" in statement
    assert gt["patch"].startswith("--- a/solution.py\n+++ b/solution.py\n")
    _assert_task_invariant(row, repo, tmp_path)


def test_baseline_failure_and_equivalent_mutants_are_rejected_with_reasons(tmp_path):
    problem, solution = mbpp_rows(11)
    broken = {**solution, "messages": solution["messages"].replace("return s", "return s[::-1]")}
    rejects = Rejects("swe_tasks")
    rows, _ = build_repo_tasks(mbpp_repo(problem, broken), MutantBudget(mutants_per_repo=3, tasks_per_repo=1),
                               random.Random(0), rejects, tmp_path / "repos", 60.0)
    assert rows == [] and rejects.by_reason() == {"baseline_fails": 1}
    # a module-level constant nothing reads: its off-by-one mutant is equivalent, the others are noticed
    repo = mbpp_repo(problem, solution)
    repo.files["solution.py"] = ("LIMIT = 0\n\ndef remove_Occ(s, ch):\n"
                                 "    return s.replace(ch, '', 1)[::-1].replace(ch, '', 1)[::-1]\n")
    rejects = Rejects("swe_tasks")
    rows, stats = build_repo_tasks(repo, MutantBudget(mutants_per_repo=10, tasks_per_repo=10), random.Random(0), rejects,
                                   tmp_path / "repos2", 60.0)
    reasons = [r["reason"] for r in rejects.rows]
    assert "equivalent_mutant: no test notices 0 -> 1" in reasons
    assert len(rows) + len(rejects) == stats["mutants"] and {json.loads(r["ground_truth"])["mutation"]["kind"]
                                                             for r in rows} >= {"wrong_return"}


def test_humaneval_layout_runs_check_as_one_test():
    row = {"uuid": "h0", "source": "humaneval", "source_version": "1.0.3", "license": "MIT",
           "ground_truth": json.dumps({"prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n", "entry_point": "add",
                                       "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}),
           "metadata": json.dumps({"task_id": "HumanEval/99", "canonical_solution": "    return a + b\n"})}
    repo = humaneval_repo(row)
    assert repo.name == "humaneval-99" and "check(add)" in repo.files["tests/test_solution.py"]
    with pytest.raises(ValueError, match="'h1'"):
        humaneval_repo({**row, "uuid": "h1", "metadata": "{}"})


def test_registered_package_toolz_gives_real_multi_file_tasks(tmp_path):
    from tests.conftest import REPO

    (spec,) = [s for s in load_repositories() if s.name == "toolz"]
    spec = spec.model_copy(update={"source_files": ["toolz/dicttoolz.py"],
                                   "test_files": ["toolz/tests/test_dicttoolz.py"]})
    repo = package_repo(spec, REPO / "data" / "cache" / "swe_sources")
    assert len(repo.files) > 20 and "toolz/tests/test_dicttoolz.py" in repo.files
    rejects = Rejects("swe_tasks")
    rows, stats = build_repo_tasks(repo, MutantBudget(mutants_per_repo=4, tasks_per_repo=1), random.Random(3),
                                   rejects, tmp_path / "repos", 60.0)
    assert stats["mutants"] == 35 and len(rows) == 1  # 35 single-site mutants of dicttoolz.py
    gt = json.loads(rows[0]["ground_truth"])
    assert gt["mutation"]["file"] == "toolz/dicttoolz.py" and len(gt["PASS_TO_PASS"]) > 10
    assert rows[0]["license"] == "BSD-3-Clause"
    _assert_task_invariant(rows[0], repo, tmp_path)


def test_problem_statement_never_shows_the_injected_change():
    out = ("=================================== FAILURES ===================================\n"
           "____ test_0 ____\nE   assert None == 3\n"
           "=========================== short test summary info ============================\n"
           "FAILED tests/test_solution.py::test_0 - assert None == 3\n")
    text = problem_statement(["tests/test_solution.py::test_0"], out)
    assert "assert None == 3" in text and "short test summary" not in text and "return" not in text


def test_registry_sections_name_the_bad_entry_and_field(tmp_path):
    from corpora.registry import load_models

    bad = tmp_path / "sources.yaml"
    bad.write_text("models:\n  - {name: tok, kind: npm, version: 1.0.0}\n"
                   "repositories:\n  - {name: toolz, package: toolz}\n")
    with pytest.raises(ValueError, match=r"models entry 'tok': package: Field required"):
        load_models(bad)
    with pytest.raises(ValueError, match=r"repositories entry 'toolz': kind: Field required"):
        load_repositories(bad)

"""SWE task builder: real bug-fix tasks made offline from repositories whose tests run here.

For each repository (:mod:`curation.swe.repos`):

1. run its test suite in the sandbox; a repository where any test fails or none runs is rejected
   (``baseline_fails``, ``no_tests``);
2. enumerate single-site mutants of its source files (:func:`curation.swe.mutate.mutants`),
   shuffle them (seeded) and try up to ``mutants_per_repo``;
3. run the tests on each mutant; keep it as a task when some test that passed before now fails
   (``FAIL_TO_PASS``; the rest of the passing tests is ``PASS_TO_PASS``), else reject it
   (``equivalent_mutant``; ``test_timeout`` when the run hit the wall clock), up to
   ``tasks_per_repo`` tasks;
4. write the problem statement from the failing tests' pytest output (test names and failure
   report, never the injected change).

The invariant of every task (tests pass on the original code, some fail on the buggy one) is
checked by :func:`check_task` before a task is kept. Tasks are canonical RL rows (domain ``swe``,
``agent_ref`` ``swe``) whose ``ground_truth`` follows SWE-Gym's field names (``instance_id``,
``repo``, ``patch``: the gold fix as a unified diff, ``FAIL_TO_PASS``, ``PASS_TO_PASS``) plus
what an offline episode needs: ``snapshot`` (the clean repository under ``repos/``, relative to
the task set's directory), ``bug`` (``{path: buggy file text}``), ``test_files``, ``pythonpath``
and the ``mutation``.
"""

from __future__ import annotations

import difflib
import random
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from common.io import Rejects, atomic_dir, finish_step, write_parquet
from corpora.schema import SCHEMAS, row_uuid, validate_row
from curation.swe.mutate import Mutant, mutants
from curation.swe.repos import (
    Repo,
    humaneval_repo,
    load_repositories,
    mbpp_repo,
    package_repo,
)
from validators.swe.workspace import TestRun, copy_repo, run_tests, tempdir

if TYPE_CHECKING:
    from curation.params import MutantBudget, SWETasksParams

STATEMENT_CHARS = 2500
_SECTION = re.compile(r"^=+ (FAILURES|ERRORS) =+$", re.MULTILINE)
_SECTION_END = re.compile(r"^=+ (PASSES|short test summary info|warnings summary)", re.MULTILINE)


def failure_report(output: str, limit: int = STATEMENT_CHARS) -> str:
    """The FAILURES / ERRORS sections of a pytest ``-rA`` output, cut to ``limit`` characters."""
    start = _SECTION.search(output)
    if not start:
        return output[-limit:]
    end = _SECTION_END.search(output, start.end())
    body = output[start.start():end.start() if end else len(output)].strip()
    return body if len(body) <= limit else body[:limit] + "\n... (output cut)"


def problem_statement(failing: list[str], output: str) -> str:
    """The issue text of a task: which tests fail and their failure report."""
    names = "\n".join(f"- {t}" for t in failing)
    return (f"The test suite of this repository fails: {len(failing)} test(s) that should pass do not.\n"
            f"{names}\n\nFix the bug in the source code (the tests are correct and will be restored "
            f"before grading).\n\npytest output:\n```\n{failure_report(output)}\n```")


def gold_patch(path: str, buggy: str, original: str) -> str:
    """The fix as a unified diff (``a/PATH`` -> ``b/PATH``), SWE-bench's ``patch`` field."""
    return "".join(difflib.unified_diff(buggy.splitlines(keepends=True), original.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))


def check_task(base: TestRun, buggy: TestRun, fail_to_pass: list[str], pass_to_pass: list[str]) -> None:
    """Assert a task's invariant: every FAIL_TO_PASS and PASS_TO_PASS test passed on the original
    code, FAIL_TO_PASS is not empty and none of it passes on the buggy code.

    Raises:
        AssertionError: naming the offending test.
    """
    assert fail_to_pass, "a task needs at least one FAIL_TO_PASS test"
    for t in fail_to_pass + pass_to_pass:
        assert base.passed(t), f"{t} does not pass on the original code"
    for t in fail_to_pass:
        assert not buggy.passed(t), f"FAIL_TO_PASS test {t} passes on the buggy code"


def _write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def build_repo_tasks(repo: Repo, budget: MutantBudget, rng: random.Random, rejects: Rejects, snapshots: Path,
                     test_timeout_s: float) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Tasks of one repository; rejected candidates go to ``rejects``. The clean repository is
    written to ``snapshots/<repo.name>`` when it yields a task.

    Args:
        budget: mutants tried and tasks kept (``swe_tasks.tiny`` or ``swe_tasks.package``).
        test_timeout_s: wall clock of one sandboxed pytest run.
    Returns:
        ``(rows, stats)``: canonical RL rows and ``{"candidates", "mutants", "test_runs", "test_s"}``.
    """
    stats = {"candidates": 0, "mutants": 0, "test_runs": 0, "test_s": 0.0}
    rows: list[dict[str, Any]] = []
    timeout = test_timeout_s
    tmp = tempdir("cascade-swe-")
    try:
        clean = tmp / "clean"
        _write_files(clean, repo.files)

        def test(files: dict[str, str] | None) -> TestRun:
            work = copy_repo(clean, tempdir("run-", tmp) / "repo", files)
            run = run_tests(work, repo.test_files, repo.pythonpath, timeout)
            stats["test_runs"] += 1
            stats["test_s"] += run.wall_s
            return run

        base = test(None)
        passed = sorted(t for t, o in base.outcomes.items() if o == "PASSED")
        reason = ("no_tests" if not passed else "baseline_fails" if base.failed or base.status == "timeout" else None)
        if reason:
            stats["candidates"] += 1
            rejects.add(repo.source, repo.name, f"{reason}: {', '.join(base.failed[:5]) or base.status}",
                        {"repo": repo.name, "output": base.output[-2000:]})
            return rows, stats
        pool: list[tuple[str, Mutant]] = [(path, m) for path in repo.source_files for m in mutants(repo.files[path])]
        stats["mutants"] = len(pool)
        rng.shuffle(pool)
        for path, mutant in pool[:budget.mutants_per_repo]:
            if len(rows) >= budget.tasks_per_repo:
                break
            stats["candidates"] += 1
            record = {"repo": repo.name, "file": path, "line": mutant.line, "kind": mutant.kind,
                      "description": mutant.description}
            buggy = test({path: mutant.source})
            fail_to_pass = [t for t in passed if not buggy.passed(t)]
            if buggy.status == "timeout":
                rejects.add(repo.source, repo.name, "test_timeout: the tests hit the wall clock on the mutant", record)
                continue
            if not fail_to_pass:
                rejects.add(repo.source, repo.name, f"equivalent_mutant: no test notices {mutant.description}", record)
                continue
            pass_to_pass = [t for t in passed if t not in fail_to_pass]
            check_task(base, buggy, fail_to_pass, pass_to_pass)
            if not (snapshots / repo.name).exists():
                shutil.copytree(clean, snapshots / repo.name)
            rows.append(task_row(repo, path, mutant, fail_to_pass, pass_to_pass, buggy.output))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows, stats


def task_row(repo: Repo, path: str, mutant: Mutant, fail_to_pass: list[str], pass_to_pass: list[str],
             output: str) -> dict[str, Any]:
    """The canonical RL row of one task (validated against ``corpora.schema.RLRow``)."""
    import json

    from corpora.swe_tools import SYSTEM_PROMPT, TOOLS

    instance_id = f"{repo.name}__{path.replace('/', '.')}__L{mutant.line}_{mutant.kind}"
    gt = {"instance_id": instance_id, "repo": repo.name, "snapshot": f"repos/{repo.name}",
          "bug": {path: mutant.source}, "patch": gold_patch(path, mutant.source, repo.files[path]),
          "FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass, "test_files": repo.test_files,
          "pythonpath": repo.pythonpath,
          "mutation": {"kind": mutant.kind, "file": path, "line": mutant.line, "description": mutant.description}}
    statement = problem_statement(fail_to_pass, output)
    row = {"uuid": row_uuid("swe_tasks", f"{instance_id}:{mutant.description}"), "domain": "swe",
           "responses_create_params": {"input": [{"role": "system", "content": SYSTEM_PROMPT},
                                                 {"role": "user", "content": statement}],
                                       "tools": json.dumps(TOOLS)},
           "agent_ref": "swe", "ground_truth": json.dumps(gt), "source": repo.source,
           "source_version": repo.source_version, "license": repo.license,
           "metadata": json.dumps({"origin": repo.origin, "question": statement})}
    return validate_row("rl", row)


def code_repos(rl: pl.DataFrame, sft: pl.DataFrame, bench: pl.DataFrame | None, cfg: SWETasksParams,
               rejects: Rejects) -> list[Repo]:
    """Tiny repositories: the first ``mbpp_problems`` MBPP problems that have a reference solution
    and the first ``humaneval_problems`` HumanEval problems (a benchmark: 0 by default).
    A problem that cannot be laid out is rejected with its reason."""
    import json

    sols = {json.loads(r["metadata"]).get("task_id"): r
            for r in sft.filter(pl.col("source") == "mbpp_solutions").iter_rows(named=True)}
    out = []
    for row in rl.filter(pl.col("source") == "mbpp_problems").head(cfg.mbpp_problems).iter_rows(named=True):
        sol = sols.get(json.loads(row["metadata"]).get("task_id"))
        try:
            if sol is None:
                raise ValueError(f"row {row['uuid']!r}: no mbpp_solutions row with its task_id")
            out.append(mbpp_repo(row, sol))
        except ValueError as exc:
            rejects.add(row["source"], row["uuid"], f"no_repository: {exc}", row)
    n_he = cfg.humaneval_problems
    if n_he and bench is not None:
        for row in bench.filter(pl.col("source") == "humaneval").head(n_he).iter_rows(named=True):
            try:
                out.append(humaneval_repo(row))
            except ValueError as exc:
                rejects.add(row["source"], row["uuid"], f"no_repository: {exc}", row)
    return out


def run_swe_tasks(cfg: SWETasksParams, registry: str | Path, ingested: Path, out_dir: Path,
                  root: Path = Path(".")) -> dict[str, Any]:
    """The ``swe_tasks`` step: build tasks from code problems and registered repositories.

    Writes ``out_dir/{train,validation}.parquet`` (RL rows, seeded split of ``validation_rows``)
    and ``out_dir/repos/<repo>/`` (the clean snapshots), atomically (built beside ``out_dir`` and
    renamed); ``metrics/swe_tasks.json`` (no wall times: they would change ``dvc.lock`` on every rerun;
    ``benchmarks/swe.py`` measures them) and ``rejects/swe_tasks.parquet``. Every candidate
    (a repository's baseline, a tried mutant, a problem without a solution) is a task or a reject.

    Raises:
        FileNotFoundError: a missing ingested table (names the step that writes it).
        ValueError: ``cfg.repositories`` names a repository the registry does not have.
    """
    from common.io import read_parquet

    rejects = Rejects("swe_tasks")
    rl = pl.from_arrow(read_parquet(ingested / "rl.parquet"))
    sft = pl.from_arrow(read_parquet(ingested / "sft.parquet"))
    bench = pl.from_arrow(read_parquet(ingested / "benchmarks.parquet")) if cfg.humaneval_problems else None
    specs = {s.name: s for s in load_repositories(registry)}
    unknown = sorted(set(cfg.repositories) - set(specs))
    if unknown:
        raise ValueError(f"swe_tasks.repositories: {unknown} not in the registry's repositories {sorted(specs)}")
    tiny = code_repos(rl, sft, bench, cfg, rejects)
    problems_rejected = len(rejects)
    packages = [package_repo(specs[n], cfg.cache_dir) for n in cfg.repositories]
    out_dir = Path(out_dir)
    rng = random.Random(cfg.seed)
    rows, totals, per_source = [], {"candidates": 0, "mutants": 0, "test_runs": 0, "test_s": 0.0}, {}
    with atomic_dir(out_dir) as staging:
        for repo, budget in [(r, cfg.tiny) for r in tiny] + [(p, cfg.package) for p in packages]:
            got, stats = build_repo_tasks(repo, budget, rng, rejects, staging / "repos", cfg.test_timeout_s)
            rows += got
            per_source[repo.source] = per_source.get(repo.source, 0) + len(got)
            for k, v in stats.items():
                totals[k] += v
        rows.sort(key=lambda r: r["uuid"])
        random.Random(cfg.seed).shuffle(rows)
        n_val = min(cfg.validation_rows, len(rows) // 2)
        for split, part in (("validation", rows[:n_val]), ("train", rows[n_val:])):
            write_parquet(pl.DataFrame(part, schema=pl.from_arrow(SCHEMAS["rl"].empty_table()).schema).to_arrow(),
                          staging / f"{split}.parquet", SCHEMAS["rl"])
    return finish_step("swe_tasks", totals["candidates"] + problems_rejected, len(rows), rejects, root,
                       tasks_by_source=per_source, validation_rows=n_val, mutants_enumerated=totals["mutants"],
                       test_runs=totals["test_runs"])

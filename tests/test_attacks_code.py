"""Code verifier under attack: reading the tests, walking frames and gc, exiting early, killing the
parent, fake result files, patched builtins and json, swapped harness code, spoofed types, a
redefined checker helper, survivors and disk fillers (``tests/attacks.py``). Each scores 0 with a
verdict of its own (not an excused ``sandbox_error``); afterwards the grader still grades, no
process is left, nothing is written outside the sandbox and the host's files are unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import pytest

from benchmarks.attacks import (
    HONEST_ADD,
    POLY_HONEST,
    POLY_SPEC,
    SPECS,
    code_attacks,
    code_row,
)
from tests.procs import sandbox_procs, temp_entries
from validators.verifiers import verify, verify_batch
from validators.verifiers.code import run_tests
from validators.verifiers.sandbox import Limits, isolation

ATTACKS = code_attacks()
REPO = Path(__file__).resolve().parents[1]


def _digest(paths: list[Path]) -> str:
    h = hashlib.md5()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def host_state():
    watched = sorted((REPO / "validators" / "verifiers").glob("*.py"))
    before = (temp_entries(), _digest(watched), set(os.listdir(REPO)))
    yield before
    after = (temp_entries(), _digest(watched), set(os.listdir(REPO)))
    assert not {e for e in after[0] - before[0] if e.startswith(("cascade-sbx", "fill", "results"))}
    assert after[1:] == before[1:]


@pytest.mark.parametrize("name,response,row", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_scores_zero_and_leaves_nothing(name, response, row, host_state):
    verdict = verify(response, row)
    assert verdict.reward == 0.0 and not verdict.passed, verdict.reason
    assert verdict.error is None, "an attack must not be excused as a grader failure"
    assert verdict.details["isolation"] == isolation()
    assert sandbox_procs() == []
    # the grader is alive and still pays the honest answer in the same mode
    honest = POLY_HONEST if row["ground_truth"] == json.dumps({"timeout_s": 2, **POLY_SPEC}) else HONEST_ADD
    assert verify(f"```python\n{honest}```", row).reward == 1.0


def test_the_attacks_cover_every_mode_and_the_honest_answers_pass():
    assert len(ATTACKS) >= 3 * 20
    for spec in SPECS.values():
        assert run_tests(HONEST_ADD, spec, Limits(timeout_s=2)).reward == 1.0
    assert run_tests(POLY_HONEST, POLY_SPEC, Limits(timeout_s=2)).reward == 1.0


def test_a_fork_bomb_cannot_fail_a_concurrent_correct_sample():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    row = code_row(SPECS["function_call"])
    responses = [f"```python\n{bomb}```"] * 2 + [f"```python\n{HONEST_ADD}```"] * 6
    verdicts = verify_batch(responses, [row] * len(responses), timeout_s=20, workers=2)
    assert [v.reward for v in verdicts] == [0.0] * 2 + [1.0] * 6
    assert all(v.error is None for v in verdicts)
    assert sandbox_procs() == []


def test_a_sandbox_that_cannot_start_is_an_error_of_the_grader_never_a_zero():
    # one process allowed: bubblewrap (or the interpreter's helpers) cannot fork, so the solution's
    # code never runs: reported, retried once, never scored as the solution's failure
    if isolation() == "rlimits":
        pytest.skip("without a namespace launcher one process is enough to start")
    res = run_tests(HONEST_ADD, SPECS["function_call"], Limits(timeout_s=2, nproc=1))
    assert res.status == "sandbox_error" and not res.passed


def test_writes_are_capped_and_never_reach_the_host():
    filler = ("import os\nwritten = 0\nfor d in ('.', '/tmp'):\n    for i in range(64):\n        try:\n"
              "            with open(os.path.join(d, f'f{i}'), 'wb') as f:\n                f.write(b'x' * (16 << 20))\n"
              "            written += 16\n        except OSError:\n            break\nprint(written)\n")
    before = temp_entries()
    free = os.statvfs(tempfile.gettempdir())
    res = run_tests(filler, {"mode": "stdin_stdout", "tests": [{"stdin": "", "expected_stdout": "2048"}]},
                    Limits(timeout_s=5))
    assert res.reward == 0.0
    if isolation() == "bwrap":  # two tmpfs of Limits.disk_bytes (64 MiB): at most 3 + 3 files of 16 MiB
        assert res.tests[0]["status"] == "ok"
    after = os.statvfs(tempfile.gettempdir())
    assert not {e for e in temp_entries() - before if e.startswith(("cascade-sbx", "f"))}
    assert abs(after.f_bfree - free.f_bfree) * after.f_frsize < 64 << 20

"""Sandbox caps of the whole run (issue #33): one memory cap for every process and tmpfs page, nothing
writable but the size-capped mounts, an output flood that is the solution's failure (never
``sandbox_error``), test names a solution cannot steer, and whole big integers."""

from __future__ import annotations

import sys
import time

import pytest

from tests.procs import sandbox_procs
from validators.verifiers import cgroup
from validators.verifiers.code import run_tests
from validators.verifiers.sandbox import Limits, isolation, run_python

CAP = Limits(timeout_s=20, total_memory_bytes=256 << 20)
FORK_HOG = """
import os, time
for i in range(4):
    if os.fork() == 0:
        b = bytearray(200 << 20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(60)
        os._exit(0)
time.sleep(60)
"""


@pytest.mark.parametrize("watch", [False, True], ids=["cgroup", "process-group-watch"])
def test_children_together_are_killed_at_the_run_memory_cap(watch, monkeypatch):
    if watch:
        monkeypatch.setattr(cgroup, "create", lambda _: None)
    elif not cgroup.available():
        pytest.skip("no memory cgroup can be made here")
    start = time.monotonic()
    res = run_python({"hog.py": FORK_HOG}, "hog.py", limits=CAP)
    assert res.status == "memory_limit" and time.monotonic() - start < 10, res
    if not watch:
        assert res.memory_peak_bytes is not None and res.memory_peak_bytes <= CAP.total_memory_bytes
    assert sandbox_procs() == []


@pytest.mark.skipif(isolation() != "bwrap", reason="mount layout of the bwrap sandbox")
def test_only_the_size_capped_mounts_are_writable():
    probe = """
import os
for path in ("/x", "/dev/x", "/usr/x", "/dev/shm/x", "/tmp/x", "/sandbox/x"):
    try:
        with open(path, "wb") as f:
            f.write(b"a")
        print(path, "writable")
    except OSError:
        print(path, "refused")
try:
    for k in range(5):  # 75 MiB in files under the 16 MiB RLIMIT_FSIZE
        with open(f"/dev/shm/big{k}", "wb") as f:
            f.write(bytes(15 << 20))
except OSError as exc:
    print("shm full", exc.errno)
"""
    res = run_python({"p.py": probe}, "p.py", limits=Limits(timeout_s=10, disk_bytes=64 << 20))
    lines = res.stdout.decode().splitlines()
    assert lines == ["/x refused", "/dev/x refused", "/usr/x refused", "/dev/shm/x writable", "/tmp/x writable",
                     "/sandbox/x writable", "shm full 28"], res


ADD_SPEC = {"mode": "function_call", "entry_point": "add", "tests": [{"args": [2, 3], "expected": 5}]}
FLOODS = {
    "stdout_at_import": "import sys\nsys.stdout.write('x' * (8 << 20))\ndef add(a, b):\n    return 0\n",
    "stderr_at_import": "import os\nos.write(2, b'y' * (8 << 20))\ndef add(a, b):\n    return 0\n",
    "stdout_in_call": "def add(a, b):\n    print('z' * (8 << 20))\n    return a + b\n",
}


@pytest.mark.parametrize("name", sorted(FLOODS))
def test_output_flood_is_the_solutions_failure_not_a_sandbox_error(name):
    res = run_tests(FLOODS[name], ADD_SPEC, Limits(timeout_s=5, output_bytes=1 << 20))
    assert (res.passed, res.status) == (False, "output_limit"), res


STEER = {
    "check_candidate_builtin": (
        {"mode": "check_candidate", "entry_point": "add", "prompt": "def add(a, b):\n",
         "test": "def check(candidate):\n    assert abs(candidate(2, 3) - 5) < 1e-9\n"},
        "def abs(x):\n    return 0\ndef add(a, b):\n    return 0\n"),
    "assert_builtin_on_both_sides": (
        {"mode": "assert", "tests": ["assert sorted([add(2, 3)]) == sorted([5])"]},
        "def sorted(x):\n    return 1\ndef add(a, b):\n    return 0\n"),
    "assert_fake_stdlib_module": (
        {"mode": "assert", "tests": ["assert math.isclose(add(2, 3), 5.0)"]},
        "class math:\n    isclose = staticmethod(lambda *a, **k: True)\ndef add(a, b):\n    return 0\n"),
}


@pytest.mark.parametrize("name", sorted(STEER))
def test_a_solution_cannot_redefine_the_names_the_tests_use(name):
    spec, attack = STEER[name]
    assert run_tests(attack, spec, Limits(timeout_s=5)).reward == 0.0
    honest = "import math\ndef add(a, b):\n    return a + b\n"
    assert run_tests(honest, spec, Limits(timeout_s=5)).reward == 1.0


def test_the_function_under_test_may_carry_a_builtins_name():
    """MBPP asks for a ``sum`` of common divisors (a real row of data/sets/rl/code)."""
    spec = {"mode": "assert", "tests": ["assert sum(10,15) == 6", "assert sum(100,150) == 93"]}
    code = ("import builtins\ndef sum(a, b):\n"
            "    return builtins.sum(d for d in range(1, min(a, b)) if a % d == b % d == 0)\n")
    assert run_tests(code, spec, Limits(timeout_s=5)).reward == 1.0


def test_a_correct_program_printing_a_6000_digit_integer_passes():
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        digits = str(7 ** 7100)  # 6001 digits
        wrong = str(7 ** 7100 + 1)
    finally:
        sys.set_int_max_str_digits(before)
    program = "print(7 ** int(input()))\n"
    for expected, reward in ((digits, 1.0), (wrong, 0.0)):
        spec = {"mode": "stdin_stdout", "tests": [{"stdin": "7100\n", "expected_stdout": expected + "\n"}]}
        assert run_tests(program, spec, Limits(timeout_s=5)).reward == reward

"""Code verifier and sandbox: CODE-01 (wall clock), CODE-03 (streamed output cap), CODE-05 (tests the
solution cannot fake), the adversarial suite (each: reward 0, grader alive, no leftover process,
host unchanged), test forms (stdin/stdout tolerance, big integers, byte writes), isolation fallbacks."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import time

import pytest

from tests.handed import handed_case
from tests.procs import sandbox_procs
from validators.verifiers import check_row, verify
from validators.verifiers.code import extract_code, outputs_match, run_tests
from validators.verifiers.sandbox import Limits, isolation, run_python

FAST = Limits(timeout_s=2)


def _stdio(tests, timeout_s=2.0):
    return {"mode": "stdin_stdout", "tests": tests, "timeout_s": timeout_s}


def test_code_01_wall_clock_kills_every_non_terminating_program():
    case = handed_case("CODE-01")
    inp, exp = case["input"], case["expected"]
    spec = {"mode": inp["mode"], "tests": inp["tests"]}
    for name, code in inp["solutions"].items():
        start = time.monotonic()
        res = run_tests(code, spec, Limits(timeout_s=inp["timeout_s"]))
        assert time.monotonic() - start < exp["each_call_returns_within_s"], name
        assert (res.passed, res.reward) == (exp[name]["passed"], exp[name]["reward"]), name
        if "status" in exp[name]:
            assert res.status == exp[name]["status"], name
    assert len(sandbox_procs()) == exp["leftover_child_processes"]


def test_code_03_output_cap_is_enforced_while_streaming():
    case = handed_case("CODE-03")
    inp, exp = case["input"], case["expected"]
    limits = Limits(timeout_s=inp["timeout_s"], output_bytes=inp["output_cap_bytes"])
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    for name, code in inp["solutions"].items():
        run = run_python({"solution.py": code}, "solution.py", limits=limits)
        assert len(run.stdout) <= exp["captured_stdout_bytes_max"], name
        assert run.status in exp["status_in"], name
        res = run_tests(code, _stdio([{"stdin": "", "expected_stdout": "x"}], inp["timeout_s"]), limits)
        assert res.reward == exp["reward"], name
    growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert growth_mb <= exp["verifier_rss_growth_mb_max"]


def test_code_05_solution_cannot_fake_passing_tests():
    case = handed_case("CODE-05")
    inp, exp = case["input"], case["expected"]
    spec = {"mode": inp["mode"], "entry_point": inp["entry_point"], "tests": inp["tests"]}
    for name, code in inp["solutions"].items():
        res = run_tests(code, spec, FAST)
        assert res.reward == exp["reward"][name], name
    correct = run_tests(inp["solutions"]["correct"], spec, FAST)
    assert len(correct.tests) == exp["per_test_records_required"]
    # the same defences hold for assert-style (MBPP) and check(candidate) (HumanEval) tests
    always_equal = inp["solutions"]["always_equal"]
    mbpp = {"mode": "assert", "tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]}
    humaneval = {"mode": "check_candidate", "entry_point": "add", "prompt": "def add(a, b):\n",
                 "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(2, 3)\n"}
    for spec in (mbpp, humaneval):
        assert run_tests(always_equal, spec, FAST).reward == 0.0
        assert run_tests(inp["solutions"]["exit_at_import"], spec, FAST).reward == 0.0
    truthy = "class T:\n    def __bool__(self):\n        return True\n\ndef add(a, b):\n    return T()\n"
    assert run_tests(truthy, humaneval, FAST).reward == 0.0
    assert run_tests("def add(a, b):\n    return a + b\n", humaneval, FAST).reward == 1.0


ADVERSARIAL = {
    "infinite_loop": "while True:\n    pass\n",
    "swallows_interrupts": ("import time\nwhile True:\n    try:\n        time.sleep(10)\n"
                            "    except BaseException:\n        pass\n"),
    "memory_bomb": "x = []\nwhile True:\n    x.append(bytearray(50 << 20))\n",
    "stdout_flood": "while True:\n    print('A' * 10000)\n",
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
    "exit_before_tests": "import sys\nsys.exit(0)\n",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_programs_score_zero_and_leave_nothing(name):
    spec = {"mode": "assert", "tests": ["assert f(1) == 2"], "timeout_s": 2}
    row = {"uuid": name, "agent_ref": "code", "ground_truth": json.dumps(spec)}
    code = ADVERSARIAL[name] + "\ndef f(x):\n    return x + 1\n"
    verdict = verify(f"```python\n{code}```", row)
    assert verdict.reward == 0.0 and not verdict.passed
    assert verdict.details["isolation"] == isolation()
    assert sandbox_procs() == []
    # the grader still works after it
    assert verify("```python\ndef f(x):\n    return x + 1\n```", row).reward == 1.0


def test_secrets_host_files_writes_and_network_are_out_of_reach(tmp_path, monkeypatch):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text("s3cret")
    os.chmod(secret_file, 0o600)
    monkeypatch.setenv("CASCADE_TEST_SECRET", "hunter2")
    drop = tmp_path / "drop"
    drop.mkdir()
    os.chmod(tmp_path, 0o777)
    os.chmod(drop, 0o777)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    attempts = {
        "read_file": (f"print(open({str(secret_file)!r}).read())", "s3cret"),
        "read_env": ("import os\nprint(os.environ.get('CASCADE_TEST_SECRET'))", "hunter2"),
        "write_outside": (f"open({str(drop / 'pwned')!r}, 'w').write('x')\nprint('written')", "written"),
        "write_repo": (f"open({os.path.abspath('pwned.txt')!r}, 'w').write('x')\nprint('written')", "written"),
        "network": (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')",
                    "connected"),
    }
    try:
        for name, (code, wanted) in attempts.items():
            res = run_tests(code, _stdio([{"stdin": "", "expected_stdout": wanted}]), FAST)
            assert res.reward == 0.0, name
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert list(drop.iterdir()) == [] and not os.path.exists("pwned.txt")


def test_stdin_stdout_comparison_rules():
    assert outputs_match(b"0.3333333\n", "0.33333333333")          # float tolerance
    assert not outputs_match(b"0.34\n", "0.33333333333")
    big = str(3 ** 200)
    assert outputs_match(big.encode(), big) and not outputs_match(str(3 ** 200 + 1).encode(), big)
    huge = "9" * 16000 + "7"                                           # past int()'s 4,300-digit str limit
    assert outputs_match(huge.encode(), huge) and not outputs_match(huge.encode(), huge[:-1] + "0")
    assert outputs_match(b"007 +5 -0", "7 5 0")                         # integers by value
    assert not outputs_match(b"1e400", "2e400")                         # no float overflow to inf == inf
    assert outputs_match(b"1e400", "1.0000001e400") and outputs_match(b"1e-400", "0")
    assert outputs_match(b"123456789.5", "123456789.6")                 # relative 1e-6 on large values
    assert not outputs_match(b"nan", "0") and outputs_match(b"nan", "nan")
    assert not outputs_match(b"1e3", "1001") and outputs_match(b"1e3", "1000")
    assert outputs_match(b"a  b\n\n", "a b") and not outputs_match(b"a b c", "a b")
    assert outputs_match(b"yes \r\n", "yes") and not outputs_match(b"Yes", "yes")
    byte_writer = "import sys\nsys.stdout.buffer.write(b'caf\\xc3\\xa9 ' + str(2**100).encode() + b'\\n')\n"
    res = run_tests(byte_writer, _stdio([{"stdin": "", "expected_stdout": f"café {2 ** 100}"}]), FAST)
    assert res.reward == 1.0


def test_every_test_must_pass_and_records_are_per_test():
    spec = {"mode": "assert", "tests": ["assert sq(2) == 4", "assert sq(3) == 9", "assert sq(-1) == 2"]}
    res = run_tests("def sq(x):\n    return x * x\n", spec, FAST)
    assert [t["passed"] for t in res.tests] == [True, True, False] and res.reward == 0.0
    assert res.status == "failed"


def test_extract_code_takes_the_last_python_block():
    answer = "Try:\n```python\ndef f(): return 1\n```\nBetter:\n```py\ndef f(): return 2\n```\n```text\nnot code\n```"
    assert extract_code(answer) == "def f(): return 2\n"
    assert extract_code("def f():\n    return 3") == "def f():\n    return 3"
    assert extract_code("no code here, sorry.") is None


def test_code_check_row_rejects_bad_specs():
    for gt, msg in [({"mode": "assert", "tests": []}, "tests is missing"), ({"mode": "pytest"}, "mode must be"),
                    ({"mode": "check_candidate", "test": "def check(c): pass"}, "entry_point"),
                    ({"mode": "assert", "tests": ["assert f(1) =="]}, "not valid Python")]:
        with pytest.raises(ValueError, match=msg):
            check_row({"uuid": "c", "agent_ref": "code", "ground_truth": json.dumps(gt)})


@pytest.mark.parametrize("mode", ["unshare", "rlimits"])
def test_fallback_isolations_still_limit_time_and_report_themselves(mode):
    if mode == "unshare" and not shutil.which("unshare"):
        pytest.skip("util-linux unshare not installed")
    ok = run_python({"a.py": "print(input()[::-1])"}, "a.py", stdin=b"abc\n", isolation_mode=mode)
    assert (ok.status, ok.stdout, ok.isolation) == ("ok", b"cba\n", mode)
    hang = run_python({"a.py": "import time\ntime.sleep(30)"}, "a.py", limits=Limits(timeout_s=1), isolation_mode=mode)
    assert hang.status == "timeout" and hang.wall_s < 3
    assert sandbox_procs() == []


def test_required_isolation_fails_loudly_and_killed_workers_leave_no_directory(monkeypatch, tmp_path):
    from validators.verifiers import sandbox

    monkeypatch.setattr(sandbox, "_probe", lambda: "rlimits")
    monkeypatch.setenv(sandbox.REQUIRE_ENV, "rlimits")
    with pytest.raises(sandbox.SandboxUnavailable, match="install bubblewrap"):
        sandbox.require_from_params(sandbox.SandboxParams(require="bwrap"))
    with pytest.raises(sandbox.SandboxUnavailable):
        run_tests("def f(): pass", {"mode": "assert", "tests": ["assert f() is None"]}, FAST)
    with pytest.raises(ValueError, match="params.yaml sandbox.require"):
        sandbox.SandboxParams.from_block({"require": "chroot"})
    assert sandbox.require_from_params(sandbox.SandboxParams.from_block({"require": "rlimits"})) == "rlimits"
    monkeypatch.setattr(sandbox.tempfile, "gettempdir", lambda: str(tmp_path))
    for name in ("cascade-sbx-4242-a1", "cascade-sbx-4242-b2", "cascade-sbx-42-c3"):
        (tmp_path / name).mkdir()
    assert sandbox.sweep(4242) == 2 and sorted(os.listdir(tmp_path)) == ["cascade-sbx-42-c3"]

"""Code verifier (``agent_ref`` ``code``): run the response's program against its tests, sandboxed.

``ground_truth.mode`` selects the test form:

* ``assert`` (MBPP): ``tests`` (assert statements, required), ``setup_code``; ``challenge_tests``
  are not run (the standard MBPP metric uses ``test_list`` only).
* ``check_candidate`` (HumanEval): ``test`` defining ``check(candidate)``, ``entry_point``, ``prompt``.
  The program is the prompt's import lines followed by the response's code (the response is asked
  for the complete function; ``from typing import List`` lives in the prompt).
* ``function_call``: ``entry_point`` and ``tests`` ``[{args, kwargs?, expected}]``, compared by
  :func:`~validators.verifiers.code_grader.values_match`.
* ``stdin_stdout``: ``tests`` ``[{stdin, expected_stdout}]``, one sandboxed run per test; outputs
  compared here like a competitive-programming judge (:func:`outputs_match`).

The answer never reaches the solution. In the first three modes two sandboxes run at once: the
solution's (:mod:`.code_server` loads the program and answers calls) and the grader's
(:mod:`.code_grader` holds the tests, calls into the solution through a pipe with plain-data
arguments, gets plain data back (:mod:`.code_wire`) and compares in its own process). No test and
no expected value is on the solution's disk, in its environment or in its memory; an object with a
rigged ``__eq__`` cannot cross; exiting early, killing its own process, patching builtins or
printing claims only makes its calls fail. In ``stdin_stdout`` mode the expected output stays in
this process.

Reward is binary: 1 only if every test ran and passed (positive evidence: one passing record per
test from the grader, which then reports it is done). A sandbox that could not start
(``sandbox_error``: no proof from inside that it started) is retried once, then reported as an
error of the grader (``Verdict.error``), never as the solution's failure. The program is the last
fenced code block of the final answer whose language is python/py or empty; with no fence, the
whole answer if it parses as Python. ``ground_truth.timeout_s`` overrides the per-run wall clock
(default :data:`DEFAULT_TIMEOUT_S`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import time
from dataclasses import dataclass, field
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from validators.verifiers.registry import (
    Verdict,
    Verifier,
    fail,
    ground_truth,
)
from validators.verifiers.sandbox import Limits, Program, run_group

DEFAULT_TIMEOUT_S = 6.0
LIMIT_STATUSES = ("timeout", "output_limit", "memory_limit")  # the solution ran into a sandbox cap: reward 0
DEFAULT_LIMITS = Limits(timeout_s=DEFAULT_TIMEOUT_S)
SHIPPED = {name: Path(__file__).with_name(name).read_text(encoding="utf-8")
           for name in ("code_wire.py", "code_server.py", "code_grader.py")}
MODES = {"assert": ("tests",), "check_candidate": ("test", "entry_point"),
         "function_call": ("tests", "entry_point"), "stdin_stdout": ("tests",)}
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
REL_TOL = ABS_TOL = Decimal("1e-6")
WIDE = Context(prec=34, Emax=MAX_EMAX, Emin=MIN_EMIN)  # any exponent a token can write
STARTED = b'{"started": true}\n'


def extract_code(answer: str) -> str | None:
    """The program in ``answer``: the last ```python / ```py / ``` fenced block, else the whole
    answer when it parses as Python, else None."""
    blocks = [body for lang, body in FENCE.findall(answer) if lang.lower() in ("", "python", "py", "python3")]
    if blocks:
        return blocks[-1]
    try:
        ast.parse(answer)
    except (SyntaxError, ValueError):
        return None
    return answer if answer.strip() else None


def _decimal(tok: str) -> Decimal | None:
    if not NUMBER.fullmatch(tok):
        return None
    try:
        return Decimal(tok)
    except InvalidOperation:
        return None


def outputs_match(got: bytes, expected: str) -> bool:
    """Whether program output ``got`` matches ``expected`` the way a competitive-programming judge
    compares tokens (Codeforces ``wcmp`` plus the usual real-number checker).

    Rules: output is decoded as UTF-8 (invalid bytes replaced) and split on whitespace, so blank
    lines, trailing spaces and a missing final newline never matter; the token counts must be
    equal; equal strings match; integers (any length, no digit limit) compare exactly by value
    (``007`` = ``7``, ``+5`` = ``5``); when either token is a non-integer decimal number (``2.50``,
    ``1e3``, ``-.5``) both are read exactly as decimals (no float overflow: ``1e400`` != ``2e400``)
    and match when ``|a - b| <= max(1e-6, 1e-6 * |b|)`` (in :data:`WIDE`, so ``1e999999999`` is a
    number, not a ``decimal.Overflow``); anything else (``nan``, ``inf``, words)
    compares as text, case-sensitive.
    """
    a, b = got.decode("utf-8", errors="replace").split(), expected.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        dx, dy = _decimal(x), _decimal(y)
        if dx is None or dy is None:
            return False
        if re.fullmatch(r"[+-]?\d+", x) and re.fullmatch(r"[+-]?\d+", y):
            if dx != dy:
                return False
        elif WIDE.abs(WIDE.subtract(dx, dy)) > max(ABS_TOL, WIDE.multiply(REL_TOL, WIDE.abs(dy))):
            return False
    return True


@dataclass
class CodeResult:
    """Outcome of :func:`run_tests`: ``status`` is ``passed`` | ``failed`` | ``timeout`` |
    ``output_limit`` | ``memory_limit`` | ``runtime_error`` | ``sandbox_error``; ``tests`` one
    record per test."""

    passed: bool
    status: str
    isolation: str
    tests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """1.0 when every test passed, else 0.0."""
        return 1.0 if self.passed else 0.0


def _pipe_read(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 64)
    except BlockingIOError:
        return b""
    finally:
        os.close(fd)


def _stdin_stdout(code: str, tests: list[dict[str, Any]], limits: Limits) -> CodeResult:
    records, isolation = [], ""
    for i, test in enumerate(tests):
        r, w = os.pipe()
        files = {"solution.py": code, **{k: SHIPPED[k] for k in ("code_wire.py", "code_server.py")}}
        (run,) = run_group([Program(files, ["-I", "code_server.py", "main", str(w)],
                                    str(test.get("stdin", "")).encode(), fds=(w,))], limits)
        isolation = run.isolation
        if _pipe_read(r) != STARTED:
            return CodeResult(False, "sandbox_error", isolation, records)
        ok = run.status == "ok" and outputs_match(run.stdout, str(test["expected_stdout"]))
        records.append({"test": i, "passed": ok, "status": run.status,
                        "stderr": run.stderr[-300:].decode("utf-8", errors="replace")})
        if not ok:
            status = "failed" if run.status == "ok" else run.status
            return CodeResult(False, status, isolation, records)
    return CodeResult(True, "passed", isolation, records)


def _graded(code: str, spec: dict[str, Any], limits: Limits) -> CodeResult:
    """One session of the solution and grader sandboxes (see the module doc)."""
    to_solution, from_solution = os.pipe(), os.pipe()
    files = {"solution.py": code, "code_wire.py": SHIPPED["code_wire.py"], "code_server.py": SHIPPED["code_server.py"]}
    if spec.get("setup_code"):
        files["setup.py"] = spec["setup_code"]
    solution = Program(files, ["-I", "code_server.py", "serve", str(to_solution[0]), str(from_solution[1])],
                       fds=(to_solution[0], from_solution[1]))
    grader_spec = {k: spec[k] for k in ("mode", "tests", "test", "prompt", "entry_point") if k in spec}
    grader = Program({k: SHIPPED[k] for k in ("code_wire.py", "code_grader.py")},
                     ["-I", "-S", "code_grader.py", str(to_solution[1]), str(from_solution[0])],
                     json.dumps(grader_spec).encode(), fds=(to_solution[1], from_solution[0]))
    sol, grd = run_group([solution, grader], limits)
    lines = [json.loads(ln) for ln in grd.stdout.decode("utf-8", errors="replace").splitlines() if ln.startswith("{")]
    if {"grader": "started"} not in lines or {"solution": "started"} not in lines:
        return CodeResult(False, "sandbox_error", sol.isolation)  # the solution's code never ran
    records = [ln for ln in lines if "test" in ln]
    n = 1 if spec["mode"] == "check_candidate" else len(spec["tests"])
    done = {"done": True} in lines and [r["test"] for r in records] == list(range(n))
    passed = done and all(r["passed"] for r in records) and grd.status == "ok"
    if passed:
        return CodeResult(True, "passed", sol.isolation, records)
    if sol.status in LIMIT_STATUSES or grd.status in LIMIT_STATUSES:
        status = sol.status if sol.status in LIMIT_STATUSES else grd.status
    elif any("solution process ended" in (r["error"] or "") or "failed to load" in (r["error"] or "")
             for r in records):
        status = "runtime_error"
    else:
        status = "failed"
    return CodeResult(False, status, sol.isolation, records)


def run_tests(code: str, spec: dict[str, Any], limits: Limits = DEFAULT_LIMITS) -> CodeResult:
    """Run program ``code`` against the tests of ``spec`` (a code ``ground_truth``, see the module
    doc); a run whose sandbox did not start is tried once more after 0.5 s.

    Raises:
        ValueError: unknown mode or missing fields (:func:`check_spec`).
        SandboxUnavailable: the required isolation is missing (``sandbox.require``).
    """
    check_spec(spec)
    mode = spec["mode"]
    if mode == "check_candidate":
        imports = [ln for ln in spec.get("prompt", "").splitlines() if re.match(r"(from\s+\S+\s+)?import\s", ln)]
        code = "\n".join(imports + [code])
    for attempt in range(2):
        if attempt:
            time.sleep(0.5)
        res = _stdin_stdout(code, spec["tests"], limits) if mode == "stdin_stdout" else _graded(code, spec, limits)
        if res.status != "sandbox_error":
            break
    return res


def check_spec(spec: Any) -> None:
    """Raise ValueError when ``spec`` is not a runnable code ground truth."""
    if not isinstance(spec, dict) or spec.get("mode") not in MODES:
        raise ValueError(f"ground_truth.mode must be one of {sorted(MODES)}")
    for key in MODES[spec["mode"]]:
        if not spec.get(key):
            raise ValueError(f"ground_truth.{key} is missing or empty (mode {spec['mode']!r})")
    if spec["mode"] in ("assert", "function_call", "stdin_stdout") and not isinstance(spec["tests"], list):
        raise ValueError("ground_truth.tests must be a list")
    if spec["mode"] == "assert":
        named = [("setup_code", spec.get("setup_code") or "")]
        named += [(f"tests[{i}]", t) for i, t in enumerate(spec["tests"])]
        for where, source in named:
            try:
                ast.parse(source)
            except (SyntaxError, TypeError) as exc:
                raise ValueError(f"ground_truth.{where} is not valid Python: {exc}") from None


def expected_values(spec: dict[str, Any]) -> list[str] | None:
    """What each test of ``spec`` expects, as comparable text, or None when that cannot be read
    statically (``check_candidate``, an assert that is not ``call == literal``)."""
    if spec["mode"] == "function_call":
        return [json.dumps(t.get("expected"), sort_keys=True) for t in spec["tests"]]
    if spec["mode"] == "stdin_stdout":
        return [" ".join(str(t.get("expected_stdout", "")).split()) for t in spec["tests"]]
    if spec["mode"] != "assert":
        return None
    out = []
    for test in spec["tests"]:
        node = ast.parse(test).body[0] if test.strip() else None
        if not (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
                and [type(op) for op in node.test.ops] == [ast.Eq]):
            return None
        left, right = node.test.left, node.test.comparators[0]
        try:
            out.append(repr(ast.literal_eval(left if isinstance(right, ast.Call) else right)))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    return out


class CodeVerifier(Verifier):
    """Sandboxed execution; reward 1 only if every test passes (see the module doc)."""

    sft_domain = "code"

    def check(self, row: dict[str, Any]) -> None:
        try:
            check_spec(ground_truth(row))
        except ValueError as exc:
            raise ValueError(f"row {row.get('uuid')!r}: {exc}") from None

    def check_trainable(self, row: dict[str, Any]) -> None:
        """The tests tell a solution from a constant: tests that all expect one value (MBPP's
        ``hamming_Distance``: 2, 2, 2) pay ``return 2``.

        Raises:
            ValueError: naming the row.
        """
        expected = expected_values(ground_truth(row))
        if expected is not None and len(set(expected)) < 2:
            raise ValueError(f"row {row.get('uuid')!r}: every test expects {expected[0][:60] if expected else 'nothing'}: "
                             f"a program answering that constant passes (tests must expect two values or more)")

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        spec = ground_truth(row)
        code = extract_code(answer)
        if code is None:
            return fail("no Python code in the answer")
        limits = Limits(timeout_s=float(spec.get("timeout_s", DEFAULT_TIMEOUT_S)))
        res = run_tests(code, spec, limits)
        details = {"status": res.status, "isolation": res.isolation, "tests": res.tests}
        if res.status == "sandbox_error":
            return Verdict(0.0, False, "sandbox_error: the sandbox did not start (twice); no verdict",
                           details, error="sandbox_error")
        if res.passed:
            return Verdict(1.0, True, "all tests passed", details)
        return fail(f"{res.status}: {sum(bool(t.get('passed')) for t in res.tests)}/"
                    f"{len(res.tests) or '?'} tests passed", **details)

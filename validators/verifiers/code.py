"""Code verifier (``agent_ref`` ``code``): run the response's program against its tests in the sandbox.

``ground_truth.mode`` selects the test form:

* ``assert`` (MBPP): ``tests`` (assert statements, required), ``setup_code``; ``challenge_tests``
  are not run (the standard MBPP metric uses ``test_list`` only).
* ``check_candidate`` (HumanEval): ``test`` defining ``check(candidate)``, ``entry_point``, ``prompt``.
  The program is the prompt's import lines followed by the response's code (the response is asked
  for the complete function; ``from typing import List`` lives in the prompt).
* ``function_call``: ``entry_point`` and ``tests`` ``[{args, kwargs?, expected}]``; the result comes
  back as JSON and is compared here (:func:`values_match`).
* ``stdin_stdout``: ``tests`` ``[{stdin, expected_stdout}]``, one sandboxed run per test; outputs
  compared token by token (:func:`outputs_match`).

Reward is binary: 1 only if every test ran and passed (positive evidence: one result record per
test). The program is the last fenced code block of the final answer whose language is python/py
or empty; with no fence, the whole answer if it parses as Python. ``ground_truth.timeout_s``
overrides the per-run wall clock (default :data:`DEFAULT_TIMEOUT_S`).
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from validators.verifiers.registry import Verdict, Verifier, fail, ground_truth, register_verifier
from validators.verifiers.sandbox import Limits, run_python

DEFAULT_TIMEOUT_S = 6.0
HARNESS = (Path(__file__).with_name("code_harness.py")).read_text(encoding="utf-8")
MODES = {"assert": ("tests",), "check_candidate": ("test", "entry_point"),
         "function_call": ("tests", "entry_point"), "stdin_stdout": ("tests",)}
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)


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


def _numeric(tok: str) -> float | int | None:
    if re.fullmatch(r"[+-]?\d+", tok):
        return int(tok)
    try:
        return float(tok)
    except ValueError:
        return None


def outputs_match(got: bytes, expected: str, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> bool:
    """Whether program output ``got`` matches ``expected`` token by token (whitespace-separated).

    Integer tokens compare exactly (big integers included); when either token is a non-integer
    number both compare as floats within ``rel_tol``/``abs_tol`` (``math.isclose``); other tokens
    compare as strings. Output is decoded as UTF-8 (invalid bytes replaced), so byte writes count.
    """
    a, b = got.decode("utf-8", errors="replace").split(), expected.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        nx, ny = _numeric(x), _numeric(y)
        if nx is None or ny is None or (isinstance(nx, int) and isinstance(ny, int)):
            return False
        if not math.isclose(float(nx), float(ny), rel_tol=rel_tol, abs_tol=abs_tol):
            return False
    return True


def values_match(got: Any, expected: Any) -> bool:
    """JSON values equal with strict types (``"3" != 3``, ``True != 1``), lists and dicts
    recursively, floats within ``math.isclose(rel_tol=1e-6, abs_tol=1e-9)``; an int result matches
    a float expectation of the same value."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, float) and isinstance(got, (int, float)):
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
    if type(got) is not type(expected):
        return False
    if isinstance(expected, list):
        return len(got) == len(expected) and all(values_match(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in expected)
    return got == expected


@dataclass
class CodeResult:
    """Outcome of :func:`run_tests`: ``status`` is ``passed`` | ``failed`` | ``timeout`` |
    ``output_limit`` | ``runtime_error`` | ``sandbox_error``; ``tests`` one record per test."""

    passed: bool
    status: str
    isolation: str
    tests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """1.0 when every test passed, else 0.0."""
        return 1.0 if self.passed else 0.0


def _stdin_stdout(code: str, tests: list[dict[str, Any]], limits: Limits) -> CodeResult:
    records, isolation = [], ""
    for i, test in enumerate(tests):
        run = run_python({"solution.py": code}, "solution.py", stdin=str(test.get("stdin", "")).encode(),
                         limits=limits)
        isolation = run.isolation
        ok = run.status == "ok" and outputs_match(run.stdout, str(test["expected_stdout"]))
        records.append({"test": i, "passed": ok, "status": run.status,
                        "stderr": run.stderr[-300:].decode("utf-8", errors="replace")})
        if not ok:
            status = "failed" if run.status == "ok" else run.status
            return CodeResult(False, status, isolation, records)
    return CodeResult(True, "passed", isolation, records)


def run_tests(code: str, spec: dict[str, Any], limits: Limits = Limits(timeout_s=DEFAULT_TIMEOUT_S)) -> CodeResult:
    """Run program ``code`` against the tests of ``spec`` (a code ``ground_truth``, see the module doc).

    Raises:
        ValueError: unknown mode or missing fields (:func:`check_spec`).
    """
    check_spec(spec)
    mode = spec["mode"]
    if mode == "stdin_stdout":
        return _stdin_stdout(code, spec["tests"], limits)
    if mode == "check_candidate":
        imports = [ln for ln in spec.get("prompt", "").splitlines() if re.match(r"(from\s+\S+\s+)?import\s", ln)]
        code = "\n".join(imports + [code])
    n = 1 if mode == "check_candidate" else len(spec["tests"])
    harness_spec = {k: spec[k] for k in ("mode", "tests", "setup_code", "test", "entry_point") if k in spec}
    run = run_python({"solution.py": code, "spec.json": json.dumps(harness_spec), "harness.py": HARNESS},
                     "harness.py", limits=limits, collect=("results.jsonl",))
    records = []
    for line in run.files.get("results.jsonl", b"").decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("test") == len(records):
            records.append(rec)
    if mode == "function_call":
        for rec, test in zip(records, spec["tests"]):
            if rec["passed"]:
                rec["passed"] = values_match(json.loads(rec["value"]), test["expected"])
    passed = len(records) == n and all(r["passed"] for r in records) and run.status == "ok"
    status = "passed" if passed else (run.status if run.status != "ok" else "failed")
    if len(records) != n and status == "failed":
        status = "runtime_error"
    return CodeResult(passed, status, run.isolation, records)


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


@register_verifier("code")
class CodeVerifier(Verifier):
    """Sandboxed execution; reward 1 only if every test passes (see the module doc)."""

    def check(self, row: dict[str, Any]) -> None:
        try:
            check_spec(ground_truth(row))
        except ValueError as exc:
            raise ValueError(f"row {row.get('uuid')!r}: {exc}") from None

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        spec = ground_truth(row)
        code = extract_code(answer)
        if code is None:
            return fail("no Python code in the answer")
        limits = Limits(timeout_s=float(spec.get("timeout_s", DEFAULT_TIMEOUT_S)))
        res = run_tests(code, spec, limits)
        details = {"status": res.status, "isolation": res.isolation, "tests": res.tests}
        if res.passed:
            return Verdict(1.0, True, "all tests passed", details)
        return fail(f"{res.status}: {sum(bool(t.get('passed')) for t in res.tests)}/"
                    f"{len(res.tests) or '?'} tests passed", **details)

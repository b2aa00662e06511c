"""Adapters of the Hub benchmarks `cascade eval` reads (``corpora/sources-hub.yaml``): AIME 2024 / 2025,
GPQA-Diamond and LiveCodeBench, each to RL rows of the verifier that grades training on that domain.

* ``aime`` (``HuggingFaceH4/aime_2024``: ``id, problem, solution, answer, url, year``;
  ``yentinglin/aime_2025``: ``id, problem, answer, ...``; ``question`` is accepted for ``problem``) ->
  ``math`` rows, the integer answer in ``ground_truth.answer``; the prompt is :func:`math_prompt`'s.
* ``gpqa`` (``Idavidrein/gpqa`` config ``gpqa_diamond``: ``Question, Correct Answer, Incorrect Answer 1..3,
  Record ID, Subdomain, High-level domain``) -> ``mcqa`` rows via :func:`mcq_row`. The four options are
  shuffled by a permutation seeded with the ``Record ID`` (the published set lists the correct answer
  first), so the gold letter is the same on every run and spread over A-D.
* ``livecodebench`` (``livecodebench/code_generation_lite``, the ``test*.jsonl`` files: ``question_title,
  question_content, platform, question_id, contest_date, starter_code, difficulty, public_test_cases,
  private_test_cases, metadata``) -> ``code`` rows, mode ``stdin_stdout``, every public and private test.
  ``private_test_cases`` is JSON or, in later releases, base64 of zlib of a pickled JSON string; it is
  unpickled with no class allowed (:func:`_unpickle_str`), so a record cannot run code here. Functional
  (LeetCode, ``testtype: functional``) problems call a method of ``class Solution``, which the code
  verifier does not grade: such a record is rejected with that reason (counted, never dropped silently).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import pickle
import random
import zlib
from pathlib import Path
from typing import Any

from corpora.adapters._common import require, text, user
from corpora.adapters.math import math_prompt
from corpora.adapters.mcqa import mcq_row
from corpora.registry import SourceSpec
from corpora.schema import RecordError

#: LiveCodeBench's own stdin instruction (lcb_runner/prompts/code_generation.py), in our code-block wording
LCB_STDIN = ("Read the inputs from stdin, solve the problem and write the answer to stdout (do not directly test "
             "on the sample inputs). Write the solution as a self-contained Python script in a ```python code block.")


def aime(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """An AIME problem -> a ``math`` RL row (the answer is an integer 0-999, compared by math-verify).

    Raises:
        RecordError: no ``problem`` / ``question``, or no ``answer``.
    """
    problem = raw.get("problem") if raw.get("problem") is not None else raw.get("question")
    if problem is None:
        raise RecordError("problem: missing (nor question)")
    (answer,) = require(raw, "answer")
    item = raw.get("id", raw.get("problem_idx"))
    return {"responses_create_params": {"input": user(math_prompt(text(problem, "problem")))},
            "agent_ref": "math", "domain": "math", "ground_truth": {"answer": str(answer).strip()},
            "metadata": {"id": item, "question": problem, "year": raw.get("year"), "url": raw.get("url")}}


def gpqa(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """A GPQA record -> an ``mcqa`` RL row, options in a permutation seeded by ``Record ID``.

    Raises:
        RecordError: a missing question, answer or record id (from :func:`require`), or an empty option.
    """
    question, correct, record_id = require(raw, "Question", "Correct Answer", "Record ID")
    wrong = require(raw, "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
    options = [text(correct, "Correct Answer")] + [text(w, f"Incorrect Answer {i + 1}") for i, w in enumerate(wrong)]
    order = list(range(4))
    random.Random(int.from_bytes(hashlib.sha256(str(record_id).encode()).digest()[:8], "big")).shuffle(order)
    return mcq_row(text(question, "Question"), [options[i] for i in order], order.index(0), record_id,
                   subdomain=raw.get("Subdomain"), high_level_domain=raw.get("High-level domain"))


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a class or function in the pickle ({module}.{name})")


def _unpickle_str(blob: str) -> str:
    """The string pickled in ``blob`` (base64 of zlib of a pickle), loaded with no class or function allowed.

    Raises:
        RecordError: not base64/zlib/pickle, a pickle that names any global, or not a string.
    """
    try:
        value = _NoGlobals(io.BytesIO(zlib.decompress(base64.b64decode(blob, validate=True)))).load()
    except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as exc:
        raise RecordError(f"private_test_cases: not JSON nor base64-zlib-pickle ({exc})") from None
    if not isinstance(value, str):
        raise RecordError(f"private_test_cases: the pickle holds {type(value).__name__}, not a JSON string")
    return value


def _tests(value: Any, field: str) -> list[dict[str, Any]]:
    if value in (None, ""):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            if field != "private_test_cases":
                raise RecordError(f"{field}: not JSON") from None
            value = json.loads(_unpickle_str(value))
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RecordError(f"{field}: expected a list of test objects")
    for i, t in enumerate(value):
        if not isinstance(t.get("input"), str) or not isinstance(t.get("output"), str):
            raise RecordError(f"{field}[{i}]: input and output must be strings")
    return value


def livecodebench(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """A LiveCodeBench problem -> a ``code`` RL row (mode ``stdin_stdout``: every public and private test).

    Raises:
        RecordError: missing fields, malformed tests, no test, or a functional (LeetCode) problem.
    """
    content, question_id = require(raw, "question_content", "question_id")
    tests = _tests(raw.get("public_test_cases"), "public_test_cases") + _tests(
        raw.get("private_test_cases"), "private_test_cases")
    if not tests:
        raise RecordError("public_test_cases: no test")
    kinds = {t.get("testtype", "stdin") for t in tests}
    if kinds != {"stdin"}:
        raise RecordError(f"testtype: {sorted(kinds)}: functional (LeetCode) problems call a method of class "
                          f"Solution, which the code verifier does not grade")
    prompt = f"{text(content, 'question_content').strip()}\n\n{LCB_STDIN}"
    return {"responses_create_params": {"input": user(prompt)}, "agent_ref": "code", "domain": "code",
            "ground_truth": {"mode": "stdin_stdout",
                             "tests": [{"stdin": t["input"], "expected_stdout": t["output"]} for t in tests]},
            "metadata": {"id": question_id, "question": content, "title": raw.get("question_title"),
                         "platform": raw.get("platform"),
                         "contest_date": None if raw.get("contest_date") is None else str(raw["contest_date"]),
                         "difficulty": raw.get("difficulty")}}

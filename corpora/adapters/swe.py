"""SWE-RL rows of the Hub (SWE-Gym / SWE-bench / R2E-Gym style) -> canonical RL rows (domain ``swe``).

A record names a GitHub ``repo`` (R2E-Gym: ``repo_name``), the ``base_commit`` the episode starts
from (R2E-Gym: ``commit_hash``), the issue ``problem_statement``, and the tests that decide the
reward: ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (lists, or JSON strings of lists as SWE-bench ships
them). ``patch`` (the gold fix) and ``test_patch`` (the tests applied before grading) are kept
when present. The row's prompt is the agent's system prompt and the issue, with the agent's tools
(:mod:`corpora.swe_tools`); ``ground_truth`` holds what :class:`validators.swe.environment.SWEEnvironment`
needs. Fields without a column (``version``, ``created_at``, ``hints_text``...) go to ``metadata``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corpora.adapters._common import json_value, jsonable, text
from corpora.registry import SourceSpec
from corpora.schema import RecordError

ALIASES = {"repo": ("repo", "repo_name"), "base_commit": ("base_commit", "commit_hash")}
TEST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")
KNOWN = {"instance_id", "problem_statement", "patch", "test_patch", *TEST_FIELDS,
         *(a for names in ALIASES.values() for a in names)}


def _field(raw: dict[str, Any], name: str) -> Any:
    for alias in ALIASES.get(name, (name,)):
        if raw.get(alias) not in (None, ""):
            return raw[alias]
    raise RecordError(f"{name}: missing")


def _tests(raw: dict[str, Any], name: str) -> list[str]:
    value = json_value(raw.get(name, []), name)
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise RecordError(f"{name}: expected a list of test ids")
    return value


def swe_task(raw: dict[str, Any]) -> dict[str, Any]:
    """The ground truth of a SWE-Gym / R2E-Gym / SWE-bench record: ``{instance_id, repo, base_commit,
    FAIL_TO_PASS, PASS_TO_PASS, patch?, test_patch?, problem_statement}`` (the aliases of :data:`ALIASES`
    read; the caller moves ``problem_statement`` into the prompt).

    Raises:
        RecordError: a missing ``repo`` / ``base_commit`` / ``instance_id`` / ``problem_statement``,
            test lists that are not lists of strings, or no FAIL_TO_PASS test (category
            ``no_ground_truth``: nothing to verify against).
    """
    if not isinstance(raw, dict):
        raise RecordError(f"<record>: expected an object, got {type(raw).__name__}")
    repo, commit = str(_field(raw, "repo")), str(_field(raw, "base_commit"))
    statement = text(_field(raw, "problem_statement"), "problem_statement")
    fail_to_pass, pass_to_pass = _tests(raw, "FAIL_TO_PASS"), _tests(raw, "PASS_TO_PASS")
    if not fail_to_pass:
        raise RecordError("FAIL_TO_PASS: empty (no test checks the fix)", category="no_ground_truth")
    return {"instance_id": str(_field(raw, "instance_id")), "repo": repo, "base_commit": commit,
            "FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass,
            **{k: raw[k] for k in ("patch", "test_patch") if raw.get(k)}, "problem_statement": statement}


def swe_prompt(statement: str) -> dict[str, Any]:
    """``responses_create_params`` of a SWE row: the agent's system prompt and tools (:mod:`corpora.swe_tools`)
    and the issue as the user turn."""
    from corpora.swe_tools import SYSTEM_PROMPT, TOOLS

    return {"input": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": statement}],
            "tools": TOOLS}


def swe_gym(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """A SWE-Gym / R2E-Gym record -> RL row (``agent_ref`` ``swe``); see the module doc and :func:`swe_task`.

    Raises:
        RecordError: as :func:`swe_task`.
    """
    gt = swe_task(raw)
    statement = gt.pop("problem_statement")
    return {"responses_create_params": swe_prompt(statement), "agent_ref": "swe", "ground_truth": gt,
            "metadata": {"question": statement, **{k: jsonable(v) for k, v in raw.items() if k not in KNOWN}}}

"""Access to the handed regression cases in ``../shared/cases/handed.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

CASES = Path(__file__).resolve().parents[2] / "shared" / "cases" / "handed.jsonl"


def handed_case(case_id: str) -> dict[str, Any]:
    """The case ``case_id``; skips the test when the shared cases are not beside the repo."""
    if not CASES.exists():
        pytest.skip(f"{CASES} not found")
    for line in CASES.read_text(encoding="utf-8").splitlines():
        if line.strip():
            case = json.loads(line)
            if case["id"] == case_id:
                return case
    raise KeyError(f"case {case_id} not in {CASES}")

"""Instruction-following adapter: IFEval / IFBench prompts -> RL rows for the IFEval-style verifier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corpora.adapters._common import json_value, require, text, user
from corpora.registry import SourceSpec
from corpora.schema import RecordError


def clean_kwargs(kwargs: Any, n: int) -> list[dict[str, Any]]:
    """One kwargs dict per instruction, null-valued keys dropped.

    Hugging Face loaders (and IFBench's own file) pad every kwargs dict with all
    keys used by any instruction, set to null; the checkers take only their own
    keys, so the nulls are removed. A null entry means "no arguments" (``{}``).

    Raises:
        RecordError: when ``kwargs`` is not a list of ``n`` objects.
    """
    kwargs = json_value(kwargs, "kwargs")
    if not isinstance(kwargs, list) or len(kwargs) != n:
        raise RecordError(f"kwargs: expected a list of {n} objects (one per instruction)")
    out = []
    for i, kw in enumerate(kwargs):
        kw = json_value(kw, f"kwargs[{i}]")
        if kw is None:
            kw = {}
        if not isinstance(kw, dict):
            raise RecordError(f"kwargs[{i}]: expected an object")
        out.append({k: v for k, v in kw.items() if v is not None})
    return out


def ifeval(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """IFEval / IFBench jsonl ``{key, prompt, instruction_id_list, kwargs}`` -> RL row
    (``agent_ref`` ``instruction_following``) with the instruction ids and cleaned kwargs."""
    key, prompt, ids, kwargs = require(raw, "key", "prompt", "instruction_id_list", "kwargs")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise RecordError("instruction_id_list: expected a non-empty list of strings")
    return {"responses_create_params": {"input": user(text(prompt, "prompt"))},
            "agent_ref": "instruction_following", "instruction_id_list": ids,
            "kwargs": clean_kwargs(kwargs, len(ids)), "metadata": {"key": key}}

"""Long-context verifier (``agent_ref`` ``long_context``): normalized exact match of the needle answer(s),
read in the answer format the prompt asks for.

ground_truth ``{"answers": [...], "match": "all" | "any"}`` (default ``"any"``). Normalization
(SQuAD-style): Unicode NFKC, lower-case, punctuation removed, articles a/an/the removed, whitespace
collapsed. The predicted answer is the last ``\\boxed{}`` of the final answer if it has one, else the
whole final answer.

``"any"``: the normalized prediction equals one normalized answer (binary).

``"all"`` (RULER style: ``niah_single``, ``variable_tracking``): the prediction is read as a SET of
items in the format the prompt asks for (:func:`answer_format`), from the tail of the last user
message (the question follows the haystack):

* ``separated by spaces`` / ``space-separated`` (multi_hop rows): split on whitespace;
  ``separated by commas`` / ``comma-separated``: on commas; ``semicolons``: on semicolons;
  ``one per line`` / ``separated by newlines``: on line breaks;
* ``Answer with the number only`` and any other single-answer wording (needle rows): the whole
  prediction is ONE item, so ``6090601, 1234567`` is not ``6090601``;
* no prompt (a verl row carries none): ``metadata.kind`` (``multi_hop``: spaces, ``needle``: one
  item); else one item for a single answer, and for several answers commas, semicolons, line breaks,
  plus whitespace when no answer holds a space.

Each item is normalized, empty items dropped, duplicates merged. Reward 1 only for the exact set
(binary, as every RLVR reward here): a correct answer in the prompt's format scores 1; an extra item
or a missing one scores 0. A share for partial answers (``|found| / max(|items|, |answers|)``, kept
in ``details["overlap"]``) would pay a policy for listing every candidate of the haystack or for the
first hop of a chain it never followed.
"""

from __future__ import annotations

import ast
import json
import re
import string
import unicodedata
from typing import Any

from common.answers import last_boxed
from validators.verifiers.registry import (
    Verdict,
    Verifier,
    fail,
    ground_truth,
    metadata,
)

#: How far back from the end of the last user message the answer-format instruction is looked for.
FORMAT_TAIL = 600
_PUNCT = set(string.punctuation)
_SEPARATORS = {"spaces": r"\s+", "commas": r",", "semicolons": r";", "lines": r"\n+"}
_FORMAT = [
    ("spaces", re.compile(r"separated\s+by\s+(?:a\s+)?(?:single\s+)?(?:spaces?|whitespace)|space[- ]separated", re.I)),
    ("commas", re.compile(r"separated\s+by\s+(?:a\s+)?commas?|comma[- ]separated", re.I)),
    ("semicolons", re.compile(r"separated\s+by\s+(?:a\s+)?semicolons?|semicolon[- ]separated", re.I)),
    ("lines", re.compile(r"separated\s+by\s+(?:new\s*lines?|line\s+breaks?)|one\s+per\s+line|newline[- ]separated", re.I)),
    ("single", re.compile(r"\b(?:answer|reply|respond)\s+with\s+(?:the|a|one|only\s+the)\s+[\w -]{1,40}?\bonly\b|"
                          r"\banswer\s+with\s+only\b|\bonly\s+the\s+(?:number|answer|word|name)\b", re.I)),
]
_KIND_FORMAT = {"multi_hop": "spaces", "needle": "single"}


def normalize_answer(text: str) -> str:
    """SQuAD-style normalization (see the module doc)."""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _last_user_text(row: dict[str, Any]) -> str:
    params = row.get("responses_create_params") or {}
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            try:
                params = ast.literal_eval(params)
            except (ValueError, SyntaxError):
                return ""
    messages = params.get("input") if isinstance(params, dict) else None
    if isinstance(messages, str):
        return messages
    for msg in reversed(messages or []):
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def answer_format(row: dict[str, Any]) -> str | None:
    """The answer format the row asks for: ``"spaces"``, ``"commas"``, ``"semicolons"``, ``"lines"``
    (a list), ``"single"`` (one answer), or None when neither the prompt nor ``metadata.kind`` says."""
    tail = _last_user_text(row)[-FORMAT_TAIL:]
    hits = [(m.start(), name) for name, pat in _FORMAT for m in pat.finditer(tail)]
    if hits:
        return max(hits)[1]
    return _KIND_FORMAT.get(metadata(row).get("kind"))


def answer_items(pred: str, fmt: str | None, golds: list[str]) -> set[str]:
    """The normalized, non-empty items of ``pred`` read in format ``fmt`` (see the module doc)."""
    if fmt is None:
        if len(golds) == 1:
            fmt = "single"
        else:
            fmt = "fallback"
    if fmt == "single":
        parts = [pred]
    elif fmt == "fallback":
        sep = r"[,;\n]" if any(" " in g for g in golds) else r"[,;\s]+"
        parts = re.split(sep, pred)
    else:
        parts = re.split(_SEPARATORS[fmt], pred)
    return {n for n in map(normalize_answer, parts) if n}


class LongContextVerifier(Verifier):
    """Normalized exact match in the prompt's answer format (see the module doc)."""

    def check(self, row: dict[str, Any]) -> None:
        gt = ground_truth(row, "answers")
        if not isinstance(gt["answers"], list) or not gt["answers"] or not all(
                isinstance(a, str) and normalize_answer(a) for a in gt["answers"]):
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth.answers must be a non-empty list of answers")
        if gt.get("match", "any") not in ("any", "all"):
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth.match {gt['match']!r} not in ('any', 'all')")

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        gt = ground_truth(row, "answers")
        pred = last_boxed(answer)
        pred = answer if pred is None else pred
        golds = list(dict.fromkeys(normalize_answer(a) for a in gt["answers"]))
        if gt.get("match", "any") == "any":
            ok = normalize_answer(pred) in golds
            return Verdict(1.0, True, "exact match") if ok else fail("no answer matches", extracted=pred)
        fmt = answer_format(row)
        items = answer_items(pred, fmt, golds)
        found = [g in items for g in golds]
        n, extra = sum(found), sorted(items - set(golds))
        exact = n == len(golds) and not extra
        return Verdict(1.0 if exact else 0.0, exact, f"{n}/{len(golds)} answers found, {len(extra)} extra item(s)",
                       {"found": found, "extra": extra[:20], "format": fmt,
                        "overlap": n / max(len(items), len(golds))})

"""Long-context verifier (``agent_ref`` ``long_context``): normalized exact match of the needle answer(s).

ground_truth ``{"answers": [...], "match": "all" | "any"}`` (default ``"any"``). Normalization
(SQuAD-style): Unicode NFKC, lower-case, punctuation removed, articles a/an/the removed, whitespace
collapsed. The predicted answer is the last ``\\boxed{}`` of the final answer if it has one, else the
whole final answer. ``"any"``: the normalized prediction equals one normalized answer.
``"all"`` (multi-needle, RULER ``niah_multivalue`` style): the prediction, split on commas,
semicolons and newlines, holds every answer (as normalized items; extra items allowed), reward =
fraction found, passed when all are.
"""

from __future__ import annotations

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
)


def normalize_answer(text: str) -> str:
    """SQuAD-style normalization (see the module doc)."""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


class LongContextVerifier(Verifier):
    """Normalized exact match (see the module doc)."""

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
        golds = [normalize_answer(a) for a in gt["answers"]]
        if gt.get("match", "any") == "any":
            ok = normalize_answer(pred) in golds
            return Verdict(1.0, True, "exact match") if ok else fail("no answer matches", extracted=pred)
        items = {normalize_answer(p) for p in re.split(r"[,;\n]", pred)}
        found = [g in items for g in golds]
        n = sum(found)
        return Verdict(n / len(golds), n == len(golds), f"{n}/{len(golds)} answers found", {"found": found})

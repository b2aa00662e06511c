"""Multiple-choice verifier (``agent_ref`` ``mcqa``): ground_truth ``{"answer": "C", "options": {...}}``.

Strict extraction (:func:`extract_choice`, the default) takes the LAST of these in the final answer:

1. a match of the row's ``metadata.output_regex`` (group 1 = the letter; ``\\boxed{C}`` for the
   rows built here);
2. ``\\boxed{C}`` / ``\\boxed{\\text{C}}`` / ``\\boxed{(C)}``;
3. an answer cue followed by a standalone option letter: ``Answer: C``, ``answer is C``,
   ``answer is (C)``, ``**Answer: B**``, ``correct option is C`` (cue case-insensitive, letter
   upper-case and not followed by a letter or digit);
4. the whole final answer being a single letter (``C``, ``(C)``, ``C.``).

Several answers: the LAST one found counts (``Answer: A ... Answer: C`` is C), so listing every
option, or several cues or boxes, earns exactly what its last choice alone earns, never more.
Capitals elsewhere in prose (``Option A is a trap``, the pronoun ``I``, ``\\Delta``) are never
picked; ``ANSWER: Difficult`` gives no letter. Lenient mode (``metadata.mcqa_lenient: true``)
adds, only when strict finds nothing: the one option whose full text occurs in the answer
(case-insensitive; ambiguous when several do), else the last parenthesised letter ``(C)``.
Binary reward.
"""

from __future__ import annotations

import re
from typing import Any

from common.answers import last_boxed
from validators.verifiers.registry import (
    Verdict,
    Verifier,
    fail,
    ground_truth,
    metadata,
)

_CUE = (r"(?i:\banswer\b(?:\s+is|\s+would\s+be|\s+should\s+be)?|\bcorrect\s+(?:answer|option|choice)\s+is|"
        r"\bfinal\s+answer\s+is|\boption\s+is)")


def _strict_patterns(letters: str) -> list[re.Pattern[str]]:
    cls = f"[{re.escape(letters)}]"
    tail = r"(?![A-Za-z0-9])"
    return [
        re.compile(_CUE + r"\s*[:：]?\s*(?:\*\*|\*|\$|\\text\{|\\textbf\{|\(|\[)*\s*(?:option\s+)?(" + cls + ")" + tail),
        re.compile(r"^\W*(" + cls + r")\W*$"),
    ]


def extract_choice(answer: str, letters: str, output_regex: str | None = None, lenient: bool = False,
                   options: dict[str, str] | None = None) -> str | None:
    """The option letter chosen in ``answer`` (see the module doc), or None.

    Args:
        answer: the final answer (reasoning already stripped).
        letters: the valid option letters, e.g. ``"ABCD"``.
        output_regex: the row's regex (group 1 = letter), tried with the strict patterns.
        lenient: also use the lenient rules when strict finds nothing.
        options: ``{letter: text}``, for the lenient option-text rule.
    """
    found: list[tuple[int, str]] = []
    if output_regex:
        found += [(m.start(), m.group(1)) for m in re.finditer(output_regex, answer)]
    for pat in _strict_patterns(letters):
        found += [(m.start(1), m.group(1)) for m in pat.finditer(answer)]
    box = last_boxed(answer)
    if box is not None:
        inner = re.fullmatch(r"\s*(?:\\text(?:bf)?\{)?\s*\(?([A-Z])\)?\s*\}?\s*", box)
        if inner and inner.group(1) in letters:
            found.append((answer.rfind(box), inner.group(1)))
    found = [(pos, letter) for pos, letter in found if letter in letters]
    if found:
        return max(found)[1]
    if not lenient:
        return None
    if options:
        hits = [k for k, text in options.items() if text.strip() and text.strip().lower() in answer.lower()]
        if len(hits) == 1:
            return hits[0]
    paren = re.findall(r"\(([" + re.escape(letters) + r"])\)", answer)
    return paren[-1] if paren else None


class MCQAVerifier(Verifier):
    """Letter match against ``ground_truth.answer`` (see the module doc)."""

    sft_domain = "science"

    def check(self, row: dict[str, Any]) -> None:
        gt, uid = ground_truth(row, "answer", "options"), row.get("uuid")
        options = gt["options"]
        if not isinstance(options, dict) or len(options) < 2 or not all(
                re.fullmatch(r"[A-Z]", k) and isinstance(v, str) for k, v in options.items()):
            raise ValueError(f"row {uid!r}: ground_truth.options must map two or more letters A-Z to option texts")
        if not isinstance(gt["answer"], str) or gt["answer"] not in options:
            raise ValueError(f"row {uid!r}: ground_truth.answer {gt['answer']!r} is not an option key")
        regex = metadata(row).get("output_regex")
        if regex is not None:
            try:
                if re.compile(regex).groups < 1:
                    raise ValueError("no capturing group")
            except (re.error, ValueError) as exc:
                raise ValueError(f"row {row.get('uuid')!r}: metadata.output_regex is invalid: {exc}") from None

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        gt, meta = ground_truth(row), metadata(row)
        letters = "".join(sorted(gt["options"]))
        choice = extract_choice(answer, letters, meta.get("output_regex"), bool(meta.get("mcqa_lenient")),
                                gt["options"])
        details = {"extracted": choice, "gold": gt["answer"]}
        if choice is None:
            return fail("no option letter found", **details)
        if choice == gt["answer"]:
            return Verdict(1.0, True, "correct option", details)
        return fail("wrong option", **details)

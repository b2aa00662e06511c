"""Multiple-choice verifier (``agent_ref`` ``mcqa``): ground_truth ``{"answer": "C", "options": {...}}``.

Strict extraction (:func:`extract_choice`, the default) reads the final answer in tiers; the first
tier that names any option letter decides:

1. the declared answer: every ``\\boxed{}`` / ``\\fbox{}`` whose whole content is one option letter
   (``\\boxed{C}``, ``\\boxed{\\text{C}}``, ``\\boxed{(C)}``, ``\\boxed{C.}``), located where the box
   stands, and every match of the row's ``metadata.output_regex`` (a regex or a list of them, NeMo-Gym's
   ``template_metadata.output_regex``; matched case-insensitively as NeMo-Gym does; the capture is
   group 1, or the whole match in a regex without a group; it counts when it is one upper-case option
   letter, wrapped as in a box or not: NeMo-Gym also upper-cases a lower-case capture, which would
   read the article ``a`` as option A);
2. an answer cue followed by a standalone option letter: ``Answer: C``, ``answer is C``,
   ``answer is (C)``, ``**Answer: B**``, ``correct option is C``, ``final answer: C`` (cue
   case-insensitive, letter upper-case and not followed by a letter or digit; after a bare
   ``answer`` with no ``is`` / colon the letter must end the clause, so ``Answer A is wrong`` is
   prose, not a choice), plus every letter chained to it (``answer is A or C``, ``A/C``, ``A, C``);
3. the whole final answer being a single letter (``C``, ``(C)``, ``C.``).

A box therefore wins over anything the text says after it (``\\boxed{B}. Because Apples...``,
``\\boxed{C}\\nA note: ...``: B and C); words starting with an option letter, the pronoun ``I`` and
letters inside math (``\\Delta``) are never picked; ``ANSWER: Difficult`` gives no letter.

Hedging scores 0: when the deciding tier names two or more DIFFERENT letters (``\\boxed{A}
\\boxed{C}``, ``Answer: A ... Answer: C``, ``The answer is A or C``) there is no choice
(:func:`chosen_letters` lists them; the verdict says ``hedged``). The same letter repeated is one
choice. Lenient mode (``metadata.mcqa_lenient: true``) adds, only when strict finds no letter at
all (a hedge stays a hedge): the one option whose full text occurs in the answer (case-insensitive;
ambiguous when several do), else the last parenthesised letter ``(C)``. Binary reward.
"""

from __future__ import annotations

import re
from typing import Any

from validators.verifiers.registry import (
    Verdict,
    Verifier,
    fail,
    ground_truth,
    metadata,
)

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BOX_LETTER = re.compile(r"\s*(?:\\(?:text|textbf|mathrm|mathbf)\s*\{)?\s*[(\[]?\s*([A-Z])\s*[)\]]?\s*\.?\s*\}?\s*\.?\s*")
_STRONG_CUE = (r"(?i:\banswer\b\s*(?:is|would\s+be|should\s+be|will\s+be)?\s*[:：]|"
               r"\banswer\s+(?:is|would\s+be|should\s+be|will\s+be)\b|"
               r"\bcorrect\s+(?:answer|option|choice)\s+is\b|\bfinal\s+answer\s+is\b|\boption\s+is\b)")
_BARE_CUE = r"(?i:\banswer\b)"
_PREFIX = r"\s*[:：]?\s*(?:\*\*|\*|\$|\\text\{|\\textbf\{|\(|\[)*\s*(?i:option\s+)?"
_TAIL = r"(?![A-Za-z0-9])"
_END = r"(?=\s*(?:[.,;:!?/&)\]*$}]|$|(?:or|and)\b))"


def _boxes(text: str) -> list[tuple[int, str]]:
    """``(position, content)`` of every terminated ``\\boxed{}`` / ``\\fbox{}`` (braces balanced;
    ``\\boxed C`` is the box of the next token)."""
    out = []
    for m in _BOX_OPEN.finditer(text):
        rest = text[m.end():]
        if not rest.lstrip(" ").startswith("{"):
            token = re.match(r"\s+([^\s$]+)", rest)
            if token:
                out.append((m.start(), token.group(1)))
            continue
        i, depth = m.end() + len(rest) - len(rest.lstrip(" ")), 0
        for k in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                out.append((m.start(), text[i + 1:k]))
                break
    return out


def _cue_letters(answer: str, letters: str) -> list[tuple[int, str]]:
    cls = f"[{re.escape(letters)}]"
    chain = re.compile(r"\s*(?:,|/|&|\bor\b|\band\b)\s*(?i:option\s+)?[(\[]?(" + cls + r")[)\]]?" + _TAIL + _END)
    found = []
    for pat in (re.compile(_STRONG_CUE + _PREFIX + "(" + cls + ")" + _TAIL),
                re.compile(_BARE_CUE + _PREFIX + "(" + cls + ")" + _TAIL + r"[)\]*]*" + _END)):
        for m in pat.finditer(answer):
            found.append((m.start(1), m.group(1)))
            end = m.end()
            while (more := chain.match(answer, end)) is not None:
                found.append((more.start(1), more.group(1)))
                end = more.end()
    return found


def output_regexes(value: str | list[str] | None) -> list[re.Pattern[str]]:
    """``metadata.output_regex`` (a regex, a list of them, or None) compiled case-insensitively.

    Raises:
        ValueError: a regex does not compile, or the value is neither a string nor a list of strings.
    """
    if value is None:
        return []
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ValueError("metadata.output_regex must be a regex or a list of regexes")
    try:
        return [re.compile(p, re.IGNORECASE) for p in patterns]
    except re.error as exc:
        raise ValueError(f"metadata.output_regex is invalid: {exc}") from None


def _regex_letters(answer: str, output_regex: str | list[str] | None) -> list[tuple[int, str]]:
    found = []
    for pattern in output_regexes(output_regex):
        for m in pattern.finditer(answer):
            group = 1 if pattern.groups else 0
            inner = _BOX_LETTER.fullmatch(m.group(group) or "")
            if inner:
                found.append((m.start(group), inner.group(1)))
    return found


def chosen_letters(answer: str, letters: str, output_regex: str | list[str] | None = None) -> list[str]:
    """The distinct option letters the deciding strict tier names, in order of position (see the
    module doc): one letter is a choice, several are a hedge, none is no answer."""
    tiers: list[list[tuple[int, str]]] = [[], [], []]
    tiers[0] += _regex_letters(answer, output_regex)
    for pos, box in _boxes(answer):
        inner = _BOX_LETTER.fullmatch(box)
        if inner:
            tiers[0].append((pos, inner.group(1)))
    tiers[1] = _cue_letters(answer, letters)
    whole = re.fullmatch(r"\W*([A-Z])\W*", answer)
    if whole:
        tiers[2].append((whole.start(1), whole.group(1)))
    for tier in tiers:
        valid = sorted((pos, letter) for pos, letter in tier if letter in letters)
        if valid:
            return list(dict.fromkeys(letter for _, letter in valid))
    return []


def extract_choice(answer: str, letters: str, output_regex: str | list[str] | None = None, lenient: bool = False,
                   options: dict[str, str] | None = None) -> str | None:
    """The option letter chosen in ``answer`` (see the module doc), or None (no letter, or a hedge
    over several different letters).

    Args:
        answer: the final answer (reasoning already stripped).
        letters: the valid option letters, e.g. ``"ABCD"``.
        output_regex: the row's regex or regexes (see the module doc), tried with the boxes.
        lenient: also use the lenient rules when strict finds no letter.
        options: ``{letter: text}``, for the lenient option-text rule.
    """
    chosen = chosen_letters(answer, letters, output_regex)
    if chosen:
        return chosen[0] if len(chosen) == 1 else None
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
        try:
            output_regexes(metadata(row).get("output_regex"))
        except ValueError as exc:
            raise ValueError(f"row {uid!r}: {exc}") from None

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        gt, meta = ground_truth(row), metadata(row)
        letters = "".join(sorted(gt["options"]))
        chosen = chosen_letters(answer, letters, meta.get("output_regex"))
        if len(chosen) > 1:
            return fail(f"hedged: several options chosen ({', '.join(chosen)})", extracted=None,
                        gold=gt["answer"], chosen=chosen)
        choice = extract_choice(answer, letters, meta.get("output_regex"), bool(meta.get("mcqa_lenient")),
                                gt["options"])
        details = {"extracted": choice, "gold": gt["answer"]}
        if choice is None:
            return fail("no option letter found", **details)
        if choice == gt["answer"]:
            return Verdict(1.0, True, "correct option", details)
        return fail("wrong option", **details)

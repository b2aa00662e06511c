"""Multiple-choice adapters (ARC, OpenBookQA, SciQ, MedMCQA, MMLU) -> RL rows for the ``mcqa`` verifier.

Every source goes through :func:`mcq_row`: one prompt layout, options lettered
A, B, C..., the gold letter in ``ground_truth.answer`` and a regex that reads the
letter from ``\\boxed{X}`` in ``metadata.output_regex``.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from corpora.adapters._common import require, strings, text, user
from corpora.registry import SourceSpec
from corpora.schema import RecordError

MCQ_INSTRUCTION = "Answer with the letter of the correct option in \\boxed{}, e.g. \\boxed{A}."


def output_regex(letters: str) -> str:
    """A regex whose group 1 is the option letter in ``\\boxed{C}`` or ``\\boxed{\\text{C}}``."""
    return r"\\boxed\{\s*(?:\\text\{\s*)?([" + letters + r"])\s*\}?\s*\}"


def mcq_row(question: str, options: list[str], gold: Any, item_id: Any, **meta: Any) -> dict[str, Any]:
    """The RL row of one multiple-choice item.

    Args:
        question: the stem.
        options: option texts in display order (lettered A, B, C...).
        gold: 0-based index of the correct option.
        item_id: the source's item id, kept as ``metadata.id``.
        meta: further metadata (subject, ...).

    Raises:
        RecordError: fewer than two options, an empty option, or a gold index
            that is not an int inside the option range.
    """
    if len(options) < 2 or len(options) > 26:
        raise RecordError(f"options: {len(options)} options")
    for i, opt in enumerate(options):
        if not isinstance(opt, str) or not opt.strip():
            raise RecordError(f"options[{i}]: empty option")
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(options):
        raise RecordError(f"gold: index {gold!r} is outside the {len(options)} options")
    options = [opt.strip() for opt in options]
    letters = string.ascii_uppercase[:len(options)]
    lines = "\n".join(f"{letter}. {opt}" for letter, opt in zip(letters, options, strict=True))
    prompt = f"{question.strip()}\n\n{lines}\n\n{MCQ_INSTRUCTION}"
    return {"responses_create_params": {"input": user(prompt)}, "agent_ref": "mcqa", "domain": "stem_mcqa",
            "ground_truth": {"answer": letters[gold], "options": dict(zip(letters, options, strict=True))},
            "metadata": {"output_regex": output_regex(letters), "id": item_id,
                         "question": f"{question.strip()}\n{lines}", **meta}}


def parse_query(query: str, labels: list[str]) -> tuple[str, list[str]]:
    """Split an oe-eval MC ``query`` (``Question: ...\\n A. opt\\n B. opt\\nAnswer:``) into
    the question and the option texts, in the order of ``labels``.

    Raises:
        RecordError: when the query does not have that layout.
    """
    head, tail = "Question: ", "\nAnswer:"
    if not (query.startswith(head) and query.endswith(tail)):
        raise RecordError("query: not 'Question: ... Answer:'")
    body = query[len(head):-len(tail)]
    starts, pos = [], 0
    for label in labels:
        i = body.find(f"\n {label}. ", pos)
        if i < 0:
            raise RecordError(f"query: option {label!r} not found")
        starts.append(i)
        pos = i + 1
    ends = starts[1:] + [len(body)]
    options = [body[s + len(f"\n {label}. "):e] for label, s, e in zip(labels, starts, ends, strict=True)]
    return body[:starts[0]], options


def _query_item(raw: dict[str, Any]) -> tuple[str, list[str], Any]:
    query, labels, gold = require(raw, "query", "choices", "gold")
    question, options = parse_query(text(query, "query"), strings(labels, "choices"))
    return question, options, gold


def arc(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """oe-eval ARC doc ``{id, query, choices: [labels], gold}``: the option texts are only
    in ``query``; 3-5 options."""
    question, options, gold = _query_item(raw)
    return mcq_row(question, options, gold, raw.get("id"))


def openbookqa(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """oe-eval OpenBookQA doc ``{id, query, choices: [labels], gold}`` (same layout as ARC)."""
    question, options, gold = _query_item(raw)
    return mcq_row(question, options, gold, raw.get("id"))


def sciq(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """oe-eval SciQ doc ``{index, question, correct_answer, distractor1-3, query, choices, gold}``.

    The option order is the query's (oe-eval shuffled it once); the gold option
    must equal ``correct_answer``, else RecordError.
    """
    question, correct = require(raw, "question", "correct_answer")
    question, correct = text(question, "question"), text(correct, "correct_answer")
    _, options, gold = _query_item(raw)
    if isinstance(gold, int) and 0 <= gold < len(options) and options[gold].strip() != correct.strip():
        raise RecordError(f"gold: option {gold} is {options[gold]!r}, correct_answer is {correct!r}")
    return mcq_row(question, options, gold, raw.get("index"))


def medmcqa(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """oe-eval MedMCQA doc ``{id, question, opa, opb, opc, opd, cop, subject_name, topic_name}``;
    ``cop`` is the 0-based gold index (this is the validation split: the test split has no answers)."""
    question, a, b, c, d, cop = require(raw, "question", "opa", "opb", "opc", "opd", "cop")
    return mcq_row(text(question, "question"), [a, b, c, d], cop, raw.get("id"),
                   subject=raw.get("subject_name"), topic=raw.get("topic_name"))


def mmlu(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """MMLU (``hails/mmlu_no_train`` saved to disk) ``{question, subject, choices, answer}``;
    ``answer`` is the 0-based gold index. MMLU has no item id (``metadata.id`` is null)."""
    question, subject, choices, answer = require(raw, "question", "subject", "choices", "answer")
    if not isinstance(choices, list):
        raise RecordError(f"choices: expected a list, got {type(choices).__name__}")
    return mcq_row(text(question, "question"), choices, answer, None, subject=subject)

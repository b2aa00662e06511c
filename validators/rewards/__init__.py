"""Rewards in other trainers' own signatures, thin wrappers over the one verifier registry.

- :mod:`.trl`: ``reward_funcs`` callables for TRL's ``GRPOTrainer``
  (``f(prompts, completions, completion_ids=None, **columns) -> list[float | None]``);
- :mod:`.verl`: ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` for verl's
  ``custom_reward_function``;
- :mod:`.nemo_gym`: ``verify(body) -> {"reward": ...}`` for a NeMo-Gym resources server.

Each wrapper only turns its trainer's inputs into ``(response text, canonical RL row)`` and grades
them with :func:`grade`: the row's verifier (``agent_ref``, :mod:`validators.verifiers.registry`) in
the worker processes of a :class:`~validators.verifiers.batch.VerifierPool`, under a wall-clock limit
per sample, so a policy output that hangs a grader costs that sample, never the trainer. The
verdicts are therefore :func:`validators.verifiers.verify`'s, everywhere.

What a response is (:func:`graded_text`): a trajectory is a list of the policy's turns, each its
reasoning and its text (content, then tool calls as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
blocks). Each turn's reasoning is set aside (the final-answer rule of :mod:`common.answers`, turn by
turn, so a later turn's reasoning never hides an earlier turn's tool calls), and the answers of all turns
are graded together. Tool results and other environment output are never the policy's answer. A turn
whose reasoning never closed, or that has reasoning and nothing after it (what a trainer's parser makes
of a completion cut off while thinking), leaves the trajectory without a final answer: reward 0.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from common.answers import THINK_OPEN, final_answer
from validators.verifiers.batch import VerifierPool
from validators.verifiers.registry import Verdict, get_verifier

#: Content-part types that carry text (chat messages, Responses API output and reasoning items).
TEXT_PARTS = ("text", "output_text", "input_text", "reasoning_text", "summary_text")
#: Default wall-clock seconds per graded sample and worker processes of the shared pool.
TIMEOUT_S, WORKERS = 10.0, 2


@functools.cache
def shared_pool(workers: int = WORKERS, timeout_s: float = TIMEOUT_S) -> VerifierPool:
    """The process-wide :class:`VerifierPool` of these settings (its workers start on first use and
    stop when the process exits)."""
    import atexit

    pool = VerifierPool(workers, timeout_s)
    atexit.register(pool.close)
    return pool


def grades_responses(row: dict[str, Any]) -> bool:
    """Whether ``row``'s verifier grades one response alone (False for a judge's rows, ``genrm``; a
    ``swe`` row grades one response as a patch).

    Raises:
        ValueError: naming the row when its ``agent_ref`` is no installed verifier (a data error,
            never a silent ``None``).
    """
    try:
        return get_verifier(row.get("agent_ref")).grades_responses
    except KeyError as exc:
        raise ValueError(f"row {row.get('uuid')!r}: agent_ref {row.get('agent_ref')!r}: {exc.args[0]}") from None


def grade(responses: list[str], rows: list[dict[str, Any]], workers: int = WORKERS,
          timeout_s: float = TIMEOUT_S) -> list[Verdict | None]:
    """``verify(responses[i], rows[i])`` for each i, in the shared pool's workers.

    Returns:
        One verdict per response, in order; ``None`` where the row's verifier does not grade single
        responses (:func:`grades_responses`). A grader failure is a verdict with ``error`` set.

    Raises:
        ValueError: lengths differ, or a row names no installed verifier, or its verifier spec is
            invalid (checked here, ``Verifier.check``: a row that lost its ``ground_truth`` or
            ``kwargs`` on the way into a trainer is an error, never a reward of 0).
    """
    if len(responses) != len(rows):
        raise ValueError(f"{len(responses)} responses but {len(rows)} rows")
    graded = [i for i, row in enumerate(rows) if grades_responses(row)]
    for i in graded:
        get_verifier(rows[i]["agent_ref"]).check(rows[i])
    out: list[Verdict | None] = [None] * len(rows)
    if graded:
        verdicts = shared_pool(workers, timeout_s).verify([responses[i] for i in graded], [rows[i] for i in graded])
        for i, verdict in zip(graded, verdicts, strict=True):
            out[i] = verdict
    return out


def tool_call_block(name: str, arguments: Any) -> str:
    """A tool call as the verifiers read it: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
    (``arguments`` an object or its JSON string, kept as given)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}</tool_call>"


def graded_text(turns: list[tuple[str | None, str]]) -> str:
    """The response graded for a trajectory of policy turns ``(reasoning, text)`` (see the module doc):
    the final answers of the turns joined by newlines, or an unclosed ``<think>`` (no final answer)
    when a turn's reasoning never closed or a turn is reasoning alone (``reasoning`` not None, even
    empty, and no text)."""
    answers = []
    for reasoning, text in turns:
        answer = final_answer(text if reasoning is None else f"<think>{reasoning}</think>{text}")
        if answer is None or (reasoning is not None and not text.strip()):
            return THINK_OPEN
        answers.append(answer)
    return "\n".join(answers)


def text_of(parts: Any, where: str) -> str:
    """A message's text: a string, or the concatenated ``text`` of the text parts of a list
    (``type`` ``text``, ``output_text``, ``input_text``, ``reasoning_text``, ``summary_text``; other
    parts carry no text); None is "".

    Raises:
        ValueError: naming ``where`` for any other shape.
    """
    if parts is None or isinstance(parts, str):
        return parts or ""
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise ValueError(f"{where}: content must be a string or a list of content parts, got {parts!r:.80}")
    texts = [p.get("text") for p in parts if p.get("type") in TEXT_PARTS]
    if not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{where}: a text part's text is not a string")
    return "".join(texts)

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

What a response is: the text the policy wrote, reasoning as ``<think>...</think>``, tool calls as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks. Only the policy's own turns count:
tool results and other environment output in a trajectory are never graded as the answer.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from validators.verifiers.batch import VerifierPool
from validators.verifiers.registry import Verdict, get_verifier

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
    """Whether ``row``'s verifier grades one response alone (False for a judge's or an agent
    episode's rows: ``genrm``, ``swe``).

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
        ValueError: lengths differ, or a row names no installed verifier.
    """
    if len(responses) != len(rows):
        raise ValueError(f"{len(responses)} responses but {len(rows)} rows")
    graded = [i for i, row in enumerate(rows) if grades_responses(row)]
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


def think_block(reasoning: str | None) -> str:
    """``<think>reasoning</think>`` (empty when there is no reasoning)."""
    return f"<think>{reasoning}</think>" if reasoning else ""

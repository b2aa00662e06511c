"""TRL ``reward_funcs``: the verifier registry in ``GRPOTrainer``'s reward-function signature.

>>> from trl import GRPOTrainer
>>> from curation.trainer_layouts import load_for_trl
>>> from validators.rewards.trl import reward_funcs
>>> trainer = GRPOTrainer(model, reward_funcs=reward_funcs(), train_dataset=load_for_trl("release/rl", "math"))
... # doctest: +SKIP

TRL calls each function as ``f(prompts=..., completions=..., completion_ids=..., **columns)``, every
dataset column (``agent_ref``, ``ground_truth``, ``kwargs``...) repeated once per completion, and
expects one reward per completion, ``None`` where the function does not apply to the row (TRL sums
the functions that do, and warns when none does). A completion is a string (plain prompts) or a list
of messages (conversational prompts, :func:`completion_text`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from common import plugins
from corpora.schema import RL_SCHEMA
from validators.rewards import TIMEOUT_S, WORKERS, grade, graded_text, text_of, tool_call_block
from validators.verifiers.registry import get_verifier

RewardFunc = Callable[..., list[float | None]]
#: Columns TRL adds to the reward kwargs that are not dataset columns.
TRAINER_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")
#: Message keys chat templates and parsers put reasoning under.
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The response a verifier grades, from a TRL completion.

    A string is the response as generated. A list of messages is a trajectory
    (:func:`validators.rewards.graded_text`): each ``assistant`` message is a policy turn, its
    reasoning (``reasoning_content``, ``reasoning`` or ``thinking``) apart from its text (``content``,
    then its ``tool_calls`` as ``<tool_call>`` blocks); tool results and other roles are never graded.

    Raises:
        ValueError: a completion, message, content or tool call of another shape (naming it).
    """
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, list):
        raise ValueError(f"a TRL completion is a string or a list of messages, got {type(completion).__name__}")
    turns = []
    for k, message in enumerate(completion):
        if not isinstance(message, dict):
            raise ValueError(f"completion message {k} is a {type(message).__name__}, not a message dict")
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function", c), dict)
                                                  for c in calls):
            raise ValueError(f"completion message {k}: tool_calls must be a list of call objects")
        blocks = "".join(tool_call_block(c.get("function", c).get("name"), c.get("function", c).get("arguments"))
                         for c in calls)
        reasoning = next((message[key] for key in REASONING_KEYS if message.get(key) is not None), None)
        if reasoning is not None and not isinstance(reasoning, str):
            raise ValueError(f"completion message {k}: reasoning is a {type(reasoning).__name__}, not a string")
        turns.append((reasoning, text_of(message.get("content"), f"completion message {k}") + blocks))
    return graded_text(turns)


def rows_from_columns(n: int, columns: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``n`` canonical RL rows of a TRL reward call, from its per-completion ``columns``.

    Raises:
        ValueError: the ``agent_ref`` column is missing (the dataset lost the verifier's columns), or
            a column does not hold one value per completion.
    """
    if "agent_ref" not in columns:
        raise ValueError("the TRL dataset has no agent_ref column, so no verifier can be chosen: keep the RL "
                         "release's columns (curation.trainer_layouts.load_for_trl, remove_unused_columns=False)")
    names = [k for k in RL_SCHEMA.names if k in columns]
    for k in names:
        if len(columns[k]) != n:
            raise ValueError(f"column {k!r} has {len(columns[k])} values for {n} completions")
    return [{k: columns[k][i] for k in names} for i in range(n)]


def reward_func(agent_ref: str | None = None, workers: int = WORKERS, timeout_s: float = TIMEOUT_S) -> RewardFunc:
    """One TRL reward function over the verifier registry.

    Args:
        agent_ref: grade only the rows of this verifier (``None`` for the others), e.g. to log each
            domain's reward apart; ``None`` grades every row with its own ``agent_ref``.
        workers, timeout_s: of the process-wide :func:`validators.rewards.shared_pool`.

    Returns:
        ``f(prompts, completions, completion_ids=None, **columns) -> list[float | None]``, named
        ``agent_ref`` (TRL logs ``rewards/<name>``): per completion, the verifier's reward in [0, 1];
        ``None`` for rows of another verifier, rows whose verifier does not grade single responses
        (``genrm`` needs a judge) and samples whose grader failed
        (``Verdict.error``: no verdict, never a 0). Inside TRL it also logs each completion's verdict
        reason (``log_extra``: column ``<name>/reason`` of the completions table) and the number of
        grader failures per call (``log_metric``: ``<name>/grader_errors``).

    Raises:
        KeyError: ``agent_ref`` is no installed verifier.
    """
    if agent_ref is not None:
        get_verifier(agent_ref)

    name = agent_ref or "verifier"

    def reward(prompts: list[Any], completions: list[Any], completion_ids: Any = None,
               **columns: Any) -> list[float | None]:
        log_extra, log_metric = columns.get("log_extra"), columns.get("log_metric")
        columns = {k: v for k, v in columns.items() if k not in TRAINER_KWARGS}
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        rows = rows_from_columns(len(completions), columns)
        mine = [i for i, row in enumerate(rows) if agent_ref is None or row["agent_ref"] == agent_ref]
        verdicts = grade([completion_text(completions[i]) for i in mine], [rows[i] for i in mine], workers, timeout_s)
        out: list[float | None] = [None] * len(completions)
        reasons: list[str | None] = [None] * len(completions)
        for i, verdict in zip(mine, verdicts, strict=True):
            out[i] = None if verdict is None or verdict.error else float(verdict.reward)
            reasons[i] = None if verdict is None else verdict.reason
        if log_extra is not None:  # TRL's completions table: why each completion got its reward
            log_extra(f"{name}/reason", reasons)
        if log_metric is not None:
            log_metric(f"{name}/grader_errors", float(sum(v is not None and v.error is not None for v in verdicts)))
        return out

    reward.__name__ = reward.__qualname__ = name
    return reward


def reward_funcs(agent_refs: Iterable[str] | None = None, workers: int = WORKERS,
                 timeout_s: float = TIMEOUT_S) -> list[RewardFunc]:
    """One :func:`reward_func` per verifier, for ``GRPOTrainer(reward_funcs=...)``: each row is graded by
    exactly one of them (its ``agent_ref``), the others give ``None``, so TRL's sum is the row's reward
    and TRL logs it per verifier.

    Args:
        agent_refs: the verifiers (default: every installed one that grades single responses).

    Raises:
        KeyError: an unknown ``agent_ref``.
    """
    names = list(agent_refs) if agent_refs is not None else [
        n for n in plugins.names("verifiers") if get_verifier(n).grades_responses]
    return [reward_func(n, workers, timeout_s) for n in names]

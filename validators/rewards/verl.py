"""verl ``compute_score``: the verifier registry as verl's custom reward function.

Point verl at this file (parquet written by ``cascade verl``, :mod:`curation.trainer_layouts`)::

    custom_reward_function.path=$(python -c "import validators.rewards.verl as m; print(m.__file__)")
    custom_reward_function.name=compute_score

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` once per response
with the row's ``data_source``, ``reward_model.ground_truth`` and ``extra_info``; ``extra_info``
carries the rest of the canonical RL row (``agent_ref``, ``instruction_id_list``, ``kwargs``,
``metadata``, ``tools``, ``uuid``). ``custom_reward_function.reward_kwargs`` may set ``timeout_s``
and ``workers``.
"""

from __future__ import annotations

from typing import Any

from validators.rewards import TIMEOUT_S, WORKERS, grade

#: ``extra_info`` keys that are fields of the canonical RL row.
ROW_FIELDS = ("uuid", "agent_ref", "instruction_id_list", "kwargs", "metadata")


def row_from_verl(data_source: str, ground_truth: Any, extra_info: dict[str, Any] | None) -> dict[str, Any]:
    """The canonical RL row of a verl sample (``data_source`` is its domain).

    Raises:
        ValueError: ``extra_info`` is missing or lacks ``agent_ref`` (not written by ``cascade verl``).
    """
    if not isinstance(extra_info, dict) or not extra_info.get("agent_ref"):
        raise ValueError(f"verl sample of data_source {data_source!r}: extra_info lacks agent_ref; write the "
                         "parquet with `cascade verl` (curation/trainer_layouts.py)")
    row = {k: extra_info.get(k) for k in ROW_FIELDS}
    ids = row["instruction_id_list"]
    if ids is not None:  # verl may hand back an array
        if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
            raise ValueError(f"row {row['uuid']!r}: extra_info.instruction_id_list must be a list, got {ids!r:.80}")
        row["instruction_id_list"] = [str(x) for x in ids]
    row.update(domain=data_source, ground_truth=ground_truth,
               responses_create_params={"input": [], "tools": extra_info.get("tools")})
    return row


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  timeout_s: float = TIMEOUT_S, workers: int = WORKERS, **_: Any) -> dict[str, float]:
    """verl's reward of one response: ``verify(solution_str, row)``, graded in a verifier worker.

    Returns:
        ``{"score": reward in [0, 1], "acc": 1.0 if passed else 0.0, "grader_error": 0.0 or 1.0}``
        (verl logs every key; the same keys on every sample). A sample whose grader failed scores 0
        with ``grader_error`` 1: verl has no way to drop one sample, so count them in its logs.

    Raises:
        ValueError: the row's verifier does not grade single responses (``genrm``: a judge compares
            responses), or ``extra_info`` is not this package's
            (:func:`row_from_verl`), or names no installed verifier.
        TypeError: ``solution_str`` is not a string (a caller's bug, never a silent 0), or ``timeout_s``
            is not a positive number of seconds (every sample would time out at 0).
    """
    if not isinstance(solution_str, str):
        raise TypeError(f"compute_score: solution_str must be the decoded response (str), got "
                        f"{type(solution_str).__name__}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise TypeError(f"compute_score: timeout_s must be positive seconds, got {timeout_s!r}")
    row = row_from_verl(data_source, ground_truth, extra_info)
    verdict = grade([solution_str], [row], workers, timeout_s)[0]
    if verdict is None:
        raise ValueError(f"row {row['uuid']!r}: agent_ref {row['agent_ref']!r} grades groups or episodes, not one "
                         "response: verl needs its own reward model or agent loop for it")
    return {"score": 0.0 if verdict.error else float(verdict.reward), "acc": float(verdict.passed and not verdict.error),
            "grader_error": float(verdict.error is not None)}

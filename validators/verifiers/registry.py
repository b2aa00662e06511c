"""The verifier registry: ``Verdict``, ``Verifier``, ``get_verifier``, ``verify``, ``check_row``.

A verifier is a :class:`Verifier` subclass installed as an entry point of group
``cascade_rl.verifiers`` under the RL row's ``agent_ref`` (NeMo-Gym convention: the row names its
environment); adding one is one file plus one line in your package's ``pyproject.toml``. Rows are
canonical RL rows (``corpora/schema.py`` ``RL_SCHEMA``): ``ground_truth``, ``kwargs`` and ``metadata``
are JSON strings (already-decoded values are accepted too).

Response format: reasoning is stripped before grading (:func:`final_answer`): the final answer is
the text after the last closing ``</think>``, verbatim; a ``<think>`` that never closes means no
final answer (reward 0, whatever the verifier); a response without think tags is its own answer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from common import plugins
from common.answers import final_answer, strict_json


@dataclass
class Verdict:
    """The grade of one response.

    Attributes:
        reward: float in [0, 1] (binary verifiers give 0.0 or 1.0).
        passed: whether the response counts as correct (pass rates and pass@k count these).
        reason: one readable line (``"ok"``, ``"timeout after 10.0s"``, ``"no \\boxed{} answer"``...).
        details: verifier-specific data (extracted answer, per-test records, isolation...).
        error: set (e.g. ``"sandbox_error"``) when the grader itself failed, so the response got
            no verdict: ``reward`` is then 0 but means nothing, and trainers must leave the sample
            out (``VerifierEnvironment`` reports it as ``None``) rather than train on it.
    """

    reward: float
    passed: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward {self.reward} outside [0, 1]")


def fail(reason: str, **details: Any) -> Verdict:
    """A zero-reward verdict."""
    return Verdict(0.0, False, reason, details)


def row_field(row: dict[str, Any], name: str) -> Any:
    """JSON field ``name`` of ``row`` decoded strictly (:func:`common.answers.strict_json`: no ``NaN`` /
    ``Infinity``, no duplicate key, bounded nesting); a non-string value is returned as is.

    Raises:
        ValueError: naming the row and the field when it is not strict JSON.
    """
    value = row.get(name)
    if not isinstance(value, str):
        return value
    try:
        return strict_json(value)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"row {row.get('uuid')!r}: {name} is not valid JSON: {exc}") from None


def ground_truth(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``row.ground_truth`` (strict JSON, :func:`row_field`) as a dict that has every key in ``keys``.

    Raises:
        ValueError: naming the row and the missing key.
    """
    gt = row_field(row, "ground_truth")
    if not isinstance(gt, dict):
        raise ValueError(f"row {row.get('uuid')!r}: ground_truth must be a JSON object, got {type(gt).__name__}")
    missing = [k for k in keys if k not in gt]
    if missing:
        raise ValueError(f"row {row.get('uuid')!r}: ground_truth lacks {', '.join(missing)}")
    return gt


def metadata(row: dict[str, Any]) -> dict[str, Any]:
    """``row.metadata`` decoded (``{}`` when absent)."""
    meta = row_field(row, "metadata")
    return meta if isinstance(meta, dict) else {}


class Verifier:
    """Base class: subclasses implement :meth:`check` (spec validation) and :meth:`score`
    (grading of the final answer). :meth:`verify` strips reasoning and calls both."""

    name: str = ""
    #: SFT domain of a conversation synthesized from rows of the RL domain this verifier grades
    #: (entry-point group ``cascade_rl.domains``); None: synthesis does not use that domain.
    sft_domain: str | None = None
    #: False when one response alone cannot be graded (a judge compares a group, an agent episode is
    #: graded as a whole): :meth:`verify` refuses, trainer-side rewards give ``None``.
    grades_responses: bool = True

    def check(self, row: dict[str, Any]) -> None:
        """Raise ValueError (naming the row and field) when ``row``'s verifier spec is invalid: the
        verifier's ground-truth contract (required keys and their types), declared here once and run
        by :func:`check_row` on every RL row before it enters a set (``cascade build``)."""

    def check_trainable(self, row: dict[str, Any]) -> None:
        """Raise ValueError (naming the row) when a valid row cannot train a policy because its reward
        can be earned without the task (code tests that a constant passes). Run by :func:`check_row`
        when a row enters an RL set, not at scoring (a held-out or hand-made row may still be graded)."""

    def warmup(self) -> None:
        """Load what the first :meth:`score` would load lazily (parsers, grammars): verifier workers call it
        before they take samples, so a sample's time limit measures grading, not imports. Default: nothing."""

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        """Grade ``answer`` (the final answer, reasoning stripped) against ``row``."""
        raise NotImplementedError

    def verify(self, response: str, row: dict[str, Any]) -> Verdict:
        """Grade ``response`` (raw model output) against ``row``.

        Raises:
            ValueError: the row's spec is invalid (see :meth:`check`).
        """
        self.check(row)
        answer = final_answer(response)
        if answer is None:
            return fail("unclosed <think> block: no final answer")
        return self.score(answer, row)


@functools.cache
def get_verifier(agent_ref: str) -> Verifier:
    """The verifier installed as ``agent_ref`` (entry-point group ``cascade_rl.verifiers``, one
    instance per process; :mod:`common.plugins`), in this process and in every verifier worker.

    Raises:
        KeyError: listing the installed verifiers.
    """
    cls = plugins.load("verifiers", agent_ref)
    verifier = cls()
    verifier.name = agent_ref
    return verifier


def verify(response: str, row: dict[str, Any]) -> Verdict:
    """Grade ``response`` with the verifier of ``row["agent_ref"]`` (in this process, no timeout:
    use :func:`validators.verifiers.batch.verify_batch` for untrusted volume).

    Raises:
        KeyError: unknown ``agent_ref``.
        ValueError: the row's verifier spec is invalid.
    """
    return get_verifier(row.get("agent_ref")).verify(response, row)


JSON_FIELDS = ("ground_truth", "kwargs", "metadata")  # the RL row's JSON strings (corpora/schema.py)


def check_row(row: dict[str, Any]) -> None:
    """Validate ``row`` against its verifier's contract (what RL-set builders call before a row is
    kept: ``cascade build`` drops and rejects a row this refuses): its ``agent_ref`` names an installed
    verifier, every JSON field (:data:`JSON_FIELDS`) is strict JSON (:func:`row_field`), then the
    verifier's own :meth:`Verifier.check`.

    Raises:
        ValueError: a clear message naming the row (unknown agent_ref, ground_truth not JSON, unknown
            instruction id, answer not an option, missing tests, bad JSON schema...); a check that
            trips over a value of an unexpected type (TypeError...) is reported the same way.
    """
    uid = row.get("uuid")
    try:
        verifier = get_verifier(row.get("agent_ref"))
    except KeyError as exc:
        raise ValueError(f"row {uid!r}: {exc.args[0]}") from None
    for name in JSON_FIELDS:
        row_field(row, name)
    try:
        verifier.check(row)
        verifier.check_trainable(row)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed value is the row's fault: reject it, do not crash
        raise ValueError(f"row {uid!r}: {type(exc).__name__}: {exc}") from None

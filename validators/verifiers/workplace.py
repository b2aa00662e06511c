"""Workplace-assistant verifier (``agent_ref`` ``workplace``): NeMo-Gym's workbench rows, graded by state.

ground_truth ``{"calls": [{"name": ..., "arguments": {...}}, ...]}``: the calls that solve the task
(NVIDIA's ``ground_truth`` list, translated by :mod:`corpora.nemo_gym`); the tools offered are in
``responses_create_params.tools``. NeMo-Gym's workbench (``resources_servers/workplace_assistant``)
runs the model's calls and the ground-truth calls on two fresh copies of its workplace tables (email,
calendar, analytics, project management, CRM) and pays 1 when the five tables end equal, strings
compared case-insensitively except ``status``, ``list_name`` and ``board``.

Where the workbench's tables are available (``$CASCADE_WORKBENCH``), workplace rows are played as episodes
on them instead (:mod:`validators.tools.workplace`: the tables compared, as NeMo-Gym does). Without them,
the same outcome is decided from the calls (:func:`state_changes`): read calls (search, get, find, count...) change no
table, so only the **writes** (a tool whose action starts with one of :data:`WRITE_VERBS`) count,
and the model's writes must equal the ground truth's, in order, names exact and arguments equal
after NeMo-Gym's case rule (:func:`normalized`). Reads are free, as in the workbench. Deviations,
each stricter than the workbench: two writes in another order, an argument spelled out at its
default value, or a write the table would refuse (an unknown id, a no-op) count as a different state.

Anything malformed scores 0: a tool-call block that is not a call, a call of a tool the row does not
offer. A row whose ground truth writes nothing is refused when a set is built
(:meth:`WorkplaceVerifier.check_trainable`): doing nothing would score 1 (NeMo-Gym pays it).
"""

from __future__ import annotations

from typing import Any

from validators.verifiers.registry import Verdict, Verifier, fail, ground_truth
from validators.verifiers.tool_call import parse_calls, tool_names

#: The action verbs of the workbench's writing tools (``email_send_email``, ``calendar_update_event``...).
WRITE_VERBS = ("send", "reply", "forward", "delete", "create", "update", "add")
#: Columns NeMo-Gym compares case-sensitively (``convert_strs_to_lowercase``'s exceptions).
CASE_SENSITIVE = frozenset({"status", "list_name", "board"})


#: The workbench's toolkits, the prefixes of its tool names.
TOOLKITS = ("customer_relationship_manager", "project_management", "company_directory", "analytics", "calendar",
            "email")


def is_write(name: str) -> bool:
    """Whether tool ``name`` (``<toolkit>_<action>``, or a bare action) changes state: its action starts
    with one of :data:`WRITE_VERBS`."""
    kit = next((k for k in TOOLKITS if name.startswith(k + "_")), None)
    action = name[len(kit) + 1:] if kit else name
    return action.split("_", 1)[0] in WRITE_VERBS


def normalized(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with string values lower-cased (NeMo-Gym's rule), except where they land in a
    :data:`CASE_SENSITIVE` column: an argument of that name, or the ``new_value`` of an update whose
    ``field`` names one (``update_task(field="list_name", new_value="Done")``)."""
    keep = CASE_SENSITIVE | ({"new_value"} if args.get("field") in CASE_SENSITIVE else set())
    return {k: v.lower() if isinstance(v, str) and k not in keep else v for k, v in args.items()}


def state_changes(calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The writes among ``(name, arguments)`` calls, in order, arguments :func:`normalized`."""
    return [(name, normalized(args)) for name, args in calls if is_write(name)]


class WorkplaceVerifier(Verifier):
    """State-equivalence of the model's tool calls to the ground truth's (see the module doc)."""

    sft_domain = "conversational_agent"

    def check(self, row: dict[str, Any]) -> None:
        calls, uid = ground_truth(row, "calls")["calls"], row.get("uuid")
        if not isinstance(calls, list) or not calls:
            raise ValueError(f"row {uid!r}: ground_truth.calls must be a non-empty list")
        names = tool_names(row)
        for i, call in enumerate(calls):
            if not (isinstance(call, dict) and isinstance(call.get("name"), str)
                    and isinstance(call.get("arguments"), dict)):
                raise ValueError(f"row {uid!r}: ground_truth.calls[{i}] must be {{name, arguments: object}}")
            if names and call["name"] not in names:
                raise ValueError(f"row {uid!r}: ground_truth.calls[{i}] calls {call['name']!r}, "
                                 f"not among the row's tools")

    def check_trainable(self, row: dict[str, Any]) -> None:
        calls = ground_truth(row, "calls")["calls"]
        if not state_changes([(c["name"], c["arguments"]) for c in calls]):
            raise ValueError(f"row {row.get('uuid')!r}: no_ground_truth: the ground truth changes no state, so a "
                             f"response that does nothing would score 1")

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        calls, malformed = parse_calls(answer)
        details: dict[str, Any] = {"calls": [{"name": n, "arguments": a} for n, a in calls]}
        if malformed:
            return fail(f"malformed tool call: {malformed[0]}", **details)
        offered = tool_names(row)
        unknown = [n for n, _ in calls if offered and n not in offered]
        if unknown:
            return fail(f"call of {unknown[0]!r}, a tool the row does not offer", **details)
        expected = state_changes([(c["name"], c["arguments"]) for c in ground_truth(row, "calls")["calls"]])
        made = state_changes(calls)
        if made == expected:
            return Verdict(1.0, True, f"the {len(made)} write(s) match the ground truth's", details)
        return fail(f"{len(made)} write(s) do not leave the state the ground truth's {len(expected)} leave",
                    **details)

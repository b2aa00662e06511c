"""NVIDIA's workplace-assistant rows (``agent_ref`` ``workplace``, NeMo-Gym's workbench) as episodes scored on
the final state, when the workbench's tables are there.

The workbench's tables are NeMo-Gym's ``resources_servers/workplace_assistant/csv_data`` (``processed/*.csv``
and ``raw/email_addresses.csv``). NeMo-Gym is not on PyPI, so the environment variable ``CASCADE_WORKBENCH``
(:data:`WORKBENCH_ENV`: a checkout's ``csv_data``) says where they are; when it is set, workplace rows are
episodes (:meth:`WorkplaceEnvironment.active`, asked by :func:`validators.episodes.is_episodic`; a stage's
``episodes.workplace.workbench_dir`` may point elsewhere). An episode runs the model's tool calls on a
sandboxed copy of the tables (:mod:`validators.tools.workbench_world`) until it answers without a call, the
reference world runs the ground-truth calls, and the reward is 1 iff the five tables end equal under
NeMo-Gym's case rule (``is_correct``). A row whose ground-truth calls change no table (a write the workbench
refuses, such as ``list_name: "Done"``) scores 0: NeMo-Gym would pay doing nothing. Without the variable,
workplace rows stay single responses graded from their calls
(:class:`validators.verifiers.workplace.WorkplaceVerifier`).
"""

from __future__ import annotations

import csv
import os
from functools import cache
from pathlib import Path
from typing import Any

from common.answers import row_json
from validators.episodes import Grade
from validators.tools.environment import ToolEnvironment, ToolEpisode

WORKBENCH_ENV = "CASCADE_WORKBENCH"
FILES = {"emails": "processed/emails.csv", "calendar_events": "processed/calendar_events.csv",
         "project_tasks": "processed/project_tasks.csv",
         "customer_relationship_manager_data": "processed/customer_relationship_manager_data.csv"}


@cache
def read_workbench(root: str) -> dict[str, Any]:
    """The world config of the workbench tables under ``root`` (empty cells as ``None``).

    Raises:
        FileNotFoundError: a table is missing (names it and the variable to set).
    """
    base = Path(root)

    def rows(rel: str) -> list[dict[str, Any]]:
        path = base / rel
        if not path.is_file():
            raise FileNotFoundError(f"workbench table {path} not found: set {WORKBENCH_ENV} to NeMo-Gym's "
                                    "resources_servers/workplace_assistant/csv_data")
        with path.open(encoding="utf-8", newline="") as f:
            return [{k: (v if v != "" else None) for k, v in r.items()} for r in csv.DictReader(f)]

    directory = base / "raw" / "email_addresses.csv"
    return {"tables": {name: rows(rel) for name, rel in FILES.items()}, "visits": rows("processed/analytics_data.csv"),
            "directory": directory.read_text(encoding="utf-8").split() if directory.is_file() else []}


class WorkplaceEnvironment(ToolEnvironment):
    """Episode environment ``workplace`` (module doc).

    Args:
        workbench_dir: the workbench's ``csv_data`` (default ``$CASCADE_WORKBENCH``).
        episodes: :class:`~validators.tools.environment.ToolEnvConfig` fields.
    """

    world = "workbench_world"

    def __init__(self, workbench_dir: str | None = None, episodes: dict[str, Any] | None = None):
        super().__init__(episodes)
        self.workbench_dir = workbench_dir or os.environ.get(WORKBENCH_ENV)
        if not self.workbench_dir:
            raise ValueError(f"workplace episodes need the workbench's tables: set {WORKBENCH_ENV} or "
                             "episodes.workplace.workbench_dir")

    @staticmethod
    def active() -> bool:
        """Whether workplace rows are played as episodes here (``$CASCADE_WORKBENCH`` is set)."""
        return bool(os.environ.get(WORKBENCH_ENV))

    @staticmethod
    def task(row: dict[str, Any]) -> dict[str, Any]:
        """The row's ground truth ``{"calls": [{name, arguments}]}``. Raises ValueError naming the row."""
        gt = row_json(row, "ground_truth")
        if not isinstance(gt, dict) or not isinstance(gt.get("calls"), list):
            raise ValueError(f"row {row.get('uuid')!r}: a workplace ground_truth needs 'calls'")
        return gt

    def load(self, gt: dict[str, Any]) -> dict[str, Any]:
        return {"modules": {}}

    def configs(self, gt: dict[str, Any]) -> dict[str, Any]:
        return read_workbench(self.workbench_dir)

    def end_turn(self, ep: ToolEpisode, gt: dict[str, Any]) -> str:
        for call in gt["calls"]:
            ep.session.call("reference", call["name"], kwargs=dict(call.get("arguments") or {}))
        return ""

    def final(self, ep: ToolEpisode, gt: dict[str, Any]) -> Grade:
        verdict = ep.session.request("compare")
        if not verdict.get("reference_changed"):  # NeMo-Gym would pay doing nothing
            return Grade(0.0, False, "the ground-truth calls change no table (a refused or absent write): the row "
                                     "cannot tell doing the task from doing nothing", verdict)
        if verdict.get("equal"):
            return Grade(1.0, True, "the workbench tables equal the ground truth's", verdict)
        return Grade(0.0, False, f"tables differ from the ground truth's: {verdict.get('differences')}", verdict)

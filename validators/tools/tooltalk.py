"""ToolTalk as an episode environment (``agent_ref`` ``tooltalk``): the conversation's user turns
replayed, the model's API calls executed on ToolTalk's simulated APIs and databases in the sandbox
(:mod:`validators.tools.tooltalk_world`).

Rows (:func:`corpora.adapters.tools.tooltalk_episode`): ToolTalk's system prompt and first user turn
in the prompt, the tools of the APIs the conversation uses; ``ground_truth`` holds the later user turns,
the ground-truth calls after each user turn (``calls``: ``[[{"api_name", "parameters"}]]``), the
conversation's ``timestamp`` and ``user`` (a logged-in user's session), and ``backend``.

As each user turn ends the reference world runs that turn's ground-truth calls. The reward is 1 iff
the episode finished and, over the whole conversation, ToolTalk's ``success`` holds (every ground-truth
call matched by a model call under the API's own correctness check, no action that succeeded without
matching: ``evaluate_predictions`` of ``tooltalk/evaluation/tool_executor.py``) and the databases end
equal (:func:`validators.tools.tooltalk_world.same_database`: only the free-text fields ToolTalk compares semantically
are compared by similarity, every other value exactly). Deviations: free text is compared
lexically, not with DistilBERT (:mod:`validators.tools.tooltalk_utils`); ToolTalk evaluates each turn
with the ground-truth history (teacher forcing), here the model's own history carries on.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from validators.episodes import Grade
from validators.tools.environment import ToolEnvironment, ToolEpisode, backend_sources

UTILS = Path(__file__).with_name("tooltalk_utils.py")


@cache
def databases(backend: str) -> dict[str, Any]:
    """ToolTalk's initial databases (``<backend>/data/databases/*.json``), read once per process."""
    return {p.stem: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted((Path(backend) / "data" / "databases").glob("*.json"))}


class ToolTalkEnvironment(ToolEnvironment):
    """Episode environment ``tooltalk`` (module doc). Args: ``episodes``: :class:`ToolEnvConfig` fields."""

    world = "tooltalk_world"

    def load(self, gt: dict[str, Any]) -> dict[str, Any]:
        files = backend_sources(str(Path(self.backend_dir(gt)) / "apis"))
        modules = {f"tooltalk.apis.{rel[:-3]}": text for rel, text in files.items() if rel != "__init__.py"}
        modules["tooltalk.apis"] = files["__init__.py"]
        modules["tooltalk.apis.utils"] = UTILS.read_text(encoding="utf-8")
        return {"modules": modules, "packages": ["tooltalk", "tooltalk.apis"]}

    def configs(self, gt: dict[str, Any]) -> dict[str, Any]:
        return {"databases": databases(self.backend_dir(gt)), "timestamp": gt["timestamp"],
                "user": gt.get("user") or {}}

    def end_turn(self, ep: ToolEpisode, gt: dict[str, Any]) -> str:
        calls = gt["calls"][ep.turn] if ep.turn < len(gt["calls"]) else []
        for c in calls:
            ep.session.call("reference", c["api_name"], kwargs=dict(c["parameters"]))
        return ""

    def final(self, ep: ToolEpisode, gt: dict[str, Any]) -> Grade:
        verdict = ep.session.request("compare")
        if verdict.get("equal"):
            return Grade(1.0, True, "every ground-truth call matched, no bad action, databases equal", verdict)
        if not verdict.get("success"):
            why = (f"recall {verdict.get('recall', 0):.2f}, {verdict.get('bad_actions', 0)} bad action(s); "
                   f"missing {verdict.get('missing', [])}")
        else:
            why = f"databases differ: {verdict.get('database_differences')}"
        return Grade(0.0, False, why, verdict)

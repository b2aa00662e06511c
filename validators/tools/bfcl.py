"""BFCL v4 multi-turn as an episode environment (``agent_ref`` ``bfcl_multi_turn``), scored as BFCL
scores it (``bfcl_eval/eval_checker/multi_turn_eval/multi_turn_checker.py``, bfcl-eval 2026.3.23).

Rows (:func:`corpora.adapters.tools.bfcl_multi_turn`): the first user turn and the tools in the prompt;
``ground_truth`` holds the later user turns (``user_turns``), the ground-truth calls per user turn
(``turns``: ``[[{"name", "args", "kwargs"}]]``, parsed from BFCL's call strings), the backends'
``initial_config``, ``involved_classes``, ``long_context``, the held-out function docs per turn
(``missed_function``) and the backend directory (``backend``).

The rule, checked as each user turn ends (:meth:`BFCLEnvironment.end_turn`), in the sandbox where
both worlds live (:mod:`validators.tools.bfcl_world`):

1. the reference world runs the turn's ground-truth calls;
2. a turn with ground-truth calls needs at least one model call that ran in it (an offered tool:
   ``empty_turn_model_response``); a turn without any (miss_param, miss_func: the model should ask or
   say it cannot) must have no well-formed model call at all, not even of an absent tool (BFCL's
   irrelevance check);
3. after a turn with ground-truth calls, every backend instance's public attributes equal the
   reference's (``state_checker``), and every ground-truth call's result text is among the results of
   the model's calls so far, as a multiset (``response_checker``).

The reward is 1 iff every turn passes and the episode finished. Deviations from BFCL: calls are the
model's tool-call JSON, not Python call strings; a malformed call is an error message and the turn goes
on (BFCL ends the turn); a tool is callable only once offered (BFCL would run a held-out function
early); held-out functions arrive in the user turn's text (BFCL's prompting mode) rather than in
re-rendered tool declarations, so earlier tokens never change; the episode stops at the first failed
turn (the reward is 0 either way); a call of an absent tool does not count as the turn's call (BFCL would
decode it as one). As in BFCL, a turn whose required results the model's earlier calls already produced
passes with any call that runs (BFCL accumulates results over turns on purpose).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from validators.episodes import Grade
from validators.tools.environment import ToolEnvironment, ToolEpisode, backend_sources

PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
PACKAGES = ["bfcl_eval", "bfcl_eval.eval_checker", "bfcl_eval.eval_checker.multi_turn_eval", PACKAGE]


class BFCLEnvironment(ToolEnvironment):
    """Episode environment ``bfcl_multi_turn`` (module doc). Args: ``episodes``: :class:`ToolEnvConfig` fields."""

    world = "bfcl_world"

    def load(self, gt: dict[str, Any]) -> dict[str, Any]:
        files = backend_sources(self.backend_dir(gt))
        modules = {f"{PACKAGE}.{rel[:-3].replace('/', '.')}": text for rel, text in files.items()
                   if rel != "__init__.py"}
        return {"modules": modules, "packages": PACKAGES}

    def configs(self, gt: dict[str, Any]) -> dict[str, Any]:
        return {"classes": gt["involved_classes"], "initial_config": gt["initial_config"],
                "long_context": bool(gt.get("long_context"))}

    def end_turn(self, ep: ToolEpisode, gt: dict[str, Any]) -> str:
        k = ep.turn
        truth = gt["turns"][k] if k < len(gt["turns"]) else []
        expected = [ep.session.call("reference", c["name"], c.get("args", []), c.get("kwargs", {})) for c in truth]
        if not truth:
            return (f"turn {k}: {ep.turn_attempts} tool call(s) where the ground truth makes none"
                    if ep.turn_attempts else "")
        if not ep.turn_calls:
            return f"turn {k}: no tool call (the ground truth makes {len(truth)})"
        state = ep.session.request("compare")
        if not state.get("equal"):
            return f"turn {k}: state differs from the ground truth's: {state.get('differences', state)}"
        missing = Counter(expected) - Counter(ep.outputs)
        if missing:
            return f"turn {k}: {sum(missing.values())} ground-truth call result(s) missing from the model's calls"
        return ""

    def final(self, ep: ToolEpisode, gt: dict[str, Any]) -> Grade:
        return Grade(1.0, True, "every turn's backend state and required call results match the ground truth",
                     {"finish": ep.finish, "turns": ep.turn + 1})

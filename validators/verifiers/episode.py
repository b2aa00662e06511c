"""Rows played as multi-turn episodes (``agent_ref`` ``bfcl_multi_turn``, ``tooltalk``; RL domain
``tool_use``): their reward comes from an episode in an environment (:mod:`validators.episodes`,
:mod:`validators.tools`), not from one response.

This verifier checks such a row's ground truth when a set is built (:meth:`EpisodeVerifier.check`);
asked to grade one response alone (``verify_batch``, the TRL / verl / NeMo-Gym wrappers) it gives no
verdict (``error`` ``episode_row``: the sample is left out, never scored 0). The RL stages play these rows
as episodes (:mod:`stages.episodes`).
"""

from __future__ import annotations

from typing import Any

from validators.verifiers.registry import Verdict, Verifier, ground_truth

#: the ground-truth keys each episode environment needs
REQUIRED = {"bfcl_multi_turn": ("turns", "user_turns", "initial_config", "involved_classes", "backend"),
            "tooltalk": ("user_turns", "calls", "timestamp", "backend")}


class EpisodeVerifier(Verifier):
    """Verifier of episode rows (module doc)."""

    name = "episode"

    def check(self, row: dict[str, Any]) -> None:
        """Raises ValueError naming the row and the missing ground-truth keys."""
        ground_truth(row, *REQUIRED.get(row.get("agent_ref"), ("backend",)))

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        return Verdict(0.0, False, f"an {row.get('agent_ref')} row is graded by playing an episode, not one "
                                   "response (validators.episodes)", error="episode_row")

"""Multi-turn episodes: the one interface of every environment the policy acts in over several turns
(SWE repositories, BFCL's and ToolTalk's tool backends), the policies that act in them, and the loop.

An :class:`EpisodeEnvironment` has four methods, the Gym shape NeMo-Gym, verl's agent loop and TRL's
``environment_factory`` share:

==================  ==============================================================================
``reset(row)``      a new :class:`Episode` for an RL row (fresh, isolated state; deterministic)
``step(ep, text)``  apply one model turn: returns the messages that follow it (tool results, the next
                    user turn), ``[]`` when the episode ended (``ep.done``, ``ep.finish`` the reason)
``grade(ep)``       the final :class:`Grade` (reward in [0, 1], passed, reason), after it ended
``close(ep)``       free what the episode holds (sandboxes, files)
==================  ==============================================================================

Rows name their environment by ``agent_ref`` (entry-point group ``cascade_rl.episode_environments``:
:func:`episode_environment`). A :class:`Policy` produces the next assistant turn of each active episode:
the model through the rollout engine (:class:`stages.policy.ModelPolicy`, which records the
token-level :class:`Trajectory` multi-turn GRPO and MOPD train on), or a script (the tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from common import plugins


@dataclass
class Trajectory:
    """Token-level record of one episode under a model policy.

    Attributes:
        prompt_ids: the first prompt (system, tools, first user turn).
        ids: every token after it: model turns and rendered tool / user turns, in order.
        loss_mask: 1 on the model's sampled tokens, 0 on everything the environment wrote (same
            length as ``ids``).
        logprobs: sampler log-probability (nats) of each model token, 0.0 elsewhere.
        truncated: some model turn hit ``max_new_tokens`` without EOS.
        n_messages: messages of the episode already in ``ids``.
        ended_with_eos: the last model turn ended with EOS.
        seed: the episode's sampling seed (``None``: unseeded; :class:`stages.policy.ModelPolicy`).
    """

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    truncated: bool = False
    n_messages: int = 0
    ended_with_eos: bool = True
    seed: int | None = None

    def extend(self, ids: list[int], trained: bool, logprobs: list[float] | None = None) -> None:
        """Append ``ids`` with ``loss_mask`` 1 (``trained``) or 0, and their log-probabilities."""
        self.ids += ids
        self.loss_mask += [int(trained)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.ids


@dataclass
class Episode:
    """One episode in progress: ``row`` (the RL row), ``messages`` (the chat so far, the row's
    ``responses_create_params.input`` first), turn count and end reason; environments subclass it."""

    row: dict[str, Any]
    messages: list[dict[str, Any]]
    t0: float = field(default_factory=time.monotonic)
    steps: int = 0
    done: bool = False
    finish: str = ""
    trajectory: Trajectory | None = None

    def end(self, reason: str) -> None:
        """Mark the episode finished with ``reason`` (the first reason given stays)."""
        self.done, self.finish = True, self.finish or reason


@dataclass
class Grade:
    """An episode's reward: ``reward`` in [0, 1], ``passed``, ``reason`` (why, in words), ``details``."""

    reward: float
    passed: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeResult:
    """What :func:`run_episodes` returns per episode."""

    uuid: str
    grade: Any  # Grade, or an environment's richer grade with ``reward``, ``passed`` and ``reason``
    steps: int
    finish: str
    wall_s: float
    messages: list[dict[str, Any]]
    trajectory: Trajectory | None


class EpisodeEnvironment(Protocol):
    """The multi-turn environment interface (module doc)."""

    def reset(self, row: dict[str, Any]) -> Episode: ...

    def step(self, ep: Episode, response: str) -> list[dict[str, Any]]: ...

    def grade(self, ep: Episode) -> Any: ...

    def close(self, ep: Episode) -> None: ...


class Policy(Protocol):
    """Chooses the next assistant turn of each active episode."""

    def act(self, episodes: list[Episode]) -> list[str | None]:
        """One response per episode (``None``: the policy cannot continue it, e.g. a full context)."""


def run_episodes(env: EpisodeEnvironment, policy: Policy, rows: list[dict[str, Any]],
                 max_concurrent: int = 64) -> list[EpisodeResult]:
    """Run one episode per row with ``policy`` until each ends, grade them, close them.

    The episodes advance together, ``max_concurrent`` at a time (one batched policy call per turn; each
    open episode may hold a sandbox); a policy that returns ``None`` ends that episode with reason ``context``.
    """
    results: list[EpisodeResult] = []
    for start in range(0, len(rows), max_concurrent):
        results += _run_wave(env, policy, rows[start:start + max_concurrent])
    return results


def _run_wave(env: EpisodeEnvironment, policy: Policy, rows: list[dict[str, Any]]) -> list[EpisodeResult]:
    episodes: list[Episode] = []
    try:
        for r in rows:
            episodes.append(env.reset(r))
        while active := [e for e in episodes if not e.done]:
            for ep, text in zip(active, policy.act(active), strict=True):
                if text is None:
                    ep.end("context")
                else:
                    env.step(ep, text)
        results = []
        for ep in episodes:
            grade = env.grade(ep)
            results.append(EpisodeResult(str(ep.row.get("uuid")), grade, ep.steps, ep.finish,
                                         time.monotonic() - ep.t0, ep.messages, ep.trajectory))
        return results
    finally:
        for ep in episodes:
            env.close(ep)


def episode_environment(agent_ref: str, **kwargs: Any) -> EpisodeEnvironment:
    """The episode environment installed as ``agent_ref`` (entry-point group
    ``cascade_rl.episode_environments``; built in: ``bfcl_multi_turn``, ``tooltalk``, ``swe``, ``workplace``), built
    from ``kwargs``.

    Raises:
        ValueError: unknown name, listing the installed ones.
    """
    return plugins.load("episode_environments", agent_ref)(**kwargs)


def is_episodic(agent_ref: str | None) -> bool:
    """Whether rows with this ``agent_ref`` are played as episodes: an episode environment is installed under
    that name and, if its factory has an ``active()`` (``workplace``: the workbench's tables are configured),
    it says so."""
    if not agent_ref or agent_ref not in plugins.names("episode_environments"):
        return False
    return bool(getattr(plugins.load("episode_environments", agent_ref), "active", lambda: True)())

"""The one extension mechanism: entry-point groups ``cascade_rl.<kind>``.

Every extension point is a named object in an entry-point group (Python packaging's plugin
registry, ``importlib.metadata``). The built-ins are declared in this repository's ``pyproject.toml``;
any installed package adds its own the same way, and every process sees them, the verifier workers
and DVC steps included::

    # pyproject.toml of your package
    [project.entry-points."cascade_rl.verifiers"]
    my_domain = "my_pkg.verifier:MyVerifier"

=======================  ===================================================  =============================
kind                     what the entry point names                           used by
=======================  ===================================================  =============================
``verifiers``            a ``Verifier`` subclass (the row's ``agent_ref``)    rewards, filtering, synthesis
``stages``               a stage runner class (``runner:`` in params)         ``cascade train``
``rollout_engines``      ``factory(model, tokenizer, sampling, model_path)``  RL stages, difficulty
``train_engines``        ``factory(model, optim, total_steps, zero_stage)``   every stage
``environments``         ``factory(**environment_kwargs)``                    RL stages
``advantages``           ``fn(rewards, group_size, **kwargs) -> advantages``  GRPO stages
``policy_losses``        a ``stages.losses.PolicyLossFn``                     GRPO stages, SWE RL
``distillation_losses``  a ``stages.losses.DistillationLossFn``               MOPD
``adapters``             ``fn(raw, spec, root) -> row(s)`` (``adapter:``)     ``cascade ingest``
``domains``              the ``Verifier`` subclass grading an RL domain       schema, build, synthesis
``nemo_gym_agents``      a ``corpora.nemo_gym.NemoGymAgent`` (upstream name)   NeMo-Gym rows: ingest, verify
``episode_environments`` ``factory(**kwargs)`` of a multi-turn environment    RL stages, validation (episode
                         (``validators.episodes``; the row's ``agent_ref``)   rows: tools, SWE)
=======================  ===================================================  =============================

The RL domains are the names of the ``domains`` group: the schema accepts exactly those (read from
metadata, nothing imported), and a domain's verifier class says what synthesis makes of it
(``Verifier.sft_domain``). A new domain is its verifier file plus its two lines (``verifiers`` by
``agent_ref``, ``domains`` by domain name).

Entry points are loaded lazily (on first use, then cached), so a plugin's heavy imports cost nothing
until a row or a config names it.
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points
from typing import Any

SINGULAR = {"verifiers": "verifier", "stages": "stage runner", "rollout_engines": "rollout engine",
            "train_engines": "train engine", "environments": "environment", "advantages": "advantage estimator",
            "policy_losses": "policy loss", "distillation_losses": "distillation loss",
            "adapters": "adapter", "domains": "RL domain", "nemo_gym_agents": "NeMo-Gym agent",
            "episode_environments": "episode environment"}
KINDS = tuple(SINGULAR)


class UnknownPlugin(KeyError, ValueError):
    """No entry point of that name in the kind's group (the message lists the installed ones)."""

    def __str__(self) -> str:
        return str(self.args[0])


@functools.cache
def _group(kind: str) -> dict[str, EntryPoint]:
    if kind not in KINDS:
        raise ValueError(f"unknown extension kind {kind!r}; expected one of {KINDS}")
    return {ep.name: ep for ep in entry_points(group=f"cascade_rl.{kind}")}


def names(kind: str) -> list[str]:
    """The installed names of ``kind``, sorted.

    Raises:
        ValueError: unknown kind.
    """
    return sorted(_group(kind))


@functools.cache
def load(kind: str, name: str) -> Any:
    """The object the entry point ``name`` of group ``cascade_rl.<kind>`` names (imported once).

    Raises:
        UnknownPlugin: no such entry point; the message lists the installed ones and how to add one.
        ValueError: unknown kind.
    """
    group = _group(kind)
    if name not in group:
        raise UnknownPlugin(f"no {SINGULAR[kind]} {name!r} (entry-point group 'cascade_rl.{kind}'); "
                            f"installed: {', '.join(sorted(group)) or 'none'}. A new one is an entry point in "
                            f"your package's pyproject.toml (then reinstall it: pip install -e .)")
    return group[name].load()

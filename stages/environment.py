"""Environments: RL rows in, prompts and rewards out.

- :func:`load_rl_rows` reads canonical RL sets (``corpora/schema.py`` ``RL_SCHEMA``).
- :class:`PromptBuilder` renders a row's ``responses_create_params`` with the tokenizer's
  chat template (tools included; a template that ignores ``tools`` gets them as a system
  turn: :func:`corpora.chat.prompt_messages`) and refuses prompts longer than the budget, so
  the caller counts them.
- An :class:`Environment` scores responses: ``verifiers`` dispatches every row to the
  verifier its ``agent_ref`` names (``validators.verifiers.verify_batch``, NeMo-Gym
  convention); ``function`` wraps a plain ``reward(response, row) -> float``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pyarrow.parquet as pq

from common import plugins
from corpora.chat import prompt_messages, renders_tools


def load_rl_rows(dataset: str | Path, split: str = "train", limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of ``<dataset>/<split>.parquet`` (or ``dataset`` itself when it is a parquet file).

    Raises:
        FileNotFoundError: naming the missing file and the step that builds it.
    """
    path = Path(dataset)
    path = path if path.suffix == ".parquet" else path / f"{split}.parquet"
    if not path.exists():
        raise FileNotFoundError(f"RL set {path} not found: run `dvc repro build` first")
    table = pq.read_table(path)
    return (table.slice(0, limit) if limit is not None else table).to_pylist()


class PromptTooLong(ValueError):
    """A prompt exceeds ``max_prompt_tokens`` (the reason ``prompt_too_long`` in stage metrics)."""


class PromptBuilder:
    """Token ids of a row's prompt, ending with the assistant generation header.

    Args:
        tokenizer: HF tokenizer with a chat template.
        max_prompt_tokens: longer prompts raise :class:`PromptTooLong`.
    """

    def __init__(self, tokenizer: Any, max_prompt_tokens: int = 1024):
        self.tokenizer, self.max_prompt_tokens = tokenizer, max_prompt_tokens
        self.template_renders_tools = renders_tools(tokenizer)

    def messages(self, row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict] | None]:
        """The chat and tools the template receives (tools moved into a system turn if needed:
        :func:`corpora.chat.prompt_messages`)."""
        return prompt_messages(row["responses_create_params"], self.template_renders_tools)

    def __call__(self, row: dict[str, Any]) -> list[int]:
        """Prompt token ids. Raises PromptTooLong naming the row's uuid and its length."""
        chat, tools = self.messages(row)
        ids = self.tokenizer.apply_chat_template(chat, tools=tools, add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)
        if len(ids) > self.max_prompt_tokens:
            raise PromptTooLong(f"row {row.get('uuid')}: prompt has {len(ids)} tokens > max_prompt_tokens "
                                f"{self.max_prompt_tokens}")
        return list(ids)


class Environment(Protocol):
    """Scores responses to RL rows: ``score`` is all an environment must have.

    Attributes:
        grades_responses: whether each response is scored alone (a verifier's verdict; True when an
            environment does not say). False for an environment that scores groups (a pairwise judge):
            per-domain validation, which scores single greedy answers, then uses the verifiers
            (:meth:`stages.runtime.StageRun.validation_environment`).
    """

    grades_responses: bool

    def score(self, responses: list[str], rows: list[dict[str, Any]]) -> list[tuple[float | None, bool]]:
        """One ``(reward, passed)`` per response, rewards in [0, 1]; ``None`` when the grader itself
        failed on that response (no verdict: trainers leave it out, never count it as 0)."""

    def close(self) -> None:
        """Optional: release what the environment holds (worker processes, a judge); called when the
        run that built it ends."""


class VerifierEnvironment:
    """Rewards from the row's verifier (``agent_ref``) in the worker processes of one
    :class:`~validators.verifiers.batch.VerifierPool`, kept for the environment's life (a stage run:
    :meth:`stages.runtime.StageRun.environment` closes it at the end; a forked process starts its own).

    A verifier that hangs past ``timeout_s`` gives reward 0 for that response only; a verdict whose
    grader failed (``Verdict.error``, e.g. a sandbox that did not start twice) gives ``None``.
    """

    grades_responses = True

    def __init__(self, timeout_s: float = 10.0, workers: int = 2):
        from validators.verifiers.batch import VerifierPool

        self.pool = VerifierPool(workers, timeout_s)

    def score(self, responses: list[str], rows: list[dict[str, Any]]) -> list[tuple[float | None, bool]]:
        verdicts = self.pool.verify(responses, rows)
        return [(None if v.error else float(v.reward), bool(v.passed)) for v in verdicts]

    def close(self) -> None:
        self.pool.close()


class FunctionEnvironment:
    """Rewards from ``fn(response, row) -> float`` (``passed`` = reward >= 1)."""

    grades_responses = True

    def __init__(self, fn: Callable[[str, dict[str, Any]], float]):
        self.fn = fn

    def score(self, responses: list[str], rows: list[dict[str, Any]]) -> list[tuple[float, bool]]:
        rewards = [float(self.fn(r, row)) for r, row in zip(responses, rows, strict=True)]
        return [(r, r >= 1.0) for r in rewards]


JUDGE_PROMPT = """You are a judge of helpfulness. Read the conversation and two candidate responses.
Rate each response's helpfulness from 1 to 5, then rank them from 1 (Response 1 is much better)
to 6 (Response 2 is much better); 3 and 4 mean slightly better. End your answer exactly like this:
[The Begin of Individual Scores]
\\boxed{{score_1, score_2}}
[The End of Individual Scores]
[The Begin of Ranking Score]
\\boxed{{ranking}}
[The End of Ranking Score]

[Conversation]
{conversation}

[Response 1]
{response_1}

[Response 2]
{response_2}"""


class GenRMEnvironment:
    """RLHF rewards from a pairwise generative judge (recipe, RLHF row; Nemotron GenRM style).

    Responses arrive prompt-major in groups of consecutive rows with the same ``uuid``. For each
    group the judge (any :class:`~stages.rollout.RolloutEngine`, greedy) sees the pairs of
    ``validators.verifiers.genrm.pair_indices(n, strategy)`` and
    ``validators.verifiers.genrm.group_rewards`` turns its outputs into rewards in [0, 1]
    (malformed judgements are dropped there and counted in ``malformed``).

    Entry point ``genrm`` of ``cascade_rl.environments`` (``environment_kwargs``: ``judge_model``,
    ``strategy``, ``max_new_tokens``).

    Args:
        judge: rollout engine of the judge model; ``judge_tokenizer`` renders its prompts.
        judge_model: instead of ``judge``: a checkpoint dir, served by the ``hf`` engine.
        strategy: ``circular`` | ``all_pairs``.

    Raises:
        ValueError: neither ``judge`` (with ``judge_tokenizer``) nor ``judge_model``.
    """

    grades_responses = False  # it ranks a group's responses against each other

    def __init__(self, judge: Any = None, judge_tokenizer: Any = None, strategy: str = "circular",
                 max_new_tokens: int = 256, judge_model: str | None = None):
        if judge_model is not None:
            from stages.checkpoints import load_checkpoint
            from stages.rollout import HFRolloutEngine, SamplingConfig

            model, judge_tokenizer = load_checkpoint(judge_model)
            judge = HFRolloutEngine(model.eval(), judge_tokenizer, SamplingConfig())
        if judge is None or judge_tokenizer is None:
            raise ValueError("the genrm environment needs environment_kwargs judge_model (a checkpoint dir), or "
                             "judge and judge_tokenizer")
        self.judge, self.tokenizer, self.strategy = judge, judge_tokenizer, strategy
        self.max_new_tokens, self.malformed, self.addressed_judge = max_new_tokens, 0, 0

    def score(self, responses: list[str], rows: list[dict[str, Any]]) -> list[tuple[float, bool]]:
        """Group rewards; the judge sees final answers only, and responses with no final answer or
        addressing the judge get 0 unjudged (``validators.verifiers.genrm.screen``; counted in
        ``addressed_judge``)."""
        from validators.verifiers.genrm import group_rewards, judged_pairs, screen

        out: list[tuple[float, bool]] = []
        start = 0
        while start < len(rows):
            end = start
            while end < len(rows) and rows[end].get("uuid") == rows[start].get("uuid"):
                end += 1
            views, excluded = screen(responses[start:end])
            conversation = "\n".join(f"{m['role']}: {m['content']}"
                                     for m in rows[start]["responses_create_params"]["input"])
            pairs = judged_pairs(len(views), excluded, self.strategy)
            prompts = [self.tokenizer.apply_chat_template(
                [{"role": "user", "content": JUDGE_PROMPT.format(conversation=conversation, response_1=views[i],
                                                                 response_2=views[j])}],
                add_generation_prompt=True, tokenize=True, return_dict=False) for i, j in pairs]
            texts = self.judge.generate(prompts, n=1, greedy=True, max_new_tokens=self.max_new_tokens).texts \
                if prompts else []
            result = group_rewards(len(views), pairs, texts, excluded)
            self.malformed += len(result.malformed)
            self.addressed_judge += sum(r == "addresses the judge" for r in excluded.values())
            out.extend((r, r > 0.5) for r in result.rewards)
            start = end
        return out

    def close(self) -> None:
        """Close the judge's engine (a no-op for the ``hf`` engine on an in-process model)."""
        close = getattr(self.judge, "close", None)
        if close is not None:
            close()


def make_environment(name: str, **kwargs: Any) -> Environment:
    """The environment installed as ``name`` (entry-point group ``cascade_rl.environments``:
    ``verifiers`` (default), ``function`` (``fn=...``), ``genrm`` built in), built by its factory
    from the stage's ``environment_kwargs``.

    Raises:
        ValueError: unknown name, listing the installed ones.
    """
    return plugins.load("environments", name)(**kwargs)


def grades_responses(name: str) -> bool:
    """Whether the environment installed as ``name`` scores each response alone (its factory's
    ``grades_responses``, read without building it; True when the factory does not say).

    Raises:
        ValueError: unknown name, listing the installed ones.
    """
    return bool(getattr(plugins.load("environments", name), "grades_responses", True))

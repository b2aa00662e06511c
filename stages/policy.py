"""The model policy of multi-turn episodes (:mod:`validators.episodes`): a causal LM acting through the rollout
engine, one batched call per turn, recording the token-level trajectory multi-turn GRPO and MOPD train on
(:mod:`stages.episodes`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from validators.episodes import Episode, Trajectory


class ModelPolicy:
    """A causal LM acting through a rollout engine (token ids in, :class:`~stages.rollout.Rollouts` out).

    Args:
        engine: ``stages.rollout.RolloutEngine``; tokenizer: its tokenizer (chat template).
        builder: ``stages.environment.PromptBuilder`` (renders the first prompt, tools included).
        max_new_tokens: per model turn; max_context_tokens: an episode whose context would pass
            it ends (``finish`` ``context``).
        greedy: argmax decoding (evaluation) instead of sampling.

    Attributes:
        new_seeds: while set, each episode whose trajectory starts takes the next seed (``Trajectory.seed``)
            and samples turn ``t`` with ``seed * 1000 + t`` (:func:`stages.rollout.prompt_seeds`), so its
            tokens depend on its seed and history only, not on the batch (data-parallel ranks sample what
            one process would); unseeded episodes continue the engine's random stream.
    """

    def __init__(self, engine: Any, tokenizer: Any, builder: Any, max_new_tokens: int = 128,
                 max_context_tokens: int = 4096, greedy: bool = False):
        self.engine, self.tok, self.builder = engine, tokenizer, builder
        self.max_new_tokens, self.max_context_tokens, self.greedy = max_new_tokens, max_context_tokens, greedy
        self.new_seeds: Iterator[int] | None = None

    def observation_ids(self, chat: list[dict[str, Any]], new: list[dict[str, Any]], tools: Any) -> list[int]:
        """Token ids of the turns ``new`` after ``chat`` (which ends with the assistant turn the model
        sampled, EOS included), up to the next assistant header: the template's rendering of
        ``chat + new`` minus that of ``chat``, plus what the template puts after the EOS.

        Raises:
            ValueError: the template re-renders earlier turns (the rendering of ``chat`` is not a
                prefix of that of ``chat + new``), so turns cannot be appended token-exactly.
        """
        render = lambda msgs, gen: self.tok.apply_chat_template(msgs, tools=tools, tokenize=False,
                                                                add_generation_prompt=gen)
        before, after = render(chat, False), render(chat + new, True)
        if not after.startswith(before):
            raise ValueError("the chat template re-renders earlier turns: multi-turn token ids cannot be appended")
        eos = self.tok.eos_token or ""
        glue = before[before.rindex(eos) + len(eos):] if eos and eos in before else ""
        return list(self.tok(glue + after[len(before):], add_special_tokens=False)["input_ids"])

    def act(self, episodes: list[Episode]) -> list[str | None]:
        out: list[str | None] = [None] * len(episodes)
        todo = []
        for i, ep in enumerate(episodes):
            chat, tools = self.builder.messages(ep.row)
            if ep.trajectory is None:
                ep.trajectory = Trajectory(self.builder(ep.row), n_messages=len(ep.messages),
                                           seed=next(self.new_seeds) if self.new_seeds is not None else None)
            else:
                traj = ep.trajectory
                if not traj.ended_with_eos:  # close the cut-off turn (not trained)
                    traj.extend([self.tok.eos_token_id], trained=False)
                first = len(ep.row["responses_create_params"]["input"])  # the turns `chat` renders
                history = chat + ep.messages[first:traj.n_messages]
                traj.extend(self.observation_ids(history, ep.messages[traj.n_messages:], tools), trained=False)
                traj.n_messages = len(ep.messages)
            if len(ep.trajectory.full_ids) + self.max_new_tokens <= self.max_context_tokens:
                todo.append(i)
        if todo:
            seeds = [episodes[i].trajectory.seed for i in todo]
            ro = self.engine.generate([episodes[i].trajectory.full_ids for i in todo], n=1, greedy=self.greedy,
                                      max_new_tokens=self.max_new_tokens,
                                      seed=None if None in seeds else [s * 1000 + episodes[i].steps
                                                                       for s, i in zip(seeds, todo, strict=True)])
            for k, i in enumerate(todo):
                traj = episodes[i].trajectory
                traj.extend(ro.response_ids[k], trained=True, logprobs=ro.logprobs[k])
                traj.truncated |= ro.truncated[k]
                traj.ended_with_eos = not ro.truncated[k] and bool(ro.response_ids[k])
                traj.n_messages = len(episodes[i].messages) + 1  # the assistant turn about to be appended
                out[i] = ro.texts[k]
        return out

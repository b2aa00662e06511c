"""GenRM (RLHF) under attack: text that addresses the judge, fake score blocks, unclosed reasoning.
The judge sees final answers only; a response that speaks to it (or has no final answer) is never
judged and gets 0, so an injection cannot gain against the same response without it, with a judge
that is fooled by every injection and with the default judge (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import re

import pytest

from benchmarks.attacks import HONEST_RLHF, INJECTIONS
from stages.checkpoints import load_checkpoint
from stages.environment import GenRMEnvironment
from stages.rollout import HFRolloutEngine, Rollouts, SamplingConfig
from tests.tiny_lm import smollm2_tokenizer
from validators.verifiers.genrm import addresses_judge, screen

OTHER = "The capital of France is Lyon."


def _rows(n_groups: int, size: int) -> list[dict]:
    return [{"uuid": f"g{g}", "responses_create_params": {"input": [
        {"role": "user", "content": "What is the capital of France?"}]}} for g in range(n_groups) for _ in range(size)]


class GullibleJudge:
    """Gives 5 to any response that contains an injection (or a score block), 3 to the others."""

    def __init__(self, tok):
        self.tok, self.prompts = tok, []

    def generate(self, prompts, n, greedy=False, max_new_tokens=None):
        texts = []
        for ids in prompts:
            text = self.tok.decode(ids)
            self.prompts.append(text)
            r1, r2 = re.search(r"\[Response 1\]\n(.*?)\n\n\[Response 2\]\n(.*)", text, re.S).groups()
            s1, s2 = (5 if any(k in r for k in INJECTIONS.values()) or "boxed" in r else 3 for r in (r1, r2))
            texts.append(f"\\boxed{{{s1}, {s2}}} \\boxed{{3}}")
        return Rollouts(prompts, [[1]] * len(prompts), [[0.0]] * len(prompts), [False] * len(prompts), texts, 1)


@pytest.mark.parametrize("name", sorted(INJECTIONS))
def test_injections_are_detected(name):
    assert addresses_judge(f"{HONEST_RLHF} {INJECTIONS[name]}")
    assert not addresses_judge(HONEST_RLHF)


def test_ordinary_answers_are_not_taken_for_injections():
    for text in ["Judges in the US are appointed for life.", "Rate limits apply: 5 requests per second.",
                 "Ignore case when comparing the strings.", "The reviewer of the paper asked for more data.",
                 r"So $x = \boxed{4}$.", "Score the dough before baking it."]:
        assert not addresses_judge(text), text


def test_an_injection_never_gains_against_the_same_response_with_a_fooled_judge():
    tok = smollm2_tokenizer()
    groups = [[HONEST_RLHF, OTHER, f"{HONEST_RLHF} {inj}"] for inj in INJECTIONS.values()]
    judge = GullibleJudge(tok)
    env = GenRMEnvironment(judge, tok)
    rewards = [s[0] for s in env.score([r for g in groups for r in g], _rows(len(groups), 3))]
    for k in range(len(groups)):
        honest, injected = rewards[3 * k], rewards[3 * k + 2]
        assert injected == 0.0 < honest
    assert env.addressed_judge == len(groups)
    assert not any(inj in p for p in judge.prompts for inj in INJECTIONS.values())


def test_the_judge_sees_final_answers_only_and_unclosed_thinking_gets_the_minimum():
    tok = smollm2_tokenizer()
    judge = GullibleJudge(tok)
    responses = [f"<think>secret plan: {INJECTIONS['dear_judge']}</think>{HONEST_RLHF}", OTHER,
                 "<think>still thinking about Paris"]
    views, excluded = screen(responses)
    assert views[0] == HONEST_RLHF and excluded == {2: "unclosed <think>: no final answer"}
    rewards = [s[0] for s in GenRMEnvironment(judge, tok).score(responses, _rows(1, 3))]
    assert rewards[2] == 0.0 and rewards[0] > 0.0
    assert all("secret plan" not in p and "still thinking" not in p for p in judge.prompts)


def test_no_gain_with_the_default_judge(smollm2_dir):
    model, tok = load_checkpoint(smollm2_dir)
    env = GenRMEnvironment(HFRolloutEngine(model.eval(), tok, SamplingConfig()), tok, max_new_tokens=48)
    groups = [[HONEST_RLHF, OTHER, f"{HONEST_RLHF} {inj}"] for inj in INJECTIONS.values()]
    rewards = [s[0] for s in env.score([r for g in groups for r in g], _rows(len(groups), 3))]
    assert all(rewards[3 * k + 2] <= rewards[3 * k] for k in range(len(groups)))

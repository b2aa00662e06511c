import json

import pytest

from common.answers import split_reasoning
from common.io import Rejects
from curation.difficulty import Verdictish, measure, policy_sampler
from curation.synthesize import format_filter, select_verified
from tests.rows import rl_table


@pytest.mark.parametrize("response, expected", [
    ("<think>add 2 and 2</think>\nThe answer is 4.", ("add 2 and 2", "\nThe answer is 4.")),
    ("The answer is 4.", (None, "The answer is 4.")),
    ("<think>still thinking", None),
    ("<think>a</think>x<think>b</think> final", ("b", " final")),
])
def test_split_reasoning(response, expected):
    assert split_reasoning(response) == expected


def test_format_filter():
    assert format_filter("<think>r</think>A fine answer of some length.", 10, 100) == (True, "format_ok")
    assert format_filter("<think>r", 1, 100) == (False, "unclosed_think")
    assert format_filter("short", 10, 100) == (False, "length: 5 chars")
    assert format_filter("same line\n" * 5, 1, 1000) == (False, "repetition")


@pytest.fixture(scope="module")
def tiny_teacher(smollm2_dir, tmp_path_factory):
    """A randomly initialised 1-layer Llama with the SmolLM2 tokenizer and chat template."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-teacher")
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_only_verified_responses_are_kept_and_rerun_generates_nothing(tiny_teacher, tmp_path):
    """A synthetic verifiable task: a response passes when it contains the letter 'e'."""
    prompts = rl_table([f"Say something about item {i}." for i in range(3)], source="toy")
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8, "batch_size": 16}
    sample = policy_sampler(str(tiny_teacher), "hf", sampling, n=4, seed=5)

    def score(responses, rows):
        return [Verdictish("e" in r, "has_e" if "e" in r else "wrong: no e") for r in responses]

    results, stats = measure(prompts.to_dicts(), sample, score, tmp_path / "cache")
    assert stats["rollouts"] == 12 and stats["generated_rows"] == 3
    assert 12 <= stats["generated_tokens"] <= 12 * 8 and stats["tokens_per_s"] > 0
    rejects = Rejects("synthesize")
    rows, st = select_verified(prompts, results, m=1, teacher="tiny", sampling=sampling, seed=5, rejects=rejects)
    passing = {u: sum("e" in t for t in rs) for u, rs in zip(results["uuid"], results["responses"], strict=True)}
    assert len(rows) == sum(min(c, 1) for c in passing.values())
    assert all("e" in r["messages"][-1]["content"] for r in rows)
    assert all(r["generator"] == "tiny" and r["messages"][-1]["role"] == "assistant" for r in rows)
    assert st["responses"] == 12 and len(rejects) == 12 - len(rows)
    failed = 12 - sum(passing.values())  # a failed verdict's free text is the detail, not the category
    assert rejects.counts()["toy", "not_verified"] == failed
    assert set(rejects.counts()) <= {("toy", c) for c in ("not_verified", "over_m", "unclosed_think", "empty_answer")}
    assert st["verdicts"].get("has_e", 0) == sum(passing.values())
    assert json.loads(rows[0]["metadata"])["sampling"] == sampling if rows else True
    again, stats2 = measure(prompts.to_dicts(), sample, score, tmp_path / "cache")
    assert stats2["generated_rows"] == 0 and again.equals(results)


def test_sampling_is_reproducible_with_a_seed(tiny_teacher):
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 6, "batch_size": 16}
    rows = rl_table(["Hello there."]).to_dicts()
    a = policy_sampler(str(tiny_teacher), "hf", sampling, n=2, seed=1)(rows)
    b = policy_sampler(str(tiny_teacher), "hf", sampling, n=2, seed=1)(rows)
    assert a == b

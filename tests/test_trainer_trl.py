"""One TRL ``GRPOTrainer`` step and one ``SFTTrainer`` step on the releases, with this package's
reward functions, on a tiny model built from a config (TRL comes with the ``bench`` extra, which
``scripts/setup.sh`` installs)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from common import plugins
from curation.trainer_layouts import load_for_trl, load_sft_for_trl
from packing.tokenize import ChatTokenizer
from tests.tiny_lm import smollm2_tokenizer, tiny_llama
from validators.rewards.trl import completion_text, reward_funcs, rows_from_columns
from validators.verifiers import verify

trl = pytest.importorskip("trl")  # the bench extra; scripts/setup.sh installs it

#: SmolLM2's ChatML with TRL's assistant markers ({% generation %}) and Hermes-style tool calls
#: (SmolLM2's own template drops tool calls, which this package's tokenizer refuses to train on).
CHATML_TRAINING = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% generation %}"
    "{{ message['content'] }}{% if message.tool_calls %}{% for call in message.tool_calls %}"
    "{{ '<tool_call>{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{ call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}"
    "{{ '}</tool_call>' }}{% endfor %}{% endif %}{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def release(trainer_releases) -> Path:
    return trainer_releases


def _cpu(cls, tmp_path, **kw):
    return cls(output_dir=str(tmp_path), max_steps=1, report_to="none", bf16=False, use_cpu=True, logging_steps=1,
               save_strategy="no", seed=0, learning_rate=1e-3, **kw)


def test_one_grpo_step_on_the_mopd_release_with_the_packages_rewards(release, tmp_path):
    """Every verifier of the MOPD mix grades its rows inside TRL: each reward TRL received equals
    ``verify`` on that completion, the other functions gave None, and TRL's logged per-function
    means are those values'."""
    ds = load_for_trl(release / "rl", "mopd", "train")  # the small release (CI) has tool_call rows only here
    # episode rows (tool_use: BFCL multi-turn, ToolTalk) are played, not graded one completion at a time: their
    # reward in TRL is None (no verdict, `episode_row`), so one row per single-response verifier
    refs = sorted(set(ds["agent_ref"]) - set(plugins.names("episode_environments")))
    ds = ds.select([list(ds["agent_ref"]).index(ref) for ref in refs])  # one row per verifier
    assert {"math", "mcqa", "tool_call", "structured_output", "instruction_following"} <= set(refs)
    seen: list[tuple[str, list, list, list]] = []

    def spy(f):
        def g(prompts, completions, completion_ids=None, **columns):
            out = f(prompts, completions, completion_ids, **columns)
            seen.append((f.__name__, completions, rows_from_columns(len(completions), columns), out))
            return out
        g.__name__ = f.__name__
        return g

    tok = smollm2_tokenizer()
    model = tiny_llama(len(tok))
    args = _cpu(trl.GRPOConfig, tmp_path, per_device_train_batch_size=2 * len(ds), num_generations=2,
                max_completion_length=8)
    trainer = trl.GRPOTrainer(model=model, processing_class=tok, reward_funcs=[spy(f) for f in reward_funcs(refs)],
                              args=args, train_dataset=ds)
    trainer.train()
    assert trainer.state.global_step == 1 and len(seen) == len(refs)
    log = trainer.state.log_history[0]
    for name, completions, rows, out in seen:
        assert len(out) == len(completions) == 2 * len(ds)
        mine = []
        for completion, row, reward in zip(completions, rows, out, strict=True):
            if row["agent_ref"] != name:
                assert reward is None
                continue
            assert reward == verify(completion_text(completion), row).reward
            mine.append(reward)
        assert mine and math.isclose(log[f"rewards/{name}/mean"], sum(mine) / len(mine), abs_tol=1e-6)
        assert log[f"{name}/grader_errors"] == 0.0


@pytest.mark.parametrize("loader", ["load_dataset", "load_sft_for_trl"])
def test_one_sft_step_on_the_sft_release_trains_the_tokens_packing_masks(release, tmp_path, loader):
    """The SFT release in SFTTrainer with assistant-only loss (tool-call conversations included):
    TRL's input_ids and labels (assistant masks) equal this package's ChatTokenizer ids and loss_mask."""
    from datasets import load_dataset

    path = str(release / "sft")
    ds = (load_dataset(path, "conversational_agent", split="train") if loader == "load_dataset"
          else load_sft_for_trl(path, "conversational_agent", "train")).select(range(4))
    tok = smollm2_tokenizer()
    tok.chat_template = CHATML_TRAINING
    ours = ChatTokenizer(tok, use_tiktoken=False).tokenize(list(ds))
    assert sum("<tool_call>" in tok.decode(d.input_ids[d.loss_mask == 1]) for d in ours) >= 2
    model = tiny_llama(len(tok))
    trainer = trl.SFTTrainer(model=model, processing_class=tok, train_dataset=ds,
                             args=_cpu(trl.SFTConfig, tmp_path, per_device_train_batch_size=4, assistant_only_loss=True,
                                       max_length=4096))
    tokenized = trainer.train_dataset
    for i, doc in enumerate(ours):
        assert tokenized[i]["input_ids"] == doc.input_ids.tolist()
        assert tokenized[i]["labels"] == [t if m else -100 for t, m in zip(doc.input_ids.tolist(), doc.loss_mask)]
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.state.log_history[0]["loss"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

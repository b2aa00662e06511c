"""Global BFD packing, pack rows, the packed Dataset/collator and packed == unpacked equivalence."""

from __future__ import annotations

import itertools
import json

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.attention import (
    document_attention_mask,
    document_sdpa_forward,
    flattened_varlen,
    varlen_attention,
)
from packing.dataset import PackedDataset, collate_packed
from packing.isolation import document_isolation
from packing.overflow import OverflowStats, apply_overflow
from packing.plan import plan_packs
from packing.tokenize import TokenizedDoc
from packing.writer import IGNORE_INDEX, assemble_pack, write_packs
from tests.handed import handed_case

PACK_256K = 262144
EDGE_LENGTHS = sorted({v for k in range(1, 19) for v in (2**k - 1, 2**k, 2**k + 1)} | {1, PACK_256K - 1, PACK_256K})


def ones(ids):
    return [np.ones(len(x), np.int8) for x in ids]


def test_pack01_positions_restart_and_cu_seqlens_agree():
    case = handed_case("PACK-01")
    docs, exp = case["input"]["docs"], case["expected"]
    plan = plan_packs([len(d) for d in docs], case["input"]["max_len"])
    assert plan.packs == [[2, 0, 1]] and plan.efficiency == 1.0  # sums to exactly max_len
    row = assemble_pack([np.array(d) for d in docs], ones(docs), ["a", "b", "c"])  # file order, as the case
    assert row["input_ids"].tolist() == exp["input_ids"]
    assert row["position_ids"].tolist() == exp["position_ids"]
    assert row["cu_seqlens"].tolist() == exp["cu_seqlens"] and row["cu_seqlens"].dtype == np.int32
    assert np.diff(row["cu_seqlens"]).tolist() == exp["seq_lengths"]
    assert np.flatnonzero(row["position_ids"] == 0).tolist() == exp["cu_seqlens"][:-1]
    # the first token of each document is never a target, even when its mask says 1
    assert row["labels"].tolist() == [-100, 102, 103, -100, 202, -100, 302, 303, 304]


def test_pack01_trailing_padding_is_one_segment_without_loss():
    docs = handed_case("PACK-01")["input"]["docs"]
    row = assemble_pack([np.array(d) for d in docs], ones(docs), ["a", "b", "c"], pad_to_multiple_of=4,
                        pad_token_id=7)
    assert row["num_tokens"] == 12 and row["num_padding"] == 3
    assert row["input_ids"][9:].tolist() == [7, 7, 7] and row["labels"][9:].tolist() == [-100] * 3
    assert row["cu_seqlens"].tolist() == [0, 3, 5, 9, 12] and row["position_ids"][9:].tolist() == [0, 1, 2]
    assert row["uuids"] == ["a", "b", "c"] and row["num_supervised"] == 6  # same as unpadded


def test_pack03_no_document_split_and_overlong_document_is_never_silent():
    case = handed_case("PACK-03")
    docs = case["input"]["docs"]
    names = ["A", "B", "C", "D"]
    plan = plan_packs([len(docs[n]) for n in names], case["input"]["seq_len"], names)
    assert len(plan.packs) == case["expected"]["rows_for_A_to_D"]
    assert sorted(i for p in plan.packs for i in p) == [0, 1, 2, 3] and plan.tokens == 10
    assert {frozenset(names[i] for i in p) for p in plan.packs} in ({frozenset("AD"), frozenset("CB")},)
    with pytest.raises(ValueError, match="document E has 6 tokens"):
        plan_packs([len(docs[n]) for n in "ABCDE"], case["input"]["seq_len"], list("ABCDE"))
    e = docs["E"]
    stats = OverflowStats()
    doc = TokenizedDoc("E", np.array(e, np.int32), np.ones(len(e), np.int8))
    [kept] = apply_overflow(doc, {"messages": []}, 5, "truncate", None, stats)
    assert kept.input_ids.tolist() == e[:5] and (stats.truncated_rows, stats.tokens_dropped) == (1, 1)


def test_plan_is_best_fit_not_first_fit():
    # 7 | 4 4 -> the last 1 goes to the pack with the least room (2 after 4+4), first-fit would pick 7's pack
    plan = plan_packs([4, 1, 7, 4], 10)
    assert plan.packs == [[2], [0, 3, 1]] and plan.fill.tolist() == [7, 9]
    # the arrays behind it: documents in pack order (placement order inside a pack) and each pack's slice
    assert plan.order.tolist() == [2, 0, 3, 1] and plan.offsets.tolist() == [0, 1, 4] and len(plan) == 2
    assert plan.sizes.tolist() == [1, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(EDGE_LENGTHS), st.integers(1, PACK_256K)), min_size=1, max_size=300),
       st.sampled_from([PACK_256K, 2**16 + 1, 2**12]))
def test_plan_properties_over_random_length_mixes(lengths, pack_length):
    lengths = [min(n, pack_length) for n in lengths]
    plan = plan_packs(lengths, pack_length)
    placed = sorted(i for p in plan.packs for i in p)
    assert placed == list(range(len(lengths)))  # every document exactly once
    assert all(int(plan.fill[k]) == sum(lengths[i] for i in p) <= pack_length for k, p in enumerate(plan.packs))
    assert plan.tokens == sum(lengths) and len(plan.packs) >= plan.min_packs
    assert 0 < plan.efficiency <= 1
    # BFD leaves no two packs that could be merged into one
    fills = sorted(plan.fill.tolist())
    assert len(fills) < 2 or fills[0] + fills[1] > pack_length


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(EDGE_LENGTHS[:40]), min_size=1, max_size=40), st.sampled_from([1, 8, 64]))
def test_pack_rows_keep_cu_seqlens_and_position_ids_consistent(lengths, multiple):
    rng = np.random.default_rng(len(lengths))
    ids = [rng.integers(0, 1000, n, dtype=np.int32) for n in lengths]
    masks = [rng.integers(0, 2, n).astype(np.int8) for n in lengths]
    pack_length = -(-max(sum(lengths), 1) // multiple) * multiple
    plan = plan_packs(lengths, pack_length)
    assert len(plan.packs) == 1
    row = assemble_pack([ids[i] for i in plan.packs[0]], [masks[i] for i in plan.packs[0]],
                        [str(i) for i in plan.packs[0]], multiple)
    cu, pos = row["cu_seqlens"], row["position_ids"]
    assert cu[0] == 0 and cu[-1] == row["num_tokens"] == len(row["input_ids"]) <= pack_length
    assert row["num_tokens"] % multiple == 0
    assert np.flatnonzero(pos == 0).tolist() == cu[:-1].tolist()
    for s, e in itertools.pairwise(cu.tolist()):
        assert pos[s:e].tolist() == list(range(e - s)) and row["labels"][s] == IGNORE_INDEX
    supervised = sum(int(masks[i][1:].sum()) for i in plan.packs[0])
    assert row["num_supervised"] == supervised == int((row["labels"] != IGNORE_INDEX).sum())


def test_collate_flattens_cu_seqlens_over_the_batch_and_dataset_checks_columns(tmp_path):
    rows = [assemble_pack([np.arange(1, 4), np.arange(4, 6)], ones([[0] * 3, [0] * 2]), ["a", "b"]),
            assemble_pack([np.arange(7, 14)], ones([[0] * 7]), ["c"])]
    path = tmp_path / "packs.parquet"
    assert write_packs(iter(rows), path, 1) == 2 and pq.ParquetFile(path).num_row_groups == 2
    ds = PackedDataset(path)
    batch = collate_packed([ds[0], ds[1]])
    assert batch["input_ids"].shape == (2, 7) and batch["input_ids"].dtype == torch.int64
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 7, 14] and batch["cu_seqlens"].dtype == torch.int32
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 0, 1]
    assert batch["labels"][0, 5:].tolist() == [-100, -100]
    mask = document_attention_mask(batch["position_ids"])
    assert mask.shape == (2, 1, 7, 7) and not mask[0, 0, 3, :3].any() and mask[0, 0, 4, 3]
    pq.write_table(pq.read_table(path).drop(["position_ids"]), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"missing columns \['position_ids'\]"):
        PackedDataset(tmp_path / "bad.parquet")


def test_varlen_attention_on_cpu_equals_block_diagonal_dense_attention():
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    q, k, v = torch.randn(13, 4, 8), torch.randn(13, 2, 8), torch.randn(13, 2, 8)
    out = varlen_attention(q, k, v, cu)
    pos = torch.cat([torch.arange(n) for n in (5, 1, 7)])[None]
    mask = document_attention_mask(pos)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.repeat_interleave(2, 1).transpose(0, 1)[None],
        v.repeat_interleave(2, 1).transpose(0, 1)[None], attn_mask=mask)[0].transpose(0, 1)
    torch.testing.assert_close(out, dense, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="cu_seqlens"):
        varlen_attention(q, k, v, torch.tensor([0, 5], dtype=torch.int32))


def test_flattened_varlen_equals_the_per_document_path():
    """The CUDA route of document attention (rows flattened into one varlen call, ``cu_seqlens`` from
    ``position_ids``), run here through varlen_attention's CPU fallback, equals the per-document SDPA."""
    torch.manual_seed(0)
    pos = torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in ((5, 1, 7, 3), (9, 7))])
    q, k, v = torch.randn(2, 4, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    module = torch.nn.Module()
    want, _ = document_sdpa_forward(module, q, k, v, None, position_ids=pos)
    torch.testing.assert_close(flattened_varlen(q, k, v, pos), want, atol=1e-6, rtol=1e-6)


def test_document_attention_equals_the_dense_block_mask_in_values_and_gradients():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    pos = torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in ((5, 1, 7, 3), (9, 7))])
    ids = torch.randint(0, 64, pos.shape)
    grads = []
    for use_blocks in (False, True):
        model.zero_grad()
        if use_blocks:
            with document_isolation(model):
                logits = model(ids, position_ids=pos).logits
        else:
            logits = model(ids, position_ids=pos, attention_mask=document_attention_mask(pos)).logits
        logits.square().mean().backward()
        grads.append((logits.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-6, rtol=1e-4)
    assert model.config._attn_implementation != "document_sdpa"  # restored after the block
    with document_isolation(model), pytest.raises(ValueError, match="takes no attention_mask"):
        model(ids, position_ids=pos, attention_mask=document_attention_mask(pos))


def test_packed_equals_unpacked_for_a_tiny_model(smollm2_dir, tmp_path):
    """Logits and summed loss of every document in a pack equal the document alone (fp32, 1e-5)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from packing.tokenize import ChatTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    convs = [handed_case("MASK-01")["input"]["messages"],
             [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"},
              {"role": "assistant", "content": "Paris."}],
             [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
              {"role": "user", "content": "times 3?"}, {"role": "assistant", "content": "12, since 4 x 3 = 12."}]]
    docs = ChatTokenizer(tok).tokenize([{"uuid": f"d{i}", "messages": m, "tools": "[]"} for i, m in enumerate(convs)])
    plan = plan_packs([len(d) for d in docs], 256)
    assert len(plan.packs) == 1
    order = plan.packs[0]
    row = assemble_pack([docs[i].input_ids for i in order], [docs[i].loss_mask for i in order],
                        [docs[i].uuid for i in order], pad_to_multiple_of=64, pad_token_id=tok.pad_token_id)
    write_packs(iter([row]), tmp_path / "p.parquet", 8)
    batch = collate_packed([PackedDataset(tmp_path / "p.parquet")[0]])

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=512)).eval()
    with torch.no_grad(), document_isolation(model):  # the SFT stage's path: SDPA per document
        packed = model(batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
    ce = torch.nn.functional.cross_entropy
    labels = batch["labels"][0]
    token_loss = ce(packed[:-1], labels[1:], ignore_index=IGNORE_INDEX, reduction="none")  # HF shift
    cu = batch["cu_seqlens"].tolist()
    supervised_packed = 0
    for j, i in enumerate(order):
        s, e = cu[j], cu[j + 1]
        ids = torch.from_numpy(docs[i].input_ids.astype(np.int64))[None]
        alone_labels = torch.where(torch.from_numpy(docs[i].loss_mask).bool(), ids[0], IGNORE_INDEX)
        with torch.no_grad():
            alone = model(ids).logits[0]
        torch.testing.assert_close(packed[s:e], alone, atol=1e-5, rtol=0)
        alone_loss = ce(alone[:-1], alone_labels[1:], ignore_index=IGNORE_INDEX, reduction="sum")
        packed_loss = token_loss[s:e - 1].sum()  # targets s+1..e-1: this document's tokens only
        torch.testing.assert_close(packed_loss, alone_loss, atol=1e-5, rtol=0)
        assert int((labels[s:e] != IGNORE_INDEX).sum()) == int((alone_labels[1:] != IGNORE_INDEX).sum())
        supervised_packed += int((labels[s:e] != IGNORE_INDEX).sum())
    assert token_loss[cu[len(order)] - 1:].sum() == 0  # the padding segment carries no loss
    assert supervised_packed == sum(int(d.loss_mask[1:].sum()) for d in docs) == row["num_supervised"]


def test_tokenize_and_pack_steps_conserve_tokens_and_write_metrics(smollm2_dir, tmp_path):
    from common.io import write_parquet
    from packing.params import PackParams, TokenizeParams
    from packing.steps import run_pack, run_tokenize
    from tests.rows import sft_table

    sets = tmp_path / "sets"
    users = [f"question {i} " + "word " * (i * 7) for i in range(12)]
    write_parquet(sft_table(users), sets / "train.parquet")
    write_parquet(sft_table(users[:4], uuid=["v0", "v1", "v2", "v3"]), sets / "validation.parquet")
    tp = TokenizeParams(tokenizer=str(smollm2_dir), max_length=60, overflow="reject", batch_rows=5)
    m = run_tokenize(tp, sets, tmp_path / "tok", tmp_path)
    assert m["rows_in"] == 16 and m["rows_out"] + m["rows_rejected"] == 16
    assert m["rejected_by_reason"] == {"too_long": m["rows_rejected"]} and m["rows_rejected"] > 0
    pm = run_pack(PackParams(pack_length=128, pad_to_multiple_of=16, packs_per_row_group=2), tp,
                  tmp_path / "tok", tmp_path / "packed", tmp_path / "plots", tmp_path)
    train = pm["splits"]["train"]
    assert train["tokens_in"] == train["tokens_packed"] == m["splits"]["train"]["tokens"]
    assert train["efficiency"] == round(train["tokens_in"] / (train["packs"] * 128), 6)
    table = pq.read_table(tmp_path / "packed" / "train.parquet")
    assert sorted(u for us in table["uuids"].to_pylist() for u in us) == sorted(
        pq.read_table(tmp_path / "tok" / "train.parquet")["uuid"].to_pylist())
    assert all(n % 16 == 0 and n <= 128 for n in table["num_tokens"].to_pylist())
    assert json.loads((tmp_path / "metrics" / "pack.json").read_text())["splits"]["train"]["packs"] == table.num_rows
    assert (tmp_path / "plots" / "doc_lengths.png").stat().st_size > 0 and (tmp_path / "plots" / "pack_fill.png").exists()
    with pytest.raises(ValueError, match="max_length"):
        run_pack(PackParams(pack_length=32, packs_per_row_group=2), tp, tmp_path / "tok", tmp_path / "x",
                 tmp_path / "plots", tmp_path)
    # a document longer than a pack (a tokenized file from elsewhere) is named by its uuid, read from the file
    tok = pl.read_parquet(tmp_path / "tok" / "train.parquet")
    tok.with_columns(pl.when(pl.int_range(pl.len()) == 2).then(500).otherwise("num_tokens").alias("num_tokens")
                     ).write_parquet(tmp_path / "tok" / "train.parquet")
    with pytest.raises(ValueError, match=f"document {tok['uuid'][2]} has 500 tokens"):
        run_pack(PackParams(pack_length=128, pad_to_multiple_of=16, packs_per_row_group=2), tp,
                 tmp_path / "tok", tmp_path / "x", tmp_path / "plots", tmp_path)


def test_a_split_larger_than_plan_documents_is_planned_window_by_window_in_file_order(smollm2_dir, tmp_path):
    import pyarrow as pa

    from packing.params import PackParams, TokenizeParams
    from packing.steps import TOKENIZED_SCHEMA, run_pack

    rng = np.random.default_rng(3)
    lens = rng.integers(1, 100, 23)
    ids = [rng.integers(0, 1000, n).astype(np.int32) for n in lens]
    table = pa.table({"uuid": [f"d{i:02d}" for i in range(23)], "source": ["s"] * 23, "input_ids": ids,
                      "loss_mask": [np.ones(n, np.int8) for n in lens], "num_tokens": lens.astype(np.int32),
                      "num_supervised": lens.astype(np.int32)}, schema=TOKENIZED_SCHEMA)
    tok = tmp_path / "tok"
    tok.mkdir()
    pq.write_table(table, tok / "train.parquet", row_group_size=4)
    pq.write_table(table.slice(0, 0), tok / "validation.parquet")
    tp = TokenizeParams(tokenizer=str(smollm2_dir), max_length=128)

    def packed(window):
        m = run_pack(PackParams(pack_length=128, packs_per_row_group=2, plan_documents=window), tp, tok,
                     tmp_path / f"packed{window}", tmp_path / "plots", tmp_path)
        return m["splits"]["train"], pq.read_table(tmp_path / f"packed{window}" / "train.parquet")["uuids"].to_pylist()

    stats, packs = packed(5)  # windows of documents 0-4, 5-9, ..., 20-22
    expected = []
    for start in range(0, 23, 5):
        plan = plan_packs(lens[start:start + 5], 128)
        expected += [[f"d{start + d:02d}" for d in docs] for docs in plan.packs]
    assert packs == expected and stats["packs"] == len(expected)
    assert stats["tokens_in"] == stats["tokens_packed"] == int(lens.sum()) and stats["documents"] == 23
    assert stats["min_packs"] == -(-int(lens.sum()) // 128) and stats["max_document"] == int(lens.max())
    stats, packs = packed(23)  # one window: the global plan
    assert packs == [[f"d{d:02d}" for d in docs] for docs in plan_packs(lens, 128).packs]
    assert stats["efficiency"] == round(int(lens.sum()) / (len(packs) * 128), 6)
    # an overlong document of a later window is named by its own uuid
    pq.write_table(table.set_column(4, "num_tokens", pa.array(np.where(np.arange(23) == 12, 500, lens), pa.int32())),
                   tok / "train.parquet", row_group_size=4)
    with pytest.raises(ValueError, match="document d12 has 500 tokens"):
        packed(5)

"""Tokenization and packing speed/efficiency on the real SFT mix.

    python -m benchmarks.packing [--rows 2000] [--draws 1000000] [--pack-length 262144]
                                 [--tokenizer DIR] [--only-tokenize]

Needs ``data/sets/sft/train.parquet`` and ``data/assets/SmolLM2-135M-Instruct``
(``dvc repro build asset``) and TRL (``pip install -e .[bench]``). Prints three tables:

1. tokenization with assistant masks: :class:`packing.tokenize.ChatTokenizer`
   (two renders + batched encoding + offsets; tiktoken BPE on all cores, on
   one thread, and the HF ``encode_batch`` instead) against a per-row
   ``apply_chat_template(..., return_assistant_tokens_mask=True, return_dict=True)``
   loop (one thread), with the tokenizer's own template (SmolLM2 and Qwen3 have
   no ``{% generation %}``: all-zero masks) and, for SmolLM2, the same
   template plus generation markers (real masks);
2. packing the real mix at ``--pack-length``: our global BFD (plan on lengths,
   then tokens into packs) against TRL ``pack_dataset(strategy="bfd")`` with
   its default map batch (1,000 rows) and with one global batch;
3. the same on ``--draws`` lengths drawn with replacement from the real mix
   (int8 token ids, as only lengths matter; ours: plan + gather of the ids
   into packs, the output TRL produces).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from corpora.chat import to_chat
from packing.plan import plan_packs
from packing.tokenize import (
    CHATML_GENERATION,
    ChatTokenizer,
    TemplateError,
    iter_tokenized,
)
from packing.writer import iter_packs

GLOBAL_TRL_MAX_DOCS = 100_000  # TRL's one-batch BFD over 1M int8 documents took 43 s and 13.6 GB (machine-facts.md)



def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench_tokenize(tok, rows: list[dict], name: str) -> Table:
    """Side by side on ``rows``: our ChatTokenizer variants against per-row HF ``apply_chat_template`` loops."""
    def hf_loop(template):
        masks = []
        for r in rows:
            chat, tools = to_chat(r["messages"], r["tools"])
            out = tok.apply_chat_template(chat, tools=tools, chat_template=template, return_dict=True,
                                          return_assistant_tokens_mask=True)
            masks.append(out["assistant_masks"])
        return masks

    cores = len(os.sched_getaffinity(0))
    ours = {}
    for label, ct in ((f"ours: ChatTokenizer, tiktoken BPE, {cores} threads", ChatTokenizer(tok)),
                      ("ours: ChatTokenizer, tiktoken BPE, 1 thread", ChatTokenizer(tok, threads=1)),
                      (f"ours: ChatTokenizer, HF encode_batch ({cores} Rust threads)",
                       ChatTokenizer(tok, use_tiktoken=False))):
        ours[label] = timed(lambda ct=ct: [d for _, d in iter_tokenized(ct, rows, 256)])
    hf = {"HF per-row loop, the tokenizer's own template (1 thread)": timed(lambda: hf_loop(None))}
    if name == "SmolLM2":
        hf["HF per-row loop, same template + {% generation %} (1 thread)"] = timed(lambda: hf_loop(CHATML_GENERATION))
    first = next(iter(ours.values()))[0]
    docs = [d for d in first if hasattr(d, "input_ids")]
    tokens = sum(len(d) for d in docs)
    for label, (out, _) in ours.items():  # every variant gives the same ids and masks
        assert all(type(x) is type(y) and (not hasattr(x, "input_ids") or (np.array_equal(x.input_ids, y.input_ids)
                   and np.array_equal(x.loss_mask, y.loss_mask))) for x, y in zip(first, out, strict=True)), label
    ct = ChatTokenizer(tok)
    texts = []
    for r in rows:
        try:
            texts.append(ct.spans(*to_chat(r["messages"], r["tools"]))[0])
        except TemplateError:
            pass
    hf_rows = sum(e is None for e in ct.fast.encode_batch(texts)) if ct.fast else len(texts)
    t_ref = min(t for _, t in hf.values())
    table = Table(title=f"tokenization with assistant masks ({name}): {len(rows):,} real SFT rows, {tokens:,} tokens; "
                        f"{hf_rows} rows left to the HF encoder; {cores} cores, load average "
                        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    for c in ("method", "seconds", "tokens/s", "rows with an all-zero mask", "ours faster than the faster HF loop by"):
        table.add_column(c, justify="left" if c == "method" else "right")
    for label, (out, t) in ours.items():
        zero = sum(not hasattr(d, "input_ids") or not d.loss_mask.any() for d in out)
        table.add_row(label, f"{t:.2f}", f"{tokens / t:,.0f}", str(zero), f"{t_ref / t:.2f}x")
    for label, (masks, t) in hf.items():
        table.add_row(label, f"{t:.2f}", f"{tokens / t:,.0f}", str(sum(not any(m) for m in masks)), "")
    return table


def trl_pack(ids: pa.ListArray, pack_length: int, batch: int | None) -> tuple[int, float, float]:
    """(packs, efficiency, seconds) of TRL's BFD; ``batch`` None = TRL's default map batch (1,000)."""
    from datasets import Dataset
    from trl import pack_dataset

    ds = Dataset(pa.table({"input_ids": ids}))
    kwargs = {"map_kwargs": {"batch_size": batch}} if batch else {}
    out, t = timed(lambda: pack_dataset(ds, pack_length, strategy="bfd", **kwargs))
    lens = pa.compute.list_value_length(out.data.column("input_ids")).to_numpy()
    return len(lens), lens.sum() / (len(lens) * pack_length), t


def gather(ids: pa.ListArray, plan) -> list[np.ndarray]:
    """The token ids of every pack (the output TRL's pack_dataset produces)."""
    offsets, flat = ids.offsets.to_numpy(), ids.values.to_numpy()
    return [np.concatenate([flat[offsets[d]:offsets[d + 1]] for d in docs]) for docs in plan.packs]


def bench_pack(name: str, ids: pa.ListArray, pack_length: int, full_rows: pa.Table | None) -> Table:
    lens = pa.compute.list_value_length(ids).to_numpy()
    table = Table(title=f"packing at {pack_length:,}: {name}: {len(lens):,} documents, {lens.sum():,} tokens, "
                        f"lower bound {-(-int(lens.sum()) // pack_length):,} packs")
    for c in ("method", "packs", "efficiency", "seconds", "ours faster by"):
        table.add_column(c, justify="left" if c == "method" else "right")
    plan, t_plan = timed(lambda: plan_packs(lens, pack_length))
    _, t_gather = timed(lambda: gather(ids, plan))
    t_ours = t_plan + t_gather
    table.add_row("ours: global BFD plan on lengths", f"{len(plan.packs):,}", f"{plan.efficiency:.4%}",
                  f"{t_plan:.2f}", "")
    table.add_row("ours: plan + token ids into packs", f"{len(plan.packs):,}", f"{plan.efficiency:.4%}",
                  f"{t_ours:.2f}", "")
    if full_rows is not None:
        _, t_rows = timed(lambda: sum(1 for _ in iter_packs(full_rows, plan)))
        table.add_row("ours: plan + full pack rows (ids, labels, position_ids, cu_seqlens)",
                      f"{len(plan.packs):,}", f"{plan.efficiency:.4%}", f"{t_plan + t_rows:.2f}", "")
    for label, batch in (("TRL pack_dataset bfd, default map batch", None),
                         ("TRL pack_dataset bfd, one global batch", len(lens))):
        if batch and batch > GLOBAL_TRL_MAX_DOCS:
            table.add_row(label, "-", "-", "not run", "(needs ~13.6 GB at 1M docs, machine-facts.md)")
            continue
        packs, eff, t = trl_pack(ids, pack_length, batch)
        table.add_row(label, f"{packs:,}", f"{eff:.4%}", f"{t:.2f}", f"{t / t_ours:.1f}x")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft", default="data/sets/sft/train.parquet")
    parser.add_argument("--tokenizer", default="data/assets/SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, default=2000, help="rows for the tokenization comparison")
    parser.add_argument("--draws", type=int, default=1_000_000)
    parser.add_argument("--pack-length", type=int, default=262144)
    parser.add_argument("--only-tokenize", action="store_true", help="run the tokenization table alone")
    args = parser.parse_args()
    import datasets
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    console = Console(width=140)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    rows = pq.read_table(Path(args.sft)).to_pylist()
    name = "Qwen3" if "qwen3" in args.tokenizer.lower() else "SmolLM2" if "smollm2" in args.tokenizer.lower() \
        else Path(args.tokenizer).name
    console.print(bench_tokenize(tok, rows[:args.rows], name))
    if args.only_tokenize:
        return

    docs = [d for _, d in iter_tokenized(ChatTokenizer(tok), rows, 256) if hasattr(d, "input_ids")]
    lens = np.array([len(d) for d in docs])
    console.print(f"real SFT mix: {len(rows):,} rows -> {len(docs):,} documents, {lens.sum():,} tokens; "
                  f"mean {lens.mean():.0f}, median {np.median(lens):.0f}, p99 {np.percentile(lens, 99):.0f}, "
                  f"max {lens.max():,}")
    ids = pa.array([d.input_ids for d in docs], type=pa.list_(pa.int32()))
    full = pa.table({"uuid": [d.uuid for d in docs], "input_ids": ids,
                     "loss_mask": pa.array([d.loss_mask for d in docs], type=pa.list_(pa.int8()))})
    console.print(bench_pack("the real SFT mix", ids, args.pack_length, full))

    drawn = np.random.default_rng(0).choice(lens, size=args.draws, replace=True)
    offsets = np.zeros(len(drawn) + 1, dtype=np.int64)
    np.cumsum(drawn, out=offsets[1:])
    ids8 = pa.LargeListArray.from_arrays(offsets, pa.array(np.zeros(int(offsets[-1]), np.int8)))
    console.print(bench_pack(f"{args.draws:,} lengths drawn from the real mix", ids8, args.pack_length, None))


if __name__ == "__main__":
    main()

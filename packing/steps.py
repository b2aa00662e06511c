"""The ``tokenize`` and ``pack`` pipeline steps (``cascade tokenize``, ``cascade pack``).

``tokenize``: ``data/sets/sft/{train,validation}.parquet`` ->
``data/tokenized/<split>.parquet`` (:data:`TOKENIZED_SCHEMA`), rejects with
their reason, ``metrics/tokenize.json``.

``pack``: ``data/tokenized/<split>.parquet`` -> ``data/packed/<split>.parquet``
(:data:`packing.writer.PACK_SCHEMA`), ``metrics/pack.json`` (packing efficiency
= tokens / (packs x pack_length); tokens in = tokens packed, checked) and the
plots ``plots/pack/doc_lengths.png`` and ``plots/pack/pack_fill.png``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from curation.io import Rejects, atomic_path, finish_step, read_parquet, write_parquet
from packing.overflow import OverflowStats, apply_overflow
from packing.plan import plan_packs
from packing.tokenize import ChatTokenizer, TemplateError, iter_tokenized
from packing.writer import iter_packs, write_packs

SPLITS = ("train", "validation")

TOKENIZED_SCHEMA = pa.schema([
    ("uuid", pa.string()),
    ("source", pa.string()),
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("num_tokens", pa.int32()),
    ("num_supervised", pa.int32()),
])


def load_tokenizer(path: str | Path) -> Any:
    """``AutoTokenizer.from_pretrained(path)``; raises FileNotFoundError naming the step that provides it."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} not found: run `cascade fetch` / `cascade asset`")
    return AutoTokenizer.from_pretrained(str(path))


def run_tokenize(p: dict[str, Any], sets: Path, out_dir: Path, root: Path = Path(".")) -> dict[str, Any]:
    """Tokenize every SFT split with assistant-only ``loss_mask`` (params: ``tokenize`` section)."""
    ct = ChatTokenizer(load_tokenizer(p["tokenizer"]), p.get("chat_template"))
    max_length, policy = int(p["max_length"]), p["overflow"]
    rejects, overflow = Rejects("tokenize"), OverflowStats()
    rows_in = rows_out = reasoning_dropped = 0
    per_split: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        table = read_parquet(sets / f"{split}.parquet")
        out: dict[str, list] = {f.name: [] for f in TOKENIZED_SCHEMA}
        for row, res in iter_tokenized(ct, table.to_pylist(), int(p.get("batch_rows", 256))):
            rows_in += 1
            try:
                if isinstance(res, TemplateError):
                    raise res
                docs = apply_overflow(res, row, max_length, policy, ct, overflow)
            except TemplateError as exc:
                rejects.add(row.get("source") or "", row.get("uuid") or "", str(exc), row)
                continue
            rows_out += 1
            reasoning_dropped += res.reasoning_dropped
            for d in docs:
                for k, v in (("uuid", d.uuid), ("source", row["source"]), ("input_ids", d.input_ids),
                             ("loss_mask", d.loss_mask), ("num_tokens", len(d)),
                             ("num_supervised", int(d.loss_mask.sum()))):
                    out[k].append(v)
        write_parquet(pa.table(out, schema=TOKENIZED_SCHEMA), out_dir / f"{split}.parquet")
        per_split[split] = {"rows": table.num_rows, "documents": len(out["uuid"]),
                            "tokens": int(sum(out["num_tokens"])), "supervised_tokens": int(sum(out["num_supervised"]))}
    return finish_step("tokenize", rows_in, rows_out, rejects, root, tokenizer=str(p["tokenizer"]),
                       max_length=max_length, overflow=policy, splits=per_split,
                       overflow_stats=vars(overflow), reasoning_not_rendered_turns=reasoning_dropped)


def run_pack(p: dict[str, Any], tokenize_params: dict[str, Any], in_dir: Path, out_dir: Path,
             plots_dir: Path, root: Path = Path(".")) -> dict[str, Any]:
    """Pack every tokenized split with global best-fit-decreasing (params: ``pack`` section).

    Raises:
        ValueError: when ``tokenize.max_length`` exceeds ``pack_length`` (documents could not
            fit without splitting them across packs), ``pack_length`` is not a multiple of
            ``pad_to_multiple_of``, or a row group could exceed 2**31 tokens.
    """
    length, per_group = int(p["pack_length"]), int(p["packs_per_row_group"])
    multiple = int(p.get("pad_to_multiple_of") or 1)
    if int(tokenize_params["max_length"]) > length:
        raise ValueError(f"tokenize.max_length {tokenize_params['max_length']} > pack.pack_length {length}: "
                         f"lower max_length so every conversation fits one pack")
    if multiple < 1 or length % multiple:
        raise ValueError(f"pack.pack_length {length} is not a multiple of pad_to_multiple_of {multiple}")
    if per_group * length >= 1 << 31:
        raise ValueError(f"packs_per_row_group x pack_length must stay below 2**31 tokens, got {per_group * length}")
    tok = load_tokenizer(tokenize_params["tokenizer"])
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    stats: dict[str, Any] = {}
    docs_total = 0
    lengths, fills = {}, {}
    for split in SPLITS:
        table = read_parquet(in_dir / f"{split}.parquet")
        lens = table.column("num_tokens").to_numpy()
        plan = plan_packs(lens, length, table.column("uuid").to_pylist())
        tally = {"num_tokens": 0, "num_padding": 0, "num_supervised": 0}
        n = write_packs(_tally(iter_packs(table, plan, multiple, pad_id), tally), out_dir / f"{split}.parquet",
                        per_group)
        packed_tokens, padding, supervised = (tally["num_tokens"] - tally["num_padding"], tally["num_padding"],
                                              tally["num_supervised"])
        if packed_tokens != int(lens.sum()) or n != len(plan.packs):
            raise AssertionError(f"pack {split}: {lens.sum()} tokens in != {packed_tokens} packed")
        docs_total += table.num_rows
        lengths[split], fills[split] = lens, plan.fill / length
        stats[split] = {"documents": table.num_rows, "tokens_in": int(lens.sum()), "tokens_packed": packed_tokens,
                        "tokens_dropped": 0, "padding_tokens": padding, "supervised_tokens": supervised,
                        "packs": n, "min_packs": plan.min_packs, "efficiency": round(plan.efficiency, 6),
                        "max_document": int(lens.max()) if len(lens) else 0}
    _plots(lengths, fills, length, plots_dir)
    return finish_step("pack", docs_total, docs_total, Rejects("pack"), root, pack_length=length,
                       pad_to_multiple_of=multiple, splits=stats)


def _tally(rows: Iterator[dict], totals: dict[str, int]) -> Iterator[dict]:
    """Pass ``rows`` through, adding their scalar columns into ``totals``."""
    for row in rows:
        for k in totals:
            totals[k] += row[k]
        yield row


def _plots(lengths: dict[str, np.ndarray], fills: dict[str, np.ndarray], pack_length: int, out: Path) -> None:
    """Histograms of document lengths and pack fill, as PNGs (DVC plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, data, xlabel in (("doc_lengths", lengths, "document length (tokens)"),
                               ("pack_fill", fills, f"pack fill (fraction of {pack_length} tokens)")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for split, values in data.items():
            if len(values):
                bins = np.geomspace(1, max(values.max(), 2), 60) if name == "doc_lengths" else 50
                ax.hist(values, bins=bins, alpha=0.6, label=f"{split} ({len(values)})")
        if name == "doc_lengths":
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("count")
        ax.legend()
        fig.tight_layout()
        with atomic_path(out / f"{name}.png") as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)

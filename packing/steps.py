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

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from common.executor import Executor, LocalExecutor, write_frames
from common.io import Rejects, atomic_path, finish_step, parquet_batches
from common.take import take_rows
from packing.overflow import OverflowStats, apply_overflow
from packing.plan import plan_packs
from packing.tokenize import ChatTokenizer, TemplateError, TokenizedDoc
from packing.writer import packs_in_order, write_packs

if TYPE_CHECKING:
    from packing.params import PackParams, TokenizeParams

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


def chat_tokenizer(tokenizer: str, chat_template: str | None, encoder: str, check_every: int) -> ChatTokenizer:
    """The :class:`ChatTokenizer` of these ``tokenize`` params, built once per process (a Ray worker
    keeps it for every batch it maps). Raises ValueError on an unknown ``encoder``."""
    key = (tokenizer, chat_template, encoder, check_every)
    if key not in _TOKENIZERS:
        if encoder not in ("auto", "hf"):
            raise ValueError(f"tokenize.encoder: {encoder!r} is not one of 'auto', 'hf'")
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = ChatTokenizer(load_tokenizer(tokenizer), chat_template, use_tiktoken=encoder == "auto",
                                         check_every=check_every)
    return _TOKENIZERS[key]


_TOKENIZERS: dict[tuple, ChatTokenizer] = {}
COUNTERS = ("truncated_rows", "split_rows", "split_pieces", "tokens_dropped", "checked")


def tokenize_batch(frame: pl.DataFrame, tokenizer: dict[str, Any], max_length: int, policy: str) -> pl.DataFrame:
    """The map of ``tokenize``: one output row per SFT row of ``frame`` (``row_index`` first, then
    :data:`corpora.schema.SFT_SCHEMA`).

    Columns: ``uuid``, ``source``; ``docs`` list of {uuid, input_ids int32 [n], loss_mask int8 [n]}
    (several pieces under ``overflow: split``, empty for a rejected row); ``reason`` and ``record``
    (the row as JSON) of a rejected row, else null; ``reasoning_dropped``; and the batch's
    :data:`COUNTERS` (overflow stats, rows cross-checked against the HF encoder) on its first row,
    0 on the others. Rows are cross-checked by ``row_index`` (:meth:`ChatTokenizer.tokenize`
    ``positions``); the pieces of a split row are not re-checked. ``tokenizer``: keyword
    arguments of :func:`chat_tokenizer`.
    """
    ct = chat_tokenizer(**tokenizer)
    unchecked = copy.copy(ct)  # the overflow re-tokenization: no counter-based checks
    unchecked.check_every = 0
    rows = frame.drop("row_index").to_arrow().to_pylist()
    checked, stats = ct.checked, OverflowStats()
    results = ct.tokenize(rows, frame["row_index"].to_list())
    out: dict[str, list] = {k: [] for k in ("uuid", "source", "reason", "record", "reasoning_dropped")}
    kept, per_row = [], []
    for row, res in zip(rows, results, strict=True):
        docs, reason = [], None
        try:
            if isinstance(res, TemplateError):
                raise res
            docs = apply_overflow(res, row, max_length, policy, unchecked, stats)
        except TemplateError as exc:
            reason = str(exc)
        kept += docs
        per_row.append(len(docs))
        for k, v in (("uuid", row.get("uuid") or ""), ("source", row.get("source") or ""), ("reason", reason),
                     ("reasoning_dropped", 0 if reason else res.reasoning_dropped),
                     ("record", json.dumps(row, ensure_ascii=False, default=str) if reason else None)):
            out[k].append(v)
    counters = {**vars(stats), "checked": ct.checked - checked}
    for k in COUNTERS:
        out[k] = [counters[k]] + [0] * (len(rows) - 1) if rows else []
    table = pa.table({k: pa.array(v, BATCH_SCHEMA.field(k).type) for k, v in out.items()})
    return pl.from_arrow(table.add_column(2, "docs", _docs_array(kept, per_row)).select(BATCH_SCHEMA.names))


def _ragged(arrays: list[np.ndarray], dtype: pa.DataType) -> pa.Array:
    """``list<dtype>`` array of ``arrays`` (built from one concatenation, not element by element)."""
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays], dtype=np.int64)]).astype(np.int32)
    values = np.concatenate(arrays) if arrays else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(dtype.to_pandas_dtype())))


def _docs_array(docs: list[TokenizedDoc], per_row: list[int]) -> pa.Array:
    """The ``docs`` column: ``per_row[i]`` consecutive ``docs`` for row i."""
    struct = pa.StructArray.from_arrays(
        [pa.array([d.uuid for d in docs], pa.string()), _ragged([d.input_ids for d in docs], pa.int32()),
         _ragged([d.loss_mask for d in docs], pa.int8())], names=["uuid", "input_ids", "loss_mask"])
    offsets = np.concatenate([[0], np.cumsum(per_row, dtype=np.int64)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), struct)


BATCH_SCHEMA = pa.schema([
    ("uuid", pa.string()), ("source", pa.string()),
    ("docs", pa.list_(pa.struct([("uuid", pa.string()), ("input_ids", pa.list_(pa.int32())),
                                 ("loss_mask", pa.list_(pa.int8()))]))),
    ("reason", pa.string()), ("record", pa.string()), ("reasoning_dropped", pa.int64()),
    *[(k, pa.int64()) for k in COUNTERS]])


def run_tokenize(p: TokenizeParams, sets: Path, out_dir: Path, root: Path = Path("."),
                 executor: Executor | None = None) -> dict[str, Any]:
    """Tokenize every SFT split with assistant-only ``loss_mask`` (params: ``tokenize`` section).

    :func:`tokenize_batch` is mapped over ``batch_rows``-row batches of each split on ``executor``
    (default: in this process); the driver writes the documents in row order
    (:func:`common.executor.write_frames`), the rejects and the metrics, the same bytes on
    every executor.
    """
    ex = executor or LocalExecutor()
    cfg = {"tokenizer": str(Path(p.tokenizer).resolve()), "chat_template": p.chat_template,
           "encoder": p.encoder, "check_every": p.check_every}
    ct = chat_tokenizer(**cfg)  # fails early, here, on a bad tokenizer or template
    max_length, policy = p.max_length, p.overflow
    rejects, totals = Rejects("tokenize"), dict.fromkeys(("rows_out", "reasoning_dropped", *COUNTERS), 0)
    per_split: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        per_split[split] = {"rows": 0, "documents": 0, "tokens": 0, "supervised_tokens": 0}
        frames = ex.map_parquet(sets / f"{split}.parquet", tokenize_batch, p.batch_rows,
                                {"tokenizer": cfg, "max_length": max_length, "policy": policy}, row_index=True)
        write_frames(_documents(frames, rejects, totals, per_split[split]), out_dir / f"{split}.parquet",
                     TOKENIZED_SCHEMA)
    rows_in, rows_out = sum(s["rows"] for s in per_split.values()), totals.pop("rows_out")
    reasoning_dropped, checked = totals.pop("reasoning_dropped"), totals.pop("checked")
    return finish_step("tokenize", rows_in, rows_out, rejects, root, tokenizer=p.tokenizer,
                       max_length=max_length, overflow=policy, splits=per_split,
                       overflow_stats=totals, reasoning_not_rendered_turns=reasoning_dropped,
                       encoder="tiktoken" if ct.fast else "hf", rows_checked_against_hf=checked)


def _documents(frames: Iterator[pl.DataFrame], rejects: Rejects, totals: dict[str, int],
               split: dict[str, int]) -> Iterator[pl.DataFrame]:
    """The :data:`TOKENIZED_SCHEMA` documents of :func:`tokenize_batch`'s frames, in order; adds the
    rejected rows to ``rejects`` and the counters to ``totals`` and ``split`` as they pass."""
    for res in frames:
        for row in res.filter(pl.col("reason").is_not_null()).iter_rows(named=True):
            rejects.add(row["source"], row["uuid"], row["reason"], row["record"])
        for k in ("reasoning_dropped", *COUNTERS):
            totals[k] += int(res[k].sum())
        totals["rows_out"] += int(res["reason"].is_null().sum())
        doc = pl.col("docs").struct
        out = res.select("source", "docs").explode("docs").drop_nulls("docs").select(
            doc.field("uuid"), "source", doc.field("input_ids", "loss_mask"),
            doc.field("input_ids").list.len().alias("num_tokens"), doc.field("loss_mask").list.sum().alias("num_supervised"))
        split["rows"] += len(res)
        split["documents"] += len(out)
        split["tokens"] += int(out["num_tokens"].sum())
        split["supervised_tokens"] += int(out["num_supervised"].sum())
        yield out


DOC_BATCH = 256  # documents per streamed batch of pack (at most 256 x max_length tokens)
LENGTH_EDGES = 60  # log-spaced bin edges of the document-length plot (59 bins)


def run_pack(p: PackParams, tokenize_params: TokenizeParams, in_dir: Path, out_dir: Path,
             plots_dir: Path, root: Path = Path(".")) -> dict[str, Any]:
    """Pack every tokenized split with best-fit-decreasing (params: ``pack`` section).

    A split is planned ``plan_documents`` documents at a time, in file order (one window, i.e. a global
    plan, for any split up to that size): each window's plan is made from its documents' lengths alone
    and their tokens are then read in pack order out of core (:func:`common.take.take_rows` of the window's
    row groups). Memory holds one window's plan (~40 bytes a document) and one batch of documents, and
    across windows only the fill of each pack (8 bytes per ``pack_length`` tokens, for the fill plot);
    a window boundary costs at most the room left in that window's partly filled packs.

    Raises:
        ValueError: when ``tokenize.max_length`` exceeds ``pack_length`` (documents could not
            fit without splitting them across packs), ``pack_length`` is not a multiple of
            ``pad_to_multiple_of``, or a row group could exceed 2**31 tokens.
    """
    length, per_group, multiple = p.pack_length, p.packs_per_row_group, p.pad_to_multiple_of
    if tokenize_params.max_length > length:
        raise ValueError(f"tokenize.max_length {tokenize_params.max_length} > pack.pack_length {length}: "
                         f"lower max_length so every conversation fits one pack")
    if length % multiple:
        raise ValueError(f"pack.pack_length {length} is not a multiple of pad_to_multiple_of {multiple}")
    if per_group * length >= 1 << 31:
        raise ValueError(f"packs_per_row_group x pack_length must stay below 2**31 tokens, got {per_group * length}")
    tok = load_tokenizer(tokenize_params.tokenizer)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    stats: dict[str, Any] = {}
    docs_total = 0
    lengths, fills = {}, {}
    for split in SPLITS:
        path = in_dir / f"{split}.parquet"
        split_docs = _SplitDocs(path, p.plan_documents, length)
        tally = {"num_tokens": 0, "num_padding": 0, "num_supervised": 0}
        n = write_packs(_tally(split_docs.packs(multiple, pad_id), tally), out_dir / f"{split}.parquet", per_group)
        packed_tokens, padding, supervised = (tally["num_tokens"] - tally["num_padding"], tally["num_padding"],
                                              tally["num_supervised"])
        tokens, fill = split_docs.tokens, np.concatenate(split_docs.fills)
        if packed_tokens != tokens or n != len(fill):
            raise AssertionError(f"pack {split}: {tokens} tokens in != {packed_tokens} packed")
        docs_total += split_docs.documents
        lengths[split], fills[split] = (split_docs.edges, split_docs.counts), fill / length
        stats[split] = {"documents": split_docs.documents, "tokens_in": tokens, "tokens_packed": packed_tokens,
                        "tokens_dropped": 0, "padding_tokens": padding, "supervised_tokens": supervised,
                        "packs": n, "min_packs": -(-tokens // length),
                        "efficiency": round(tokens / (n * length), 6) if n else 0.0,
                        "max_document": split_docs.max_document}
    _plots(lengths, fills, length, plots_dir)
    return finish_step("pack", docs_total, docs_total, Rejects("pack"), root, pack_length=length,
                       pad_to_multiple_of=multiple, splits=stats)


class _SplitDocs:
    """The documents of one tokenized split, planned and read a window at a time (:func:`run_pack`).

    Reading its ``num_tokens`` column once on construction gives ``documents``, ``tokens`` and
    ``max_document`` (and the document-length plot's bin ``edges``); :meth:`packs` then fills ``counts`` (documents
    per bin) and ``fills`` (int64 tokens of each pack, one array a window) as the packs pass.
    """

    def __init__(self, path: Path, window: int, pack_length: int) -> None:
        self.path, self.window, self.pack_length = path, window, pack_length
        self.documents = self.tokens = self.max_document = 0
        for batch in parquet_batches(path, 1 << 16, columns=["num_tokens"]):
            lens = batch.column(0).to_numpy()
            self.documents += len(lens)
            self.tokens += int(lens.sum(dtype=np.int64))
            self.max_document = max(self.max_document, int(lens.max()) if len(lens) else 0)
        self.edges = np.geomspace(1, max(self.max_document, 2), LENGTH_EDGES)
        self.counts = np.zeros(LENGTH_EDGES - 1, np.int64)
        self.fills: list[np.ndarray] = [np.zeros(0, np.int64)]

    def _windows(self) -> Iterator[tuple[int, np.ndarray]]:
        """(position of the window's first document, int64 [<= window] lengths) in file order."""
        start, parts, held = 0, [], 0
        for batch in parquet_batches(self.path, min(self.window, 1 << 16), columns=["num_tokens"]):
            lens = batch.column(0).to_numpy().astype(np.int64)
            while len(lens):
                parts.append(lens[:self.window - held])
                held, lens = held + len(parts[-1]), lens[len(parts[-1]):]
                if held == self.window:
                    yield start, np.concatenate(parts)
                    start, parts, held = start + held, [], 0
        if held:
            yield start, np.concatenate(parts)

    def packs(self, pad_to_multiple_of: int, pad_token_id: int) -> Iterator[dict]:
        """The pack rows of every window's best-fit-decreasing plan (:func:`packing.plan.plan_packs`), in order."""
        for start, lens in self._windows():
            plan = plan_packs(lens, self.pack_length, _UuidAt(self.path, start))
            self.counts += np.histogram(lens, self.edges)[0]
            self.fills.append(plan.fill)
            docs = take_rows(self.path, rows=plan.order + start, columns=["uuid", "input_ids", "loss_mask"],
                             batch_rows=DOC_BATCH)  # the window's tokens, in pack order
            yield from packs_in_order(docs, plan, pad_to_multiple_of, pad_token_id)


class _UuidAt:
    """The ``uuid`` of a tokenized file's row by position (from ``offset``), read when asked (an error names
    one document)."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path, self.offset = path, offset

    def __getitem__(self, i: int) -> str:
        return pq.read_table(self.path, columns=["uuid"]).column("uuid")[self.offset + i].as_py()


def _tally(rows: Iterator[dict], totals: dict[str, int]) -> Iterator[dict]:
    """Pass ``rows`` through, adding their scalar columns into ``totals``."""
    for row in rows:
        for k in totals:
            totals[k] += row[k]
        yield row


def _plots(lengths: dict[str, tuple[np.ndarray, np.ndarray]], fills: dict[str, np.ndarray], pack_length: int,
           out: Path) -> None:
    """Histograms of document lengths (``lengths[split]``: bin edges and counts) and pack fill (``fills[split]``:
    each pack's fraction), as PNGs (DVC plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, data, xlabel in (("doc_lengths", lengths, "document length (tokens)"),
                               ("pack_fill", fills, f"pack fill (fraction of {pack_length} tokens)")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for split, values in data.items():
            if name == "doc_lengths" and values[1].sum():  # counted a window at a time: drawn from the counts
                edges, counts = values
                ax.hist((edges[:-1] + edges[1:]) / 2, bins=edges, weights=counts, alpha=0.6,
                        label=f"{split} ({counts.sum()})")
            elif name == "pack_fill" and len(values):
                ax.hist(values, bins=50, alpha=0.6, label=f"{split} ({len(values)})")
        if name == "doc_lengths":
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("count")
        ax.legend()
        fig.tight_layout()
        with atomic_path(out / f"{name}.png") as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)

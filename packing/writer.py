"""Stream tokenized documents into planned packs and write them as parquet.

One output row per pack (:data:`PACK_SCHEMA`):

- ``input_ids`` int32 [T]: the documents back to back, then the padding.
- ``labels`` int32 [T]: ``input_ids`` where ``loss_mask`` is 1, else -100.
  Labels are *unshifted* (the Hugging Face causal-LM convention: the loss
  compares ``logits[t - 1]`` with ``labels[t]``; the model shifts). The first
  token of every document is -100, so no target is ever predicted from the
  previous document's last token, whatever its ``loss_mask``.
- ``position_ids`` int32 [T]: 0, 1, ... restarting at 0 at every document.
- ``cu_seqlens`` int32 [D + 1]: 0, then the cumulative document lengths,
  ending at T (flash-attention varlen's ``cu_seqlens``). Padding, when
  present, is one last segment of ``num_padding`` tokens with ``labels``
  -100 and its own positions 0.., so it attends to nothing real and receives
  no loss; ``uuids`` lists the D real documents only.
- ``uuids`` [D], ``num_tokens`` (T), ``num_padding``, ``num_supervised``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from common.io import atomic_path
from packing.plan import PackPlan

IGNORE_INDEX = -100

PACK_SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),
    ("labels", pa.list_(pa.int32())),
    ("position_ids", pa.list_(pa.int32())),
    ("cu_seqlens", pa.list_(pa.int32())),
    ("uuids", pa.list_(pa.string())),
    ("num_tokens", pa.int32()),
    ("num_padding", pa.int32()),
    ("num_supervised", pa.int32()),
])


def assemble_pack(input_ids: Sequence[np.ndarray], loss_mask: Sequence[np.ndarray], uuids: Sequence[str],
                  pad_to_multiple_of: int = 1, pad_token_id: int = 0) -> dict:
    """One pack row (see the module docstring) from its documents, in order.

    Args:
        input_ids: per document, int [n_d] token ids.
        loss_mask: per document, int/bool [n_d], 1 on supervised tokens.
        uuids: per document, its uuid.
        pad_to_multiple_of: pad the pack to a multiple of this many tokens (1: no padding).
        pad_token_id: the id written into padding positions (they carry no loss).

    Raises:
        ValueError: when the per-document lists disagree in length, a document is
            empty, or a mask's length differs from its ids'.
    """
    if not (len(input_ids) == len(loss_mask) == len(uuids)) or not len(input_ids):
        raise ValueError(f"a pack needs matching non-empty input_ids/loss_mask/uuids, got "
                         f"{len(input_ids)}/{len(loss_mask)}/{len(uuids)}")
    lens = np.fromiter((len(x) for x in input_ids), dtype=np.int64, count=len(input_ids))
    for u, ids, m in zip(uuids, input_ids, loss_mask, strict=True):
        if len(ids) == 0 or len(ids) != len(m):
            raise ValueError(f"document {u}: {len(ids)} input_ids and {len(m)} loss_mask entries")
    ids = np.concatenate(input_ids).astype(np.int32, copy=False)
    mask = np.concatenate(loss_mask).astype(bool, copy=False)
    cu = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    n = int(cu[-1])
    labels = np.where(mask, ids, IGNORE_INDEX).astype(np.int32)
    labels[cu[:-1]] = IGNORE_INDEX
    positions = np.arange(n, dtype=np.int64) - np.repeat(cu[:-1], lens)
    pad = -n % pad_to_multiple_of
    if pad:
        ids = np.concatenate([ids, np.full(pad, pad_token_id, dtype=np.int32)])
        labels = np.concatenate([labels, np.full(pad, IGNORE_INDEX, dtype=np.int32)])
        positions = np.concatenate([positions, np.arange(pad)])
        cu = np.append(cu, n + pad)
    return {"input_ids": ids, "labels": labels, "position_ids": positions.astype(np.int32),
            "cu_seqlens": cu.astype(np.int32), "uuids": list(uuids), "num_tokens": n + pad,
            "num_padding": pad, "num_supervised": int((labels != IGNORE_INDEX).sum())}


def iter_packs(tokenized: pa.Table, plan: PackPlan, pad_to_multiple_of: int = 1,
               pad_token_id: int = 0) -> Iterator[dict]:
    """Yield the pack rows of ``plan`` over ``tokenized`` (columns ``uuid``, ``input_ids``, ``loss_mask``).

    Tokens are read through zero-copy numpy views of the Arrow buffers and
    copied once, into their pack.
    """
    cols = {c: tokenized.column(c).combine_chunks() for c in ("input_ids", "loss_mask")}
    offsets = cols["input_ids"].offsets.to_numpy()
    mask_offsets = cols["loss_mask"].offsets.to_numpy()
    ids_flat = cols["input_ids"].values.to_numpy()
    mask_flat = cols["loss_mask"].values.to_numpy()
    uuids = tokenized.column("uuid").to_pylist()
    for docs in plan.packs:
        yield assemble_pack([ids_flat[offsets[d]:offsets[d + 1]] for d in docs],
                            [mask_flat[mask_offsets[d]:mask_offsets[d + 1]] for d in docs],
                            [uuids[d] for d in docs], pad_to_multiple_of, pad_token_id)


def packs_in_order(frames: Iterable[pl.DataFrame], plan: PackPlan, pad_to_multiple_of: int = 1,
                   pad_token_id: int = 0) -> Iterator[dict]:
    """Yield the pack rows of ``plan`` from ``frames`` (columns ``uuid``, ``input_ids``, ``loss_mask``)
    that hold the documents of ``plan`` in pack order (``plan.order``, e.g.
    :func:`common.take.take_rows` of those positions): the same rows as :func:`iter_packs` on the
    whole table, holding one frame of documents at a time.

    Raises:
        ValueError: ``frames`` end before the plan's last document.
    """
    ids_q: deque[np.ndarray] = deque()
    mask_q: deque[np.ndarray] = deque()
    uuid_q: deque[str] = deque()
    stream = iter(frames)
    for n in plan.sizes.tolist():
        while len(ids_q) < n:
            frame = next(stream, None)
            if frame is None:
                raise ValueError(f"the document stream ended before pack of {n} documents")
            table = frame.to_arrow()
            ids, mask = (table.column(c).combine_chunks() for c in ("input_ids", "loss_mask"))
            io, mo = ids.offsets.to_numpy(), mask.offsets.to_numpy()
            iv, mv = ids.values.to_numpy(), mask.values.to_numpy()
            ids_q.extend(iv[io[k]:io[k + 1]] for k in range(len(frame)))
            mask_q.extend(mv[mo[k]:mo[k + 1]] for k in range(len(frame)))
            uuid_q.extend(frame["uuid"].to_list())
        yield assemble_pack([ids_q.popleft() for _ in range(n)], [mask_q.popleft() for _ in range(n)],
                            [uuid_q.popleft() for _ in range(n)], pad_to_multiple_of, pad_token_id)


def write_packs(rows: Iterable[dict], path: str | Path, packs_per_row_group: int) -> int:
    """Stream pack rows into ``path`` atomically, ``packs_per_row_group`` packs per row group.

    Returns the number of packs written.
    """
    written = 0
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, PACK_SCHEMA, compression="zstd") as writer:
        batch: list[dict] = []
        for row in rows:
            batch.append(row)
            if len(batch) == packs_per_row_group:
                writer.write_table(_table(batch), row_group_size=packs_per_row_group)
                written, batch = written + len(batch), []
        if batch or not written:
            writer.write_table(_table(batch), row_group_size=packs_per_row_group)
            written += len(batch)
    return written


def _table(rows: list[dict]) -> pa.Table:
    arrays = []
    for field in PACK_SCHEMA:
        values = [r[field.name] for r in rows]
        if pa.types.is_list(field.type) and field.type.value_type != pa.string():
            lens = np.fromiter((len(v) for v in values), dtype=np.int32, count=len(values))
            offs = np.zeros(len(values) + 1, dtype=np.int32)
            np.cumsum(lens, out=offs[1:])
            flat = np.concatenate(values) if values else np.zeros(0, np.int32)
            arrays.append(pa.ListArray.from_arrays(pa.array(offs), pa.array(flat, type=field.type.value_type)))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=PACK_SCHEMA)

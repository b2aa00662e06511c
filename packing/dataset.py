"""A torch ``Dataset`` over packed parquet rows (:mod:`packing.writer`) and its collator.

``PackedDataset(path)[i]`` is one pack as tensors; :func:`collate_packed`
stacks packs into a batch that keeps every document boundary:
``position_ids`` restart at 0 per document and ``cu_seqlens`` gives the
document offsets over the flattened batch (flash-attention varlen). On CPU,
pass :func:`document_attention_mask` (re-exported here) as the model's
``attention_mask``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from packing.attention import document_attention_mask
from packing.writer import IGNORE_INDEX

__all__ = ["PackedDataset", "collate_packed", "document_attention_mask"]

REQUIRED = ("input_ids", "labels", "position_ids", "cu_seqlens")


class PackedDataset(Dataset):
    """Packs of ``path`` (a pack parquet file written by ``cascade pack``).

    ``ds[i]`` is a dict: ``input_ids``, ``labels``, ``position_ids`` int64 [T_i],
    ``cu_seqlens`` int32 [D_i + 1] (the pack's own offsets, 0 to T_i).

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        ValueError: when ``position_ids`` or ``cu_seqlens`` (or ``input_ids``/``labels``)
            are missing from the file, or (on access) a pack's columns disagree.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path} not found: run `cascade pack` (dvc repro pack) first")
        names = pq.read_schema(self.path).names
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise ValueError(f"{self.path}: missing columns {missing}; packed rows need {list(REQUIRED)} "
                             f"(without position_ids/cu_seqlens a model would attend across documents)")
        self.table = pq.read_table(self.path, columns=list(REQUIRED), memory_map=True)

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = {c: self.table.column(c)[i].values.to_numpy() for c in REQUIRED}
        n = len(row["input_ids"])
        cu = row["cu_seqlens"]
        if len(row["labels"]) != n or len(row["position_ids"]) != n or cu[0] != 0 or cu[-1] != n:
            raise ValueError(f"{self.path}: pack {i}: input_ids ({n}), labels ({len(row['labels'])}), "
                             f"position_ids ({len(row['position_ids'])}) and cu_seqlens (0..{cu[-1]}) disagree")
        out = {c: torch.from_numpy(row[c].astype("int64")) for c in ("input_ids", "labels", "position_ids")}
        out["cu_seqlens"] = torch.from_numpy(cu.astype("int32"))
        return out


def collate_packed(batch: list[dict[str, torch.Tensor]], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Stack packs into a batch.

    Rows shorter than the longest are right-padded with one padding segment
    (``input_ids`` = ``pad_token_id``, ``labels`` -100, ``position_ids`` 0..),
    which attends to nothing real and receives no loss.

    Returns:
        ``input_ids``, ``labels``, ``position_ids``: int64 [B, T];
        ``cu_seqlens``: int32 [S + 1], offsets of every segment (documents and
        padding) over the flattened [B * T] batch, from 0 to B * T.

    Raises:
        ValueError: on an empty batch.
    """
    if not batch:
        raise ValueError("collate_packed got an empty batch")
    t = max(len(b["input_ids"]) for b in batch)
    out: dict[str, list[torch.Tensor]] = {"input_ids": [], "labels": [], "position_ids": []}
    cu = [torch.zeros(1, dtype=torch.int32)]
    for r, b in enumerate(batch):
        n = len(b["input_ids"])
        pad = t - n
        fills = {"input_ids": torch.full((pad,), pad_token_id, dtype=torch.int64),
                 "labels": torch.full((pad,), IGNORE_INDEX, dtype=torch.int64),
                 "position_ids": torch.arange(pad, dtype=torch.int64)}
        for k, parts in out.items():
            parts.append(torch.cat([b[k].to(torch.int64), fills[k]]))
        row_cu = b["cu_seqlens"].to(torch.int32)[1:] + r * t
        cu.append(row_cu)
        if pad:
            cu.append(torch.tensor([(r + 1) * t], dtype=torch.int32))
    result = {k: torch.stack(v) for k, v in out.items()}
    result["cu_seqlens"] = torch.cat(cu)
    return result

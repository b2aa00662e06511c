"""Global best-fit-decreasing (BFD) bin packing of document lengths.

Packing is planned on lengths alone, over the whole dataset at once (not per
``map`` batch as TRL's ``pack_dataset`` does), then tokens are streamed into
the planned packs (:mod:`packing.writer`). BFD (Johnson 1973, "Near-optimal
bin packing algorithms"; the FFD/BFD bound is 11/9 OPT + 6/9): documents in
decreasing length order, each into the open pack with the least room that
still fits it, a new pack when none does.

The open packs live in one sorted Python list of integer keys
``room << 32 | pack_id``; ``bisect`` finds the best fit in O(log P) and the
list edit is one memmove of at most P pointers (P = open packs, ~6,300 for
1 M SFT-sized documents at 256K), so a million documents plan in about a
second. Ties go to the lowest pack id, so a plan is deterministic. The plan is
arrays, not a list per pack: 20 bytes a document while planning (lengths, order,
pack of each), the order (8 bytes a document) after.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_SHIFT = 32
_LOW = (1 << _SHIFT) - 1
_CHUNK = 1 << 16  # documents placed per numpy -> Python conversion


@dataclass
class PackPlan:
    """The packs of a plan, as arrays (no Python object per document).

    Attributes:
        order: int64 [n_documents] document indices in pack order: pack 0's documents, then pack 1's, each
            pack's in the order they were placed (longest first).
        offsets: int64 [n_packs + 1] pack ``k`` holds ``order[offsets[k]:offsets[k + 1]]``.
        fill: int64 [n_packs] tokens in each pack.
        pack_length: tokens a pack may hold.
    """

    order: np.ndarray
    offsets: np.ndarray
    fill: np.ndarray
    pack_length: int

    def __len__(self) -> int:
        """The number of packs."""
        return len(self.fill)

    @property
    def packs(self) -> list[list[int]]:
        """Document indices of each pack as Python lists (a Python int per document: for small plans)."""
        return [part.tolist() for part in np.split(self.order, self.offsets[1:-1])] if len(self) else []

    @property
    def sizes(self) -> np.ndarray:
        """int64 [n_packs] documents in each pack."""
        return np.diff(self.offsets)

    @property
    def tokens(self) -> int:
        """Tokens planned (the sum of all document lengths)."""
        return int(self.fill.sum())

    @property
    def efficiency(self) -> float:
        """Packing efficiency = tokens / (packs x pack_length), in [0, 1]; 0 for an empty plan."""
        return self.tokens / (len(self) * self.pack_length) if len(self) else 0.0

    @property
    def min_packs(self) -> int:
        """The lower bound ceil(tokens / pack_length) on the number of packs."""
        return -(-self.tokens // self.pack_length)


def plan_packs(lengths: Sequence[int] | np.ndarray, pack_length: int,
               names: Sequence[str] | None = None) -> PackPlan:
    """Plan best-fit-decreasing packs of ``lengths`` (tokens per document).

    Args:
        lengths: int [n] document lengths, each in ``[1, pack_length]``.
        pack_length: tokens per pack (the paper's SFT uses 262144).
        names: document names (uuids) for error messages: a list, or any sequence indexed by position
            (a pyarrow string column: names are only read for the error).

    Returns:
        A :class:`PackPlan`; every document index appears in exactly one pack.

    Raises:
        ValueError: when ``pack_length`` is not in ``[1, 2**31)`` or a document is empty or
            longer than ``pack_length`` (naming the document; split or truncate it upstream
            with the tokenize step's overflow policy).

    Example:
        >>> plan_packs([4, 2, 3, 1], pack_length=5).packs
        [[0, 3], [2, 1]]
    """
    if not 1 <= pack_length < 1 << 31:
        raise ValueError(f"pack_length must be in [1, 2**31), got {pack_length}")
    lens = np.asarray(lengths, dtype=np.int64)
    bad = np.flatnonzero((lens < 1) | (lens > pack_length))
    if len(bad):
        i = int(bad[0])
        who = names[i] if names is not None else f"#{i}"
        raise ValueError(f"document {who} has {lens[i]} tokens, outside [1, pack_length={pack_length}] "
                         f"({len(bad)} such documents); apply the overflow policy (reject|truncate|split) first")
    order = np.argsort(-lens, kind="stable")
    pack_of = np.empty(len(lens), np.int32 if len(lens) < 1 << 31 else np.int64)  # pack of order[j]
    open_keys: list[int] = []
    fill: list[int] = []
    for start in range(0, len(order), _CHUNK):  # Python ints for a chunk at a time, not for every document
        pids = []
        for n in lens[order[start:start + _CHUNK]].tolist():
            i = bisect_left(open_keys, n << _SHIFT)
            if i == len(open_keys):
                pid, room = len(fill), pack_length - n
                fill.append(n)
            else:
                key = open_keys.pop(i)
                pid, room = key & _LOW, (key >> _SHIFT) - n
                fill[pid] += n
            pids.append(pid)
            if room:
                insort(open_keys, room << _SHIFT | pid)
        pack_of[start:start + len(pids)] = pids
    # pack order: by pack id, each pack's documents in placement order (a stable sort keeps it)
    order = order[np.argsort(pack_of, kind="stable")]
    offsets = np.zeros(len(fill) + 1, np.int64)
    np.cumsum(np.bincount(pack_of, minlength=len(fill)), out=offsets[1:])
    return PackPlan(order, offsets, np.asarray(fill, dtype=np.int64), pack_length)

"""Step bookkeeping: rejects spill to disk in bounded chunks and are written byte-identically."""

from __future__ import annotations

import gc
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import io
from common.io import REJECT_SCHEMA, Rejects, atomic_dir, parquet_batches, write_parquet


def _fill(rejects: Rejects, n: int) -> None:
    for i in range(n):
        rejects.add(f"src{i % 2}", f"id{i}", f"exact_duplicate: of id{i - 1}" if i % 3 else "empty turn", {"i": i})


def test_spilled_rejects_write_the_same_bytes_as_one_table(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "ROW_GROUP_SIZE", 3)
    rejects = Rejects("dedup", spill_rows=3)
    _fill(rejects, 8)
    assert rejects._buffered == 2 and len(rejects._chunks) == 2  # memory holds < one chunk
    rejects.write(tmp_path / "spilled.parquet")
    write_parquet(pa.Table.from_pylist(rejects.rows, schema=REJECT_SCHEMA), tmp_path / "whole.parquet")
    assert (tmp_path / "spilled.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    assert [r["record_id"] for r in rejects.rows] == [f"id{i}" for i in range(8)]
    assert rejects.by_reason() == {"empty turn": 3, "exact_duplicate": 5}
    assert rejects.by_source() == {"src0": 4, "src1": 4}
    assert rejects.counts()["src1", "exact_duplicate"] == 3  # ids 1, 5, 7


def test_rejects_pickle_merge_and_clean_up(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "ROW_GROUP_SIZE", 3)
    worker = Rejects("ingest", spill_rows=3)
    _fill(worker, 4)
    copy = pickle.loads(pickle.dumps(worker))  # what a Ray worker sends back
    driver = Rejects("ingest", spill_rows=3)
    driver.add("other", "x", "invalid record: no user turn", {})
    driver.merge(copy)
    assert [r["record_id"] for r in driver.rows] == ["x", "id0", "id1", "id2", "id3"] and len(driver) == 5
    spill = Path(worker._dir)
    assert spill.is_dir()
    del worker, copy
    gc.collect()
    assert not spill.exists()


def test_rejects_under_one_chunk_never_touch_disk(tmp_path):
    rejects = Rejects("validate")
    _fill(rejects, 5)
    rejects.write(tmp_path / "r.parquet")
    assert rejects._dir is None
    assert pq.read_table(tmp_path / "r.parquet").num_rows == 5


def test_a_write_removes_what_a_killed_write_of_the_same_path_left(tmp_path):
    """A SIGKILL between mkstemp/mkdtemp and the rename leaves ``.<name>.*.tmp``; the next write of that
    path removes it (and only it)."""
    stale_file = tmp_path / ".out.parquet.k1ll3d.tmp"
    stale_dir = tmp_path / ".release.k1ll3d.tmp"
    other = tmp_path / ".other.parquet.k1ll3d.tmp"
    for p in (stale_file, other):
        p.write_bytes(b"half")
    stale_dir.mkdir()
    (stale_dir / "shard.parquet").write_bytes(b"half")
    write_parquet(pa.table({"a": [1]}), tmp_path / "out.parquet")
    with atomic_dir(tmp_path / "release") as tmp:
        (tmp / "README.md").write_text("card")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.parquet.k1ll3d.tmp", "out.parquet", "release"]
    assert (tmp_path / "release" / "README.md").read_text() == "card"


def test_spilled_rejects_live_beside_the_outputs_and_a_killed_steps_are_removed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rejects = Rejects("dedup", spill_rows=2)
    for i in range(5):
        rejects.add("src", str(i), "near_duplicate: of 0", {"i": i})
    (spill,) = (tmp_path / "rejects" / ".spill").iterdir()
    assert spill.name.startswith("dedup-") and len(list(spill.iterdir())) == 2
    io.remove_spills("dedup")  # what `run_step` does before the step runs again after a kill
    assert not spill.exists()


def test_parquet_batches_hold_one_row_group_not_the_file(tmp_path):
    # 120 row groups of ~200 KB of incompressible text: pyarrow's default pre-buffering keeps every row
    # group it read until the reader closes (apache/arrow#39808), ~24 MB by the last batch
    rng = np.random.default_rng(0)
    path = tmp_path / "t.parquet"
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as writer:
        for _ in range(120):
            texts = [rng.bytes(1000).hex() for _ in range(100)]
            writer.write_table(pa.table({"text": texts}))
    base = pa.total_allocated_bytes()
    held, rows = 0, 0
    for batch in parquet_batches(path, 50):
        rows += batch.num_rows
        held = max(held, pa.total_allocated_bytes() - base)
    assert rows == 12_000 and held < 3_000_000


def test_compact_rows_pickle_without_the_batch_they_were_filtered_from():
    """A worker's few kept rows of a batch pickled the batch's whole string buffers (polars' string views):
    decontaminate's contaminated rows held 0.9 GB at 64x. ``compact`` copies the rows out: same rows, same
    schema, a fraction of the bytes."""
    import polars as pl

    from common.executor import compact

    batch = pl.DataFrame({"uuid": [f"u{i}" for i in range(2000)],
                          "messages": [[{"role": "user", "content": f"question {i} " + "x" * 500}] for i in range(2000)]})
    few = batch.filter(pl.col("uuid").is_in(["u3", "u1999"]))
    kept = compact(few)
    assert kept.equals(few) and kept.schema == few.schema
    assert len(pickle.dumps(few)) > 100 * 1000  # the batch's buffers (1 MB of strings)
    assert len(pickle.dumps(kept)) < 5_000


def test_a_frame_of_rejects_writes_what_adding_its_rows_one_by_one_writes(tmp_path, monkeypatch):
    """extend_frame encodes column-wise (common/json_rows.py) and spills mid-frame; the file is the bytes
    of the per-row path, add() calls between frames keep their place, and a dtype json_rows does not
    encode (a date) goes row by row through ``default=str``."""
    import datetime

    import polars as pl

    monkeypatch.setattr(io, "ROW_GROUP_SIZE", 4)
    frame = pl.DataFrame({"uuid": [f"u{i}" for i in range(7)] + [None], "source": ["a", "b"] * 3 + [None, "c"],
                          "text": ['q"\\\n', "é", None, "", "x", "\x01", "y", "z"], "score": [0.5] * 8,
                          "reason": ["dup: of u0", "lang", "dup:x", "lang: en", "q", "q", "q", "dup"]})
    dated = pl.DataFrame({"uuid": ["d0"], "when": [datetime.date(2026, 1, 2)], "reason": ["old"]})
    fast, slow = Rejects("export", spill_rows=4), Rejects("export", spill_rows=4)
    fast.add("s", "first", "manual", {"k": 1})
    fast.extend_frame(frame)
    fast.add("s", "between", "manual", "text")
    fast.extend_frame(dated, source_col="missing")
    slow.add("s", "first", "manual", {"k": 1})
    for frm, source_col in ((frame, "source"), (None, None), (dated, "missing")):
        if frm is None:
            slow.add("s", "between", "manual", "text")
            continue
        for rec, reason in zip(frm.drop("reason").to_dicts(), frm["reason"], strict=True):
            slow.add(rec.get(source_col) or "", rec.get("uuid") or "", reason, rec)
    assert len(fast._chunks) == len(slow._chunks) == 2 and fast.counts() == slow.counts()
    fast.write(tmp_path / "fast.parquet")
    slow.write(tmp_path / "slow.parquet")
    assert (tmp_path / "fast.parquet").read_bytes() == (tmp_path / "slow.parquet").read_bytes()
    rows = fast.rows
    assert [r["record_id"] for r in rows] == ["first", *[f"u{i}" for i in range(7)], "", "between", "d0"]
    assert rows[-1]["record"] == '{"uuid": "d0", "when": "2026-01-02"}' and rows[-1]["source"] == ""
    assert fast.by_reason() == {"dup": 3, "lang": 2, "manual": 2, "old": 1, "q": 3}
    with pytest.raises(ValueError, match="rejects of export: column 'reason' holds 1 nulls"):
        fast.extend_frame(frame.with_columns(reason=pl.lit(None, pl.String)).head(1))


def test_a_row_cursor_hands_out_rows_whatever_the_batching_and_names_a_short_or_long_stream():
    from common.io import RowCursor

    table = pa.table({"i": list(range(10)), "s": [str(i) for i in range(10)]})
    cursor = RowCursor(table.to_batches(max_chunksize=3), "the meta of t")
    got = [cursor.take(n) for n in (0, 4, 1, 5)]
    assert [len(g) for g in got] == [0, 4, 1, 5] and got[3]["i"].to_list() == [5, 6, 7, 8, 9]
    assert got[1]["s"].to_list() == ["0", "1", "2", "3"]
    cursor.finish()
    with pytest.raises(ValueError, match="the meta of t ends before its rows do"):
        RowCursor(table.to_batches(max_chunksize=4), "the meta of t").take(11)
    long = RowCursor(table.to_batches(max_chunksize=4), "the meta of t")
    long.take(9)
    with pytest.raises(ValueError, match="the meta of t has more rows than it does"):
        long.finish()

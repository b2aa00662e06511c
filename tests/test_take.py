"""Out-of-core row selection (common/take.py) and the steps built on it: rows come back in the asked
order with every column, a missing or repeated key is an error, a streamed pack equals the in-memory
one, and a chunked set file has the bytes of the in-memory write."""

import hashlib

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import take
from common.executor import write_frames
from common.io import write_parquet
from common.take import fan_out, matches, member, take_rows
from packing.plan import plan_packs
from packing.writer import iter_packs, packs_in_order


def _table(n: int) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 40, n)
    return pl.DataFrame({
        "uuid": [f"u{i:04d}" for i in range(n)],
        "input_ids": [list(range(i, i + k)) for i, k in enumerate(lens)],
        "loss_mask": [[int(j % 3 == 0) for j in range(k)] for k in lens],
        "meta": [{"a": i, "b": None if i % 2 else "x"} for i in range(n)],
    }, schema_overrides={"input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.Int8)})


def test_rows_come_back_in_the_asked_order_with_every_column(tmp_path, monkeypatch):
    monkeypatch.setattr("common.take.WINDOW_ROWS", 2)  # three windows of positions
    df = _table(500)
    df.write_parquet(tmp_path / "t.parquet", row_group_size=64)
    want = pl.Series(["u0321", "u0007", "u0499", "u0000", "u0100"])
    got = pl.concat(take_rows(tmp_path / "t.parquet", want, batch_rows=2))
    by_row = pl.concat(take_rows(tmp_path / "t.parquet", rows=np.array([321, 7, 499]), columns=["uuid"]))
    assert got["uuid"].to_list() == want.to_list()
    assert got.to_dicts() == [df.filter(pl.col("uuid") == u).to_dicts()[0] for u in want]
    assert by_row["uuid"].to_list() == ["u0321", "u0007", "u0499"] and by_row.columns == ["uuid"]


def test_positions_are_read_from_the_row_groups_that_span_them_only(tmp_path, monkeypatch):
    df = _table(500)
    df.write_parquet(tmp_path / "t.parquet", row_group_size=64)  # groups start at 0, 64, 128, 192, ...
    read = []
    real = take.parquet_batches
    monkeypatch.setattr(take, "parquet_batches", lambda *a, **k: read.append(k["row_groups"]) or real(*a, **k))
    got = pl.concat(take_rows(tmp_path / "t.parquet", rows=np.array([150, 130, 191, 128]), batch_rows=7))
    assert read == [[2]] and got["uuid"].to_list() == ["u0150", "u0130", "u0191", "u0128"]
    assert got.to_dicts() == df[[150, 130, 191, 128]].to_dicts()
    got = pl.concat(take_rows(tmp_path / "t.parquet", rows=np.array([499, 63]), columns=["uuid"]))
    assert read[-1] == list(range(8)) and got["uuid"].to_list() == ["u0499", "u0063"]
    with pytest.raises(ValueError, match="2 rows asked for, 1 match"):  # past the file: not silently dropped
        list(take_rows(tmp_path / "t.parquet", rows=np.array([499, 500])))
    with pytest.raises(ValueError, match="2 rows asked for, 1 match"):
        list(take_rows(tmp_path / "t.parquet", rows=np.array([-1, 3])))


def test_a_key_asked_twice_comes_back_twice_and_hits_are_written_in_runs_not_per_batch(tmp_path, monkeypatch):
    monkeypatch.setattr("common.take.WINDOW_ROWS", 37)
    df = _table(300)
    df.write_parquet(tmp_path / "t.parquet", row_group_size=50)
    writes = []
    real = pq.ParquetWriter.write_table
    monkeypatch.setattr(pq.ParquetWriter, "write_table", lambda self, t, *a, **k: (writes.append(len(t)),
                                                                                  real(self, t, *a, **k))[1])
    order = np.random.default_rng(1).permutation(300)
    got = pl.concat(take_rows(tmp_path / "t.parquet", rows=order, batch_rows=7))
    assert got["uuid"].to_list() == [f"u{i:04d}" for i in order]
    # 9 flushes of >= 37 rows into <= 9 windows; per 7-row batch it was one write per window hit (~250)
    assert sum(writes) == 300 and len(writes) <= 81
    twice = pl.concat(take_rows(tmp_path / "t.parquet", pl.Series(["u0005", "u0003", "u0005"]), columns=["uuid"]))
    assert twice["uuid"].to_list() == ["u0005", "u0003", "u0005"]


def test_a_sparse_take_flushes_once_its_hits_hold_flush_bytes_of_batches(tmp_path, monkeypatch):
    """One hit per 10-row batch: the hits keep their batches' buffers alive, so they are scattered once those
    batches reach FLUSH_BYTES (here about two batches), not after WINDOW_ROWS hits (build at 64x: 10.2 GB)."""
    df = _table(300)
    df.write_parquet(tmp_path / "t.parquet", row_group_size=10)
    batch_bytes = pq.ParquetFile(tmp_path / "t.parquet").read_row_group(0).nbytes
    monkeypatch.setattr("common.take.FLUSH_BYTES", 2 * batch_bytes)
    writes = []
    real = pq.ParquetWriter.write_table
    monkeypatch.setattr(pq.ParquetWriter, "write_table", lambda self, t, *a, **k: (writes.append(len(t)),
                                                                                  real(self, t, *a, **k))[1])
    got = pl.concat(take_rows(tmp_path / "t.parquet", rows=np.arange(0, 300, 10)[::-1], batch_rows=10))
    assert got["uuid"].to_list() == [f"u{i:04d}" for i in range(290, -1, -10)]
    assert sum(writes) == 30 and len(writes) >= 10  # 30 batches, a flush every 2 or 3 (one window)


def test_a_take_past_fan_out_windows_splits_its_buckets_again_with_few_files_and_row_groups(tmp_path, monkeypatch):
    """60 windows of 5 positions with at most 3 buckets a pass: four passes (3^4 >= 60), never more than 3
    writers open, and every row written once a pass in runs (one file per window wrote a row group per window
    per run: (n / WINDOW_ROWS)^2 of them for a random order)."""
    monkeypatch.setattr("common.take.WINDOW_ROWS", 5)
    monkeypatch.setattr("common.take.FAN_OUT", 3)
    df = _table(300)
    df.write_parquet(tmp_path / "t.parquet", row_group_size=50)
    open_now, most, writes = [0], [0], []
    init, close, write = pq.ParquetWriter.__init__, pq.ParquetWriter.close, pq.ParquetWriter.write_table

    def opened(self, *a, **k):
        init(self, *a, **k)
        open_now[0] += 1
        most[0] = max(most[0], open_now[0])

    def closed(self):
        open_now[0] -= 1
        close(self)

    monkeypatch.setattr(pq.ParquetWriter, "__init__", opened)
    monkeypatch.setattr(pq.ParquetWriter, "close", closed)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", lambda self, t, *a, **k: (writes.append(len(t)),
                                                                                  write(self, t, *a, **k))[1])
    order = np.random.default_rng(2).permutation(300)
    got = pl.concat(take_rows(tmp_path / "t.parquet", rows=order, batch_rows=7))
    assert got["uuid"].to_list() == [f"u{i:04d}" for i in order]
    assert got.to_dicts() == df[order].to_dicts()
    assert [fan_out(n) for n in (5, 6, 15, 16, 45, 46, 300)] == [1, 2, 3, 2, 3, 3, 3]
    assert most[0] == 3 and sum(writes) == 4 * 300 and open_now[0] == 0


def test_a_window_of_long_rows_is_split_by_its_bytes_not_only_its_rows(tmp_path, monkeypatch):
    """Pack asks for the longest documents first, so a window of WINDOW_ROWS positions can hold far more bytes
    than the average (at 64x the first 20,000 documents held 0.69 GB of tokens): every window sorted in memory
    holds at most WINDOW_BYTES in memory, or one row."""
    monkeypatch.setattr("common.take.WINDOW_BYTES", 2_000)
    df = _table(300)
    df.write_parquet(tmp_path / "t.parquet", row_group_size=50)
    windows = []
    read = pl.read_parquet

    def spy(path, *a, **k):
        window = read(path, *a, **k)
        windows.append((len(window), window.estimated_size()))
        return window

    monkeypatch.setattr(pl, "read_parquet", spy)
    order = np.argsort(-df["input_ids"].list.len().to_numpy(), kind="stable")
    got = pl.concat(take_rows(tmp_path / "t.parquet", rows=order, batch_rows=16))
    assert got.to_dicts() == df[order].to_dicts()
    assert sum(n for n, _ in windows) == 300 and len(windows) > 10
    assert all(size <= 2_000 or n == 1 for n, size in windows), windows


def test_a_missing_key_or_a_key_the_file_repeats_is_an_error_not_a_lost_or_extra_row(tmp_path):
    df = _table(10)
    df.write_parquet(tmp_path / "t.parquet")
    pl.concat([df.head(1), df.head(1), df.slice(2)]).write_parquet(tmp_path / "twice.parquet")
    with pytest.raises(ValueError, match="2 rows asked for, 1 match"):
        list(take_rows(tmp_path / "t.parquet", pl.Series(["u0001", "nope"])))
    with pytest.raises(ValueError, match="1 rows asked for, 2 match"):
        list(take_rows(tmp_path / "twice.parquet", pl.Series(["u0000"])))
    with pytest.raises(ValueError, match="a wanted row is missing or repeated"):  # u0000 twice, u0001 not
        list(take_rows(tmp_path / "twice.parquet", pl.Series(["u0000", "u0001"])))


def test_packs_streamed_in_pack_order_equal_the_in_memory_packs(tmp_path, monkeypatch):
    monkeypatch.setattr("common.take.WINDOW_ROWS", 37)
    df = _table(300).select("uuid", "input_ids", "loss_mask")
    df.write_parquet(tmp_path / "t.parquet", row_group_size=50)
    table = pq.read_table(tmp_path / "t.parquet")
    plan = plan_packs(df["input_ids"].list.len().to_numpy(), 64, df["uuid"].to_list())
    docs = take_rows(tmp_path / "t.parquet", rows=plan.order,
                     columns=["uuid", "input_ids", "loss_mask"], batch_rows=7)
    streamed = list(packs_in_order(docs, plan, 8, 0))
    whole = list(iter_packs(table, plan, 8, 0))
    assert len(streamed) == len(whole) == len(plan.packs) > 10
    for a, b in zip(streamed, whole, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k]


def test_write_frames_with_chunks_has_the_bytes_of_a_chunked_table(tmp_path):
    rng = np.random.default_rng(1)
    parts = [_table(n).select("uuid", "input_ids").with_columns(pl.Series(
        "text", ["".join(map(chr, rng.integers(97, 123, 300))) for _ in range(n)])) for n in (3, 12_000, 1, 7)]
    chunked = pa.concat_tables([p.to_arrow() for p in parts])
    write_parquet(chunked, tmp_path / "a.parquet")
    frames = (f for p in parts for f in p.iter_slices(4096))
    write_frames(frames, tmp_path / "b.parquet", chunked.schema, [len(p) for p in parts])
    write_frames(iter([pl.from_arrow(chunked)]), tmp_path / "c.parquet", chunked.schema)
    digest = {k: hashlib.md5((tmp_path / f"{k}.parquet").read_bytes()).hexdigest() for k in "abc"}
    assert digest["a"] == digest["b"] != digest["c"]


def test_member_and_matches_equal_polars_is_in_and_an_inner_join():
    rng = np.random.default_rng(0)
    wanted = pl.Series("uuid", [f"u{i:06d}" for i in rng.choice(100_000, 5_000, replace=False)] + ["u000007"] * 2)
    keys = pl.Series("uuid", [f"u{i:06d}" for i in rng.integers(0, 100_000, 3_000)] + ["u000007", "", "zz"])
    s = wanted.sort()
    assert member(s, keys).tolist() == keys.is_in(wanted.implode()).to_list()
    assert not member(s.clear(), keys).any() and member(s, keys.clear()).shape == (0,)
    removed = pl.DataFrame({"uuid": wanted, "reason": [f"r{i}" for i in range(len(wanted))]})
    frame = pl.DataFrame({"uuid": keys, "row": range(len(keys))})
    r = removed.sort("uuid", maintain_order=True)
    at, idx = matches(r["uuid"], keys)
    got = pl.concat([frame[at], r.drop("uuid")[idx]], how="horizontal")
    want = frame.join(removed, on="uuid", how="inner", maintain_order="left_right")
    assert got.equals(want) and got.filter(pl.col("uuid") == "u000007").height == 2  # a key wanted twice: twice


def test_a_plan_file_places_rows_with_its_columns_and_bad_plans_are_errors(tmp_path, monkeypatch):
    from common.take import take_plan

    monkeypatch.setattr("common.take.WINDOW_ROWS", 3)  # several buckets
    monkeypatch.setattr("common.take.BATCH_ROWS", 4)  # the plan read in several batches
    df = _table(50)
    df.write_parquet(tmp_path / "t.parquet", row_group_size=8)
    pos = [2, 5, 5, 9, 17, 30, 31, 49]  # ascending, 5 twice
    out = [3, 0, 7, 1, 6, 2, 5, 4]
    plan = pl.DataFrame({"pos": pos, "out": out, "reason": [f"r{p}" for p in pos]})
    plan.write_parquet(tmp_path / "plan.parquet")
    got = pl.concat(take_plan(tmp_path / "t.parquet", tmp_path / "plan.parquet", ["uuid", "input_ids"], batch_rows=3))
    by_out = sorted(zip(out, pos, strict=True))
    assert got["uuid"].to_list() == [f"u{p:04d}" for _, p in by_out]
    assert got["reason"].to_list() == [f"r{p}" for _, p in by_out] and got.columns == ["uuid", "input_ids", "reason"]
    assert got["input_ids"].to_list() == [df["input_ids"][p].to_list() for _, p in by_out]
    bad = {"unsorted": (plan.reverse(), "pos is not ascending"), "past": (plan.with_columns(pos=pl.col("pos") + 1),
                                                                          "8 rows asked for, 7 match"),
           "negative": (plan.with_columns(pos=pl.col("pos") - 3), "position -1 is not in"),
           "twice": (plan.with_columns(out=pl.col("out").clip(0, 6)), "missing or repeated"),
           "columns": (plan.rename({"out": "o"}), "needs columns pos and out")}
    for name, (frame, message) in bad.items():
        frame.write_parquet(tmp_path / f"{name}.parquet")
        with pytest.raises(ValueError, match=message):
            list(take_plan(tmp_path / "t.parquet", tmp_path / f"{name}.parquet"))

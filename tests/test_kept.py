"""curation/kept.py: the filtering steps' writer of kept rows, with removals by uuid and by per-row reasons
read beside the input in another batching."""

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.io import Rejects
from curation.kept import write_kept
from tests.rows import sft_table


def _flags(reasons: list[str | None], size: int) -> list[pa.RecordBatch]:
    table = pa.table({"reason": pa.array(reasons, pa.string())})
    return table.to_batches(max_chunksize=size)


@pytest.mark.parametrize(("input_rows", "flag_rows"), [(1, 3), (4, 1), (7, 7), (3, 2)])
def test_rows_flagged_beside_the_input_and_by_uuid_are_rejected_in_input_order(tmp_path, input_rows, flag_rows):
    sft_table([f"q{i}" for i in range(7)]).write_parquet(tmp_path / "in.parquet")
    removed = pl.DataFrame({"uuid": ["s5", "s1"], "reason": ["near_duplicate: of s0", "near_duplicate: of s0"]})
    reasons = [None, None, "language: de (0.99) not kept", None, "empty_answer: x", None, None]
    rejects = Rejects("quality")
    n = write_kept(tmp_path / "in.parquet", tmp_path / "out.parquet", "sft", removed, rejects, input_rows,
                   flags=iter(_flags(reasons, flag_rows)))
    assert n == (7, 3)
    assert pl.read_parquet(tmp_path / "out.parquet")["uuid"].to_list() == ["s0", "s3", "s6"]
    rejects.write(tmp_path / "rejects.parquet")
    got = pq.read_table(tmp_path / "rejects.parquet").to_pylist()
    assert [(r["record_id"], r["reason"]) for r in got] == [
        ("s1", "near_duplicate: of s0"), ("s2", "language: de (0.99) not kept"), ("s4", "empty_answer: x"),
        ("s5", "near_duplicate: of s0")]


@pytest.mark.parametrize("reasons", [[None] * 6, [None] * 8])
def test_per_row_reasons_that_do_not_cover_the_rows_exactly_are_an_error_naming_the_file(tmp_path, reasons):
    sft_table([f"q{i}" for i in range(7)]).write_parquet(tmp_path / "in.parquet")
    with pytest.raises(ValueError, match=r"per-row reasons for .*in\.parquet"):
        write_kept(tmp_path / "in.parquet", tmp_path / "out.parquet", "sft", None, Rejects("quality"), 2,
                   flags=iter(_flags(reasons, 3)))
    assert not (tmp_path / "out.parquet").exists()

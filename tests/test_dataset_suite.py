"""validators/dataset.py: the great-expectations suites on a table's profile, in memory and from a file in
chunks (validate's path at any number of rows), with the same verdicts."""

import pytest

from tests.rows import sft_table
from validators.dataset import check_profile, check_profile_file, profile


def _profile(tmp_path, frame):
    prof = profile(frame, "sft")
    prof.write_parquet(tmp_path / "profile.parquet")
    return prof, tmp_path / "profile.parquet"


@pytest.mark.parametrize("chunk_rows", [1, 2, 5, 100])
def test_a_clean_table_passes_from_its_file_in_any_chunking_as_in_memory(tmp_path, chunk_rows):
    prof, path = _profile(tmp_path, sft_table([f"question {i}" for i in range(5)]))
    whole, chunked = check_profile(prof, "sft", "sft"), check_profile_file(path, "sft", "sft", chunk_rows)
    assert whole.as_dict() == chunked.as_dict() == {"rows": 5, "success": True, "failures": []}


@pytest.mark.parametrize("chunk_rows", [1, 2, 100])
def test_failures_are_counted_over_every_chunk_and_duplicates_across_chunks_are_found(tmp_path, chunk_rows):
    users = ["a", "b", "c", "a", "e", "f"]  # rows 0 and 3 have the same text: text_hash repeats across chunks
    frame = sft_table(users, uuid=["s0", "s1", "s2", "s3", "s1", "s5"], source=["x", None, "x", "x", None, "x"])
    prof, path = _profile(tmp_path, frame)
    report = check_profile_file(path, "sft", "sft", chunk_rows, scratch=tmp_path)
    assert not report.success and report.rows == 6
    assert report.failures[:2] == [
        "expect_column_values_to_be_unique(uuid): 2 of 6 rows fail, e.g. ['s1']",
        "expect_column_values_to_be_unique(text_hash): 2 of 6 rows fail, e.g. "
        f"[{prof['text_hash'][0]!r}]"]
    assert report.failures[2].startswith("expect_column_values_to_not_be_null(source): 2 of 6 rows fail")
    whole = check_profile(prof, "sft", "sft")  # GX over the whole frame counts the same rows
    assert [f.split(", e.g.")[0] for f in whole.failures] == [f.split(", e.g.")[0] for f in report.failures]

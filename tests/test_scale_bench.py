"""The scale benchmark's copies (benchmarks/scale.py): new uuids, and text that shares no word 5-gram with
the original, code, LaTeX and CJK rows included, so that dedup keeps the copies and its work grows with
the rows, not with clusters of copies."""

import numpy as np
import polars as pl
import pytest

from benchmarks.scale import marker, replicate
from common.io import write_parquet
from curation.minhash import shingles
from curation.params import MinHashConfig
from tests.rows import rl_table, sft_table

TEXTS = [
    "What is the capital of France? Answer in one short sentence, please.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5",
    r"Compute $\int_0^1 x^2 \, dx = \frac{1}{3}$ and $\sum_{k=1}^{n} k = n(n+1)/2$.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "请用中文回答这个问题并解释原因和结果",
]


def _sets(texts: list[str]) -> list[set[int]]:
    h, off = shingles(pl.Series(texts), MinHashConfig())
    return [set(np.unique(h[off[d]:off[d + 1]]).tolist()) for d in range(len(texts))]


def test_every_copy_shares_no_word_5gram_with_the_original(tmp_path):
    write_parquet(sft_table(TEXTS), tmp_path / "sft.parquet")
    write_parquet(rl_table(TEXTS), tmp_path / "rl.parquet")
    for kind, col in (("sft", pl.col("messages")), ("rl", pl.col("responses_create_params").struct.field("input"))):
        assert replicate(tmp_path / f"{kind}.parquet", tmp_path / f"{kind}3.parquet", 3, kind, "distinct") == 15
        out = pl.read_parquet(tmp_path / f"{kind}3.parquet")
        texts = out.select(col.list.first().struct.field("content"))["content"].to_list()
        assert out["uuid"].n_unique() == 15 and texts[:5] == TEXTS
        original = _sets(TEXTS)
        for copy in (1, 2):
            edited = _sets(texts[5 * copy:5 * copy + 5])
            assert all(o and not (o & e) for o, e in zip(original, edited, strict=True)), (kind, copy)
        assert not _sets(texts[5:10])[1] & _sets(texts[10:15])[1]  # copies differ from each other too
        edited_col = ["uuid", "messages" if kind == "sft" else "responses_create_params"]
        original_rows = pl.read_parquet(tmp_path / f"{kind}.parquet").drop(edited_col)
        assert out.drop(edited_col).equals(pl.concat([original_rows] * 3))  # every other field as it was


def test_every_copy_is_as_long_as_the_others_so_n_copies_are_n_times_the_text(tmp_path):
    """Copies' markers are distinct six-letter words of one dedup token each, so all copies of a row have one
    length: a marker that grew past the 20th copy made 64x 13 % more text a row than 16x."""
    markers = [marker(c) for c in range(1, 5001)]
    assert len(set(markers)) == 5000 and {len(m) for m in markers} == {6}
    _, off = shingles(pl.Series([f"w w w w {m}" for m in markers[:300]]), MinHashConfig(ngram=5))
    assert (np.diff(off) == 1).all()  # four words and the marker make one 5-gram: the marker is one token
    with pytest.raises(ValueError, match=r"copy must be in \[1, 343000\], got 0"):
        marker(0)
    write_parquet(sft_table(TEXTS), tmp_path / "sft.parquet")
    replicate(tmp_path / "sft.parquet", tmp_path / "sft30.parquet", 30, "sft", "distinct")
    lengths = (pl.read_parquet(tmp_path / "sft30.parquet")
               .select(pl.col("messages").list.first().struct.field("content").str.len_chars())["content"])
    per_copy = lengths.to_numpy().reshape(30, len(TEXTS))[1:]
    assert (per_copy == per_copy[0]).all() and (per_copy[0] > lengths[:len(TEXTS)].to_numpy()).all()

"""The scale benchmark's copies (benchmarks/scale.py): new uuids, and text that shares no word 5-gram with
the original, code, LaTeX and CJK rows included, so that dedup keeps the copies and its work grows with
the rows, not with clusters of copies."""

import numpy as np
import polars as pl

from benchmarks.scale import replicate
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

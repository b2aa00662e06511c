"""Semantic dedup (curation/semdedup.py, curation/embed.py): the greedy survivor rule by hand, the numbers
guard, planted paraphrases on real-shaped rows, determinism, and the step's outputs and rejects."""

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from curation.embed import embed_texts
from curation.params import SemDedupParams
from curation.semdedup import greedy_duplicates, kmeans, numbers_key, run_semdedup, semantic_duplicates
from tests.rows import rl_table, sft_table


def _unit(*rows):
    x = np.array(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_row_is_removed_only_for_a_kept_row_and_a_chain_keeps_its_far_end():
    # cos(0,1) = 0.99; cos(1,2) = 0.96; cos(0,2) = 0.90 (hand-built angles)
    a0, a1, a2 = 0.0, np.arccos(0.99), np.arccos(0.99) + np.arccos(0.96)
    x = _unit(*[[np.cos(a), np.sin(a)] for a in (a0, a1, a2)])
    assert float(x[0] @ x[2]) == pytest.approx(np.cos(a2), abs=1e-6) and float(x[0] @ x[2]) < 0.95
    of, cos = greedy_duplicates(x, threshold=0.95)
    # row 1 goes as a duplicate of row 0; row 2 is only close to the removed row 1, so it stays (SemDeDup's
    # any-earlier-row rule would drop it, losing content that no survivor holds)
    assert of.tolist() == [-1, 0, -1]
    assert cos[1] == pytest.approx(0.99, abs=1e-6)


def test_the_most_similar_kept_row_is_named_and_blocks_do_not_change_the_result():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(20, 16))
    x = np.concatenate([base, base + rng.normal(scale=0.05, size=base.shape)]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    of, cos = greedy_duplicates(x, 0.97)
    assert of[:20].tolist() == [-1] * 20 and of[20:].tolist() == list(range(20))
    for block in (1, 3, 7, 64):
        of_b, cos_b = greedy_duplicates(x, 0.97, block_rows=block)
        assert of_b.tolist() == of.tolist() and np.allclose(cos_b, cos, atol=1e-6)


def test_numbers_guard_keeps_problems_that_differ_only_in_their_numbers():
    texts = ["Find the prime factorization of 554. Write the factors separated by ×.",
             "Find the prime factorization of 231. Write the factors separated by ×.",
             "What is the time now in New York City?", "What is the current time in New York City?"]
    x = embed_texts(texts)
    assert float(x[0] @ x[1]) > 0.9  # static embeddings barely see numbers
    keys = pl.DataFrame({"t": texts}).select(numbers_key(pl.col("t")))["t"].to_numpy().view(np.int64)
    assert keys[0] != keys[1] and keys[2] == keys[3]
    of, _ = greedy_duplicates(x, 0.9, keys)
    assert of.tolist() == [-1, -1, -1, 2]
    of_unguarded, _ = greedy_duplicates(x, 0.9)
    assert of_unguarded[1] == 0


def test_embeddings_do_not_depend_on_the_batch():
    texts = ["short", "a much longer text " * 50, "", "über straße 42"]
    together = embed_texts(texts)
    assert all(np.array_equal(together[i], embed_texts([t])[0]) for i, t in enumerate(texts))
    assert not together[2].any()  # no tokens: the zero vector
    assert np.allclose(np.linalg.norm(together[[0, 1, 3]], axis=1), 1.0, atol=1e-6)


def test_kmeans_is_seeded_and_clusters_1_is_exhaustive():
    x = embed_texts([f"question number {i} about topic {i % 5}" for i in range(60)])
    assert np.array_equal(kmeans(x, 6, seed=3), kmeans(x, 6, seed=3))
    assert not kmeans(x, 1, seed=3).any()
    meta = pl.DataFrame({"uuid": [f"u{i}" for i in range(60)], "priority": [0] * 60, "length": [10] * 60})
    _, stats = semantic_duplicates(meta, x, 0.99, rows_per_cluster=10, seed=0, clusters=1)
    assert stats["clusters"] == 1 and stats["largest_cluster"] == 60


def test_the_step_removes_a_paraphrase_names_its_survivor_and_balances_counts(tmp_path):
    originals = ["What is the time now in New York City?",
                 "Which two human body systems are most responsible for getting oxygen to cells? A. digestive and "
                 "skeletal B. skeletal and circulatory C. circulatory and respiratory D. respiratory and digestive",
                 "Write a python function to reverse a string."]
    rewritten = ["What is the current time in New York City?"]
    rl = rl_table(originals + rewritten, source="a")
    rl = rl.with_columns(pl.Series("source", ["a", "a", "a", "b"]))
    sft = sft_table(["Say hello.", "Say hello!"])
    src = tmp_path / "in"
    src.mkdir()
    rl.write_parquet(src / "rl.parquet")
    sft.write_parquet(src / "sft.parquet")
    p = SemDedupParams(enabled={"sft": False, "rl": True}, threshold=0.95)
    m = run_semdedup(p, {"a": 0, "b": 1}, src, tmp_path / "out", root=tmp_path)
    assert m["rows_in"] == 6 and m["rows_out"] == 5 and m["rows_rejected"] == 1
    rejects = pq.read_table(tmp_path / "rejects" / "semdedup.parquet").to_pylist()
    assert [r["record_id"] for r in rejects] == ["b3"]
    assert rejects[0]["reason"].startswith("semantic_duplicate: of b0 cos=0.9")
    assert pl.read_parquet(tmp_path / "out" / "rl.parquet")["uuid"].to_list() == ["b0", "b1", "b2"]
    # sft is off: copied whole, its near-identical pair kept
    assert pl.read_parquet(tmp_path / "out" / "sft.parquet")["uuid"].to_list() == ["s0", "s1"]
    again = run_semdedup(p, {"a": 0, "b": 1}, src, tmp_path / "out2", root=tmp_path)
    assert again["rows_out"] == m["rows_out"]
    assert (tmp_path / "out" / "rl.parquet").read_bytes() == (tmp_path / "out2" / "rl.parquet").read_bytes()


def test_the_source_registered_first_survives_whatever_the_row_order(tmp_path):
    rl = rl_table(["What is the current time in New York City?", "What is the time now in New York City?"])
    rl = rl.with_columns(pl.Series("source", ["late", "early"]))
    (tmp_path / "in").mkdir()
    rl.write_parquet(tmp_path / "in" / "rl.parquet")
    sft_table(["x"]).write_parquet(tmp_path / "in" / "sft.parquet")
    run_semdedup(SemDedupParams(enabled={"rl": True}, threshold=0.95), {"early": 0, "late": 1}, tmp_path / "in",
                 tmp_path / "out", root=tmp_path)
    assert pl.read_parquet(tmp_path / "out" / "rl.parquet")["uuid"].to_list() == ["b1"]


def test_exempt_sources_are_never_compared(tmp_path):
    rl = rl_table(["Find the prime factorization of 12.", "Find the prime factorization of 12."], source="gen")
    (tmp_path / "in").mkdir()
    rl.write_parquet(tmp_path / "in" / "rl.parquet")
    sft_table(["x"]).write_parquet(tmp_path / "in" / "sft.parquet")
    m = run_semdedup(SemDedupParams(enabled={"rl": True}, exempt_sources=["gen"]), {}, tmp_path / "in",
                     tmp_path / "out", root=tmp_path)
    assert m["rows_rejected"] == 0


def test_an_unshipped_width_is_refused_naming_the_params_key():
    with pytest.raises(ValueError, match="params semdedup.dim: the wordllama wheel has no 100-wide weights"):
        embed_texts(["x"], dim=100)

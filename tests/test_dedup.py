import polars as pl

from curation.dedup import exact_dedup
from tests.handed import handed_case
from tests.rows import rl_table, sft_table


def test_dedup02_normalization_keeps_first_of_case_and_whitespace_copies():
    case = handed_case("DEDUP-02")
    df = sft_table(case["input"]["docs"])
    kept, dupes = exact_dedup(df, "sft", normalized=True)
    assert [int(u[1:]) for u in kept["uuid"]] == case["expected"]["normalize_true_kept"]
    assert dupes["reason"].to_list() == ["exact_duplicate: of s0", "exact_duplicate: of s0"]
    kept_raw, dupes_raw = exact_dedup(df, "sft", normalized=False)
    assert [int(u[1:]) for u in kept_raw["uuid"]] == case["expected"]["normalize_false_kept"]
    assert dupes_raw.is_empty()


def test_nfkc_makes_composed_and_decomposed_accents_equal():
    kept, dupes = exact_dedup(sft_table(["Cafe\u0301 menu", "Caf\u00e9 menu", "Cafe menu"]), "sft")
    assert kept["uuid"].to_list() == ["s0", "s2"]
    assert dupes["uuid"].to_list() == ["s1"]


def test_distinct_scripts_and_table_rows_stay_distinct():
    texts = ["Привет мир", "привет мир", "你好世界", "你好 世界", "| a | b |\n| 1 | 2 |", "| a | b |\n| 1 | 3 |"]
    kept, _ = exact_dedup(sft_table(texts), "sft")
    # Cyrillic case folds; CJK with and without a space differ; table rows differ
    assert kept["uuid"].to_list() == ["s0", "s2", "s3", "s4", "s5"]


def test_sft_dedup_hashes_whole_conversation_not_just_prompt():
    df = sft_table(["same question", "same question"])
    df = df.with_columns(pl.Series("messages", [
        [{"role": "user", "content": "same question"}, {"role": "assistant", "content": "answer one"}],
        [{"role": "user", "content": "same question"}, {"role": "assistant", "content": "answer two"}],
    ], dtype=df.schema["messages"]))
    kept, _ = exact_dedup(df, "sft")
    assert len(kept) == 2


def test_rl_dedup_on_prompt_and_counts_balance():
    df = rl_table(["What is 1+1?", "what is 1+1?  ", "What is 2+2?"], source="train")
    kept, dupes = exact_dedup(df, "rl")
    assert kept["uuid"].to_list() == ["b0", "b2"]
    assert len(kept) + len(dupes) == len(df)


def test_exact_duplicates_of_a_keys_file_equal_those_of_a_frame(tmp_path):
    from common.text import md5_halves, text_hashes
    from curation.dedup import exact_duplicates

    df = sft_table(["a b", "A  b", "c", "a b", "d", "c"])
    frame = pl.DataFrame({"uuid": df["uuid"], "h": md5_halves(text_hashes(df, "sft"))})
    frame.unnest("h").with_row_index("pos").cast({"pos": pl.Int64}).write_parquet(tmp_path / "keys.parquet")
    got = exact_duplicates(tmp_path / "keys.parquet")
    assert got.equals(exact_duplicates(frame))
    u = df["uuid"].to_list()
    assert got.rows() == [(u[1], f"exact_duplicate: of {u[0]}", 1), (u[3], f"exact_duplicate: of {u[0]}", 3),
                          (u[5], f"exact_duplicate: of {u[2]}", 5)]

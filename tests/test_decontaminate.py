import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from common.text import item_texts
from curation.decontaminate import (
    _find,
    build_index,
    decontaminate,
    find_contamination,
    read_index,
    write_index,
)
from tests.rows import rl_table, sft_table

QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
            "in May. How many clips did Natalia sell altogether in April and May?")


def _bench(questions, source="gsm8k", answers=None):
    gt = [json.dumps({"answer": a}) for a in (answers or ["1"] * len(questions))]
    return rl_table(questions, source=source, ground_truth=gt)


def test_planted_item_split_across_lines_recased_is_caught_and_recheck_finds_zero():
    bench = _bench([QUESTION, "What is 7 times 6?"])
    planted = ("Here is a problem for you.\nNATALIA SOLD CLIPS to 48 of her friends in April,\nand then "
               "she sold half as many clips in May... how many clips did natalia sell altogether?")
    train = sft_table([planted, "Tell me a story about a dragon who learns to bake bread in the mountains."])
    index = build_index(bench, [8, 13])
    clean, dirty, matches, stats = decontaminate(train, "sft", index, 50)
    assert clean["uuid"].to_list() == ["s1"] and dirty["uuid"].to_list() == ["s0"]
    assert dirty["reason"][0] == ("contaminated: gsm8k item b0 question 13-gram "
                                  "'natalia sold clips to 48 of her friends in april and then she'")
    assert matches.row(0, named=True) | {"match": None} == {
        "uuid": "s0", "benchmark": "gsm8k", "benchmark_uuid": "b0", "field": "question", "how": "13-gram", "match": None}
    assert stats["contaminated_by_benchmark"] == {"gsm8k": 1}
    again, _ = find_contamination(clean, "sft", index, 50)
    assert again.is_empty()


def test_reference_answer_field_is_indexed():
    solution = "def add(a, b):\n    total = a + b\n    return total  # the sum of the two numbers given"
    bench = rl_table(["Write add."], source="humaneval", ground_truth=['{"test": "assert add(1, 2) == 3"}'],
                     metadata=[json.dumps({"canonical_solution": solution})])
    train = sft_table(["Fix this:\ndef add(a, b):\n    total = a + b\n    return total  # the sum of the two numbers"])
    _, dirty, matches, _ = decontaminate(train, "sft", build_index(bench, [8]), 50)
    assert matches["field"].to_list() == ["answer"] and matches["how"].to_list() == ["8-gram"]
    assert dirty["uuid"].to_list() == ["s0"]


def test_short_benchmark_item_uses_exact_match_fallback_and_short_answers_are_not_indexed():
    bench = _bench(["What is 7 times 6?"], source="tiny", answers=["42"])
    train = sft_table(["what is 7 times 6", "What is 7 times 6? Explain step by step please.", "7 times 6", "42"])
    index = build_index(bench, [8, 13])
    clean, dirty, _, _ = decontaminate(train, "sft", index, 50)
    assert dirty["uuid"].to_list() == ["s0"]
    assert dirty["reason"][0] == "contaminated: tiny item b0 question exact 'what is 7 times 6'"
    assert clean["uuid"].to_list() == ["s1", "s2", "s3"]


def test_boilerplate_ngrams_do_not_count_and_removal_reaches_a_fixpoint():
    boiler = "please answer the following question carefully and show all of your work step by step"
    bench = _bench([boiler + " what is the boiling point of water at sea level in kelvin"], source="b")
    train = sft_table([boiler + f" topic number {i} about something else" for i in range(5)])
    clean, dirty, _, stats = decontaminate(train, "sft", build_index(bench, [13]), max_train_doc_freq=3)
    assert dirty.is_empty() and len(clean) == 5
    assert stats["boilerplate_ngrams_ignored"]["13-gram"] > 0
    _, dirty2, _, _ = decontaminate(train, "sft", build_index(bench, [13]), max_train_doc_freq=10)
    assert len(dirty2) == 5
    # 4 rows share the boilerplate (over the limit of 3), 2 of them also carry the question:
    # removing those 2 leaves the boilerplate in 2 rows, under the limit, so a second pass removes them too;
    # after it no n-gram is ignored any more, so no third pass is needed
    q = " what is the boiling point of water at sea level in kelvin"
    train3 = sft_table([boiler + q, boiler + q, boiler + " x", boiler + " y", "unrelated text here"])
    clean3, dirty3, _, stats3 = decontaminate(train3, "sft", build_index(bench, [13]), max_train_doc_freq=3)
    assert dirty3["uuid"].to_list() == ["s0", "s1", "s2", "s3"] and stats3["passes"] == 2
    assert find_contamination(clean3, "sft", build_index(bench, [13]), 3)[0].is_empty()


def test_only_user_turns_are_matched_and_rl_rows_work():
    bench = _bench([QUESTION])
    train = rl_table(["Solve: " + QUESTION.upper(), "unrelated prompt " * 5], source="train", prefix="t")
    clean, dirty, _, _ = decontaminate(train, "rl", build_index(bench, [8]), 50)
    assert dirty["uuid"].to_list() == ["t0"] and clean["uuid"].to_list() == ["t1"]
    sft = sft_table(["hello there"]).with_columns(pl.Series("messages", [[
        {"role": "user", "content": "Can you help me?"}, {"role": "assistant", "content": QUESTION}]],
        dtype=sft_table(["x"]).schema["messages"]))
    assert decontaminate(sft, "sft", build_index(bench, [8]), 50)[1].is_empty()


def test_benchmark_instruction_template_is_not_contamination():
    template = "\n\nAnswer with the letter of the correct option in \\boxed{}, e.g. \\boxed{A}."
    bench = rl_table(["Which planet is largest?\nA. Mars\nB. Jupiter" + template], source="mmlu",
                     metadata=[json.dumps({"question": "Which planet is largest?\nA. Mars\nB. Jupiter"})])
    train = rl_table(["What gas do plants absorb?\nA. CO2\nB. O2" + template,
                      "Which planet is largest?\nA. Mars\nB. Jupiter" + template], source="arc", prefix="t")
    clean, dirty, _, _ = decontaminate(train, "rl", build_index(bench, [8]), 50)
    assert clean["uuid"].to_list() == ["t0"]  # shares only the template
    assert dirty["uuid"].to_list() == ["t1"]  # the same item, template and all


def test_find_in_sorted_order_gives_the_positions_of_a_plain_binary_search():
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 1 << 40, 5000, dtype=np.uint64))
    values = np.concatenate([keys[rng.integers(0, len(keys), 300)], rng.integers(0, 1 << 41, 300, dtype=np.uint64),
                             keys[[0, -1, -1]], np.array([0, (1 << 64) - 1], dtype=np.uint64)])
    found, at = _find(keys, values)
    want = np.searchsorted(keys, values)
    assert np.array_equal(found, (want < len(keys)) & (keys[np.minimum(want, len(keys) - 1)] == values))
    assert np.array_equal(at[found], want[found])
    assert _find(keys[:0], values)[0].sum() == 0 and _find(keys, values[:0])[0].shape == (0,)


def test_item_text_reads_the_question_of_any_metadata_or_falls_back_to_the_user_turns():
    metadata = [json.dumps({"question": "Q \u00e9 \"x\"\nnext", "x": {"question": "nested"}}), json.dumps({"question": 5.0}),
                json.dumps({"question": {"a": [1, 2]}}), json.dumps({"question": None}), "[]", "{}",
                json.dumps({"question": ""})]
    rows = rl_table([f"user turn {i}" for i in range(len(metadata))], source="t", metadata=metadata)
    assert item_texts(rows, "rl").to_list() == ['Q é "x"\nnext', "5.0", '{"a":[1,2]}', "user turn 3", "user turn 4",
                                                "user turn 5", ""]
    assert item_texts(rows.head(0), "rl").to_list() == []


def test_unicode_questions_match_only_themselves():
    cjk = "小明有三个苹果他又买了五个苹果现在他一共有多少个苹果"
    bench = _bench([cjk, "Сколько будет два плюс два если считать очень внимательно и медленно"], source="u")
    train = sft_table(["请回答：" + cjk, "小红有三个梨子她又买了五个梨子现在她一共有多少个梨子",
                       "СКОЛЬКО БУДЕТ ДВА ПЛЮС ДВА, если считать очень внимательно",
                       "Сколько стоит хлеб сегодня утром в магазине"])
    _, dirty, _, _ = decontaminate(train, "sft", build_index(bench, [8]), 50)
    assert dirty["uuid"].to_list() == ["s0", "s2"]


def test_index_round_trip_and_refuses_other_ngrams(tmp_path):
    bench = _bench([QUESTION])
    index = build_index(bench, [13, 8])
    write_index(index, tmp_path)
    back = read_index(tmp_path, [8, 13])
    assert back.grams.equals(index.grams) and back.meta["ngrams"] == [8, 13]
    assert index.meta["indexed_ngrams"] == {"8": 24, "13": 19}  # 31 words: 24 8-grams, 19 13-grams
    with pytest.raises(ValueError, match="rebuild"):
        read_index(tmp_path, [13])
    with pytest.raises(FileNotFoundError, match="decontam_index"):
        read_index(tmp_path / "missing", [13])
    assert np.all(np.diff(index.grams["h"].to_numpy()[index.grams["n"].to_numpy() == 8].astype(np.float64)) >= 0)


def test_short_ngrams_need_item_coverage_so_generic_phrases_do_not_count():
    item = ("What is the probability that exactly two of the five fair coins tossed by Maria "
            "land heads up while the other three land tails up")
    bench = _bench([item], source="mmlu")
    generic = "Question: what is the probability that exactly two of the dice show a six?"
    copied = "Hi! " + item.upper() + " Please explain."
    index = build_index(bench, [8, 13])
    any_one = decontaminate(sft_table([generic, copied]), "sft", index, 50)[1]
    assert any_one["uuid"].to_list() == ["s0", "s1"]  # one shared 8-gram is enough without coverage
    covered = decontaminate(sft_table([generic, copied]), "sft", index, 50, {8: 0.5, 13: 0.0})[1]
    assert covered["uuid"].to_list() == ["s1"]


def test_real_rows_give_the_reasons_recorded_before_the_vectorized_rewrite():
    # real SFT/RL rows and benchmark items (MATH-500, MMLU, GSM8K, MT-Bench, IFBench; Chinese,
    # Cyrillic and accented clean rows); "expected" was produced by the previous implementation
    fx = json.loads((Path(__file__).parent / "data" / "decontamination_real.json").read_text())
    b = fx["benchmarks"]
    bench = rl_table([r["question"] for r in b], uuid=[r["uuid"] for r in b],
                     ground_truth=[json.dumps({"answer": r["answer"]} if r["answer"] else {}) for r in b]
                     ).with_columns(pl.Series("source", [r["source"] for r in b]))
    index = build_index(bench, [8, 13])
    for kind in ("sft", "rl"):
        rows = [t for t in fx["train"] if t["kind"] == kind]
        texts, uuids = [t["text"] for t in rows], [t["uuid"] for t in rows]
        train = sft_table(texts, uuid=uuids) if kind == "sft" else rl_table(texts, source="train", uuid=uuids)
        clean, dirty, _, stats = decontaminate(train, kind, index, 50, {8: 0.5, 13: 0.0})
        assert dict(zip(dirty["uuid"], dirty["reason"], strict=True)) == fx["expected"][kind]["reasons"]
        assert stats == fx["expected"][kind]["stats"]
        assert len(clean) == len(rows) - len(dirty) and find_contamination(clean, kind, index, 50)[0].is_empty()

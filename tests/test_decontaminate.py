import polars as pl

from curation.decontaminate import decontaminate
from tests.rows import rl_table, sft_table

QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
            "in May. How many clips did Natalia sell altogether in April and May?")


def test_planted_item_reformatted_across_lines_and_case_is_caught():
    bench = rl_table([QUESTION, "What is 7 times 6?"], source="gsm8k")
    planted = ("Here is a problem for you.\nNATALIA SOLD CLIPS to 48 of her friends in April,\nand then "
               "she sold half as many clips in May... how many clips did natalia sell altogether?")
    train = sft_table([planted, "Tell me a story about a dragon who learns to bake bread in the mountains."])
    clean, dirty, stats = decontaminate(train, "sft", bench, 13, 50)
    assert clean["uuid"].to_list() == ["s1"]
    assert dirty["uuid"].to_list() == ["s0"]
    assert dirty["reason"][0].startswith("contaminated: gsm8k item b0 13-gram '")
    assert stats["contaminated_by_benchmark"] == {"gsm8k": 1}
    # running detection again on the cleaned table finds nothing
    _, again, _ = decontaminate(clean, "sft", bench, 13, 50)
    assert again.is_empty()


def test_short_benchmark_item_uses_exact_match_fallback():
    bench = rl_table(["What is 7 times 6?"], source="tiny")
    train = sft_table(["what is 7 times 6", "What is 7 times 6? Explain step by step please.", "7 times 6"])
    clean, dirty, _ = decontaminate(train, "sft", bench, 13, 50)
    assert dirty["uuid"].to_list() == ["s0"]
    assert "exact" in dirty["reason"][0]
    assert clean["uuid"].to_list() == ["s1", "s2"]


def test_boilerplate_ngrams_common_in_training_do_not_count():
    boiler = "please answer the following question carefully and show all of your work step by step"
    bench = rl_table([boiler + " what is the boiling point of water at sea level in kelvin"], source="b")
    train = sft_table([boiler + f" topic number {i} about something else" for i in range(5)])
    clean, dirty, stats = decontaminate(train, "sft", bench, 13, max_train_doc_freq=3)
    assert dirty.is_empty() and len(clean) == 5
    assert stats["boilerplate_ngrams_ignored"] > 0
    _, dirty2, _ = decontaminate(train, "sft", bench, 13, max_train_doc_freq=10)
    assert len(dirty2) == 5


def test_only_user_turns_are_matched_and_rl_rows_work():
    bench = rl_table([QUESTION], source="gsm8k")
    train = rl_table(["Solve: " + QUESTION.upper(), "unrelated prompt " * 5], source="train", prefix="t")
    clean, dirty, _ = decontaminate(train, "rl", bench, 8, 50)
    assert dirty["uuid"].to_list() == ["t0"] and clean["uuid"].to_list() == ["t1"]


def test_ngram_hashes_cover_every_window_and_agree_across_tables_and_positions():
    from curation.decontaminate import ngram_hashes
    from curation.text import user_text

    texts = ["a b c d e f", "x y a b c z", "q a b c"]  # 4, 4 and 2 windows of 3 words
    grams = ngram_hashes(sft_table(texts), user_text("sft"), 3, with_text=True)
    assert grams.group_by("uuid", maintain_order=True).len()["len"].to_list() == [4, 4, 2]
    by_text = grams.group_by("ngram").agg(pl.col("h").n_unique())
    assert by_text["h"].max() == 1  # one hash per n-gram text, wherever it occurs
    other = ngram_hashes(rl_table(["zz a b c"]), user_text("rl"), 3)
    abc = grams.filter(pl.col("ngram") == "a b c")["h"][0]
    assert abc in other["h"].to_list()
    assert grams["h"].n_unique() == grams["ngram"].n_unique()


def test_benchmark_instruction_template_is_not_contamination():
    import json

    template = "\n\nAnswer with the letter of the correct option in \\boxed{}, e.g. \\boxed{A}."
    bench = rl_table(["Which planet is largest?\nA. Mars\nB. Jupiter" + template], source="mmlu",
                     metadata=[json.dumps({"question": "Which planet is largest?\nA. Mars\nB. Jupiter"})])
    train = rl_table(["What gas do plants absorb?\nA. CO2\nB. O2" + template,
                      "Which planet is largest?\nA. Mars\nB. Jupiter" + template], source="arc", prefix="t")
    clean, dirty, _ = decontaminate(train, "rl", bench, 8, 50)
    assert clean["uuid"].to_list() == ["t0"]  # shares only the template
    assert dirty["uuid"].to_list() == ["t1"]  # the same item, template and all

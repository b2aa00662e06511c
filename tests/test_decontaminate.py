import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from common.text import item_texts
from curation.decontaminate import (
    HITS_SCHEMA,
    decontaminate,
    detect_contamination,
    find_contamination,
    find_contamination_tables,
    hits_frame_rows,
    row_hits,
    scanned_rows,
)
from curation.ngram_index import _find, build_index, read_index, write_index
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
    assert dirty["reason"][0] == ("contaminated: gsm8k item b0 question 13-gram in prompt "
                                  "'natalia sold clips to 48 of her friends in april and then she'")
    assert matches.row(0, named=True) | {"match": None} == {
        "uuid": "s0", "side": "prompt", "benchmark": "gsm8k", "benchmark_uuid": "b0", "field": "question",
        "how": "13-gram", "match": None, "shared": 15, "phrases": 1, "min_doc_freq": 1}  # 27 shared words
    assert stats["contaminated_by_benchmark"] == {"gsm8k": 1}
    again, _ = find_contamination(clean, "sft", index, 50)
    assert again.is_empty()


def test_reference_answer_field_is_indexed():
    solution = "def add(a, b):\n    total = a + b\n    return total  # the sum of the two numbers given"
    bench = rl_table(["Write add."], source="humaneval", ground_truth=['{"test": "assert add(1, 2) == 3"}'],
                     metadata=[json.dumps({"canonical_solution": solution})])
    train = sft_table(["Fix this:\ndef add(a, b):\n    total = a + b\n    return total  # the sum of the two numbers"])
    _, dirty, matches, _ = decontaminate(train, "sft", build_index(bench, [8]), 50)
    assert matches["field"].to_list() == ["solution"] and matches["how"].to_list() == ["8-gram"]
    assert dirty["uuid"].to_list() == ["s0"]


def test_short_benchmark_item_uses_exact_match_fallback_and_short_answers_are_not_indexed():
    bench = _bench(["What is 7 times 6?"], source="tiny", answers=["42"])
    train = sft_table(["what is 7 times 6", "What is 7 times 6? Explain step by step please.", "7 times 6", "42"])
    index = build_index(bench, [8, 13])
    clean, dirty, _, _ = decontaminate(train, "sft", index, 50)
    assert dirty["uuid"].to_list() == ["s0"]
    assert dirty["reason"][0] == "contaminated: tiny item b0 question exact in prompt 'what is 7 times 6'"
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
    train3 = sft_table([boiler + q + " (a)", boiler + q + " (b)", boiler + " x", boiler + " y", "unrelated text here"])
    clean3, dirty3, _, stats3 = decontaminate(train3, "sft", build_index(bench, [13]), max_train_doc_freq=3)
    assert dirty3["uuid"].to_list() == ["s0", "s1", "s2", "s3"] and stats3["passes"] == 2
    assert find_contamination(clean3, "sft", build_index(bench, [13]), 3)[0].is_empty()
    # rows with the same prompt are one problem: 3 problems hold the boilerplate, within the limit
    same = sft_table([boiler + q, boiler + q, boiler + " x", boiler + " y"])
    _, dirty4, _, stats4 = decontaminate(same, "sft", build_index(bench, [13]), max_train_doc_freq=3)
    assert len(dirty4) == 4 and stats4["boilerplate_ngrams_ignored"]["13-gram"] == 0


def test_rl_rows_match_on_the_prompt_and_assistant_turns_on_the_answer_side():
    bench = _bench([QUESTION])
    train = rl_table(["Solve: " + QUESTION.upper(), "unrelated prompt " * 5], source="train", prefix="t")
    clean, dirty, _, _ = decontaminate(train, "rl", build_index(bench, [8]), 50)
    assert dirty["uuid"].to_list() == ["t0"] and clean["uuid"].to_list() == ["t1"]
    sft = sft_table(["Can you help me?"], messages=[[
        {"role": "user", "content": "Can you help me?"}, {"role": "assistant", "content": QUESTION}]])
    _, dirty, matches, _ = decontaminate(sft, "sft", build_index(bench, [8]), 50)
    assert matches.select("side", "field").rows() == [("answer", "question")]
    assert dirty["reason"][0].startswith("contaminated: gsm8k item b0 question 8-gram in answer '")
    assert decontaminate(sft, "sft", build_index(bench, [8]), 50, sides=("prompt",))[1].is_empty()
    with pytest.raises(ValueError, match="sides"):
        decontaminate(sft, "sft", build_index(bench, [8]), 50, sides=("assistant",))


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
    fx, index, tables = _real_fixture()
    for kind, train in tables.items():
        clean, dirty, _, stats = decontaminate(train, kind, index, 50, {8: 0.5, 13: 0.0})
        assert dict(zip(dirty["uuid"], dirty["reason"], strict=True)) == fx["expected"][kind]["reasons"]
        assert stats == fx["expected"][kind]["stats"]
        assert len(clean) == len(train) - len(dirty) and find_contamination(clean, kind, index, 50)[0].is_empty()


def _real_fixture():
    """(the fixture, the index of its benchmark items, ``{kind: its training rows}``)."""
    fx = json.loads((Path(__file__).parent / "data" / "decontamination_real.json").read_text())
    b = fx["benchmarks"]
    bench = rl_table([r["question"] for r in b], uuid=[r["uuid"] for r in b],
                     ground_truth=[json.dumps({"answer": r["answer"]} if r["answer"] else {}) for r in b]
                     ).with_columns(pl.Series("source", [r["source"] for r in b]))
    tables = {}
    for kind in ("sft", "rl"):
        rows = [t for t in fx["train"] if t["kind"] == kind]
        texts, uuids = [t["text"] for t in rows], [t["uuid"] for t in rows]
        tables[kind] = sft_table(texts, uuid=uuids) if kind == "sft" else rl_table(texts, source="train", uuid=uuids)
    return fx, build_index(bench, [8, 13]), tables


def test_the_hits_of_batches_give_the_matches_and_stats_of_the_whole_tables():
    """The map of the decontaminate step returns index hits per batch (no text); detection on the joined
    hits of both tables equals detection on the whole tables (real rows, several batchings)."""
    _, index, tables = _real_fixture()
    rule = {"max_train_doc_freq": 50, "min_coverage": {8: 0.5, 13: 0.0}, "stock_doc_freq": 1}
    whole, whole_stats = find_contamination_tables(tables, index, **rule)
    assert not whole.is_empty()
    for size in (1, 3, 1000):
        parts = [(kind, pl.concat([pl.DataFrame(schema=HITS_SCHEMA),
                                   *(row_hits(t.slice(i, size), kind, index) for i in range(0, len(t), size))]))
                 for kind, t in tables.items()]
        assert all(set(f.columns) == set(HITS_SCHEMA) and len(f) < len(tables[k]) for k, f in parts)
        matches, stats = detect_contamination(scanned_rows(parts), index, **rule)
        assert matches.equals(whole) and stats == whole_stats


def test_detection_over_buckets_of_problems_gives_the_matches_and_stats_of_one():
    """Detection reading the scanned rows as buckets (every row of one problem in one bucket, rows numbered over
    all of them, loaded once per pass) equals detection on all rows at once, for several bucket counts."""
    _, index, tables = _real_fixture()
    rule = {"max_train_doc_freq": 50, "min_coverage": {8: 0.5, 13: 0.0}, "stock_doc_freq": 1}
    whole, whole_stats = find_contamination_tables(tables, index, **rule)
    frames = [row_hits(t, kind, index).with_columns(pl.lit(kind).alias("table")) for kind, t in tables.items()]
    rows = pl.concat(frames).with_row_index("number").with_columns(pl.col("number").cast(pl.Int64))
    loads = []
    for k in (2, 3, 7):
        parts = rows.with_columns((pl.col("problem") % k).alias("b")).partition_by("b", include_key=False)
        assert len(parts) > 1
        loads.clear()
        loaders = [lambda part=part: loads.append(1) or hits_frame_rows(part.reverse(), len(rows)) for part in parts]
        matches, stats = detect_contamination(loaders, index, **rule)
        assert matches.equals(whole) and stats == whole_stats
        assert len(loads) == len(parts) * (stats["passes"] + 1)


def test_the_step_spills_hits_and_splits_them_by_problem_with_the_same_matches(tmp_path, monkeypatch):
    """``decontaminate_files`` streams the hits to its scratch; with more than ``BUCKET_HITS`` of them it
    splits them into buckets by problem: the same matches, stats, contaminated rows and clean files."""
    from common.executor import LocalExecutor
    from common.io import write_parquet
    from curation import decontam_map
    from curation.params import DecontaminateParams

    _, index, tables = _real_fixture()
    src = {}
    for kind, t in tables.items():
        src[kind] = tmp_path / f"{kind}.parquet"
        write_parquet(t, src[kind])
    p = DecontaminateParams(ngrams=[8, 13], min_coverage=[0.5, 0.0])
    runs = []
    for bucket_hits in (10**9, 40):
        monkeypatch.setattr(decontam_map, "BUCKET_HITS", bucket_hits)
        out = {k: tmp_path / f"{bucket_hits}" / f"{k}.parquet" for k in src}
        out["sft"].parent.mkdir()
        dirty, matches, stats, counts = decontam_map.decontaminate_files(LocalExecutor(), src, out, index, p)
        runs.append((dirty, matches, stats, counts, {k: pl.read_parquet(f) for k, f in out.items()}))
    (d1, m1, s1, c1, o1), (d2, m2, s2, c2, o2) = runs
    assert not m1.is_empty() and m1.equals(m2) and s1 == s2 and c1 == c2
    assert all(d1[k].equals(d2[k]) and o1[k].equals(o2[k]) for k in src)
    buckets = [load() for load in decontam_map.spill_hits(LocalExecutor(), src, index, tmp_path)]
    assert len(buckets) > 3
    numbers = np.sort(np.concatenate([b.number for b in buckets]))
    assert np.array_equal(numbers, np.arange(buckets[0].total))  # every scanned row in one bucket
    problems = [set(b.problem.tolist()) for b in buckets]
    assert sum(map(len, problems)) == len(set().union(*problems))  # a problem's rows in one bucket


# Real benchmark items: MATH-500 (problem and reference solution as oe-eval ships them) and HumanEval/0.
POLAR = ("Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer in the form "
         "$(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$")
POLAR_SOLUTION = ("We have that $r = \\sqrt{0^2 + 3^2} = 3.$  Also, if we draw the line connecting the origin and "
                  "$(0,3),$ this line makes an angle of $\\frac{\\pi}{2}$ with the positive $x$-axis.\n\n[asy]\n"
                  "unitsize(0.8 cm);\n\ndraw((-0.5,0)--(3.5,0));\ndraw((0,-0.5)--(0,3.5));\ndraw(arc((0,0),3,0,90),"
                  "red,Arrow(6));\n\ndot((0,3), red);\nlabel(\"$(0,3)$\", (0,3), W);\ndot((3,0), red);\n[/asy]\n\n"
                  "Therefore, the polar coordinates are $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$")
CLOSE_ELEMENTS = ("    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in enumerate(numbers):\n"
                  "            if idx != idx2:\n                distance = abs(elem - elem2)\n"
                  "                if distance < threshold:\n                    return True\n\n    return False\n")


def test_a_reference_solution_copied_into_an_assistant_turn_is_caught_on_the_answer_side():
    bench = pl.concat([
        rl_table([POLAR], source="math500", ground_truth=[json.dumps({"answer": "\\left( 3, \\frac{\\pi}{2} \\right)"})],
                 metadata=[json.dumps({"question": POLAR, "solution": POLAR_SOLUTION})]),
        rl_table(["Check if in given list of numbers, are any two numbers closer to each other than given threshold."],
                 source="humaneval", prefix="h", ground_truth=['{"test": "..."}'],
                 metadata=[json.dumps({"canonical_solution": CLOSE_ELEMENTS})])])
    messages = [
        [{"role": "user", "content": "What are polar coordinates?"},
         {"role": "assistant", "reasoning_content": "Recall the worked example. " + POLAR_SOLUTION, "content": "3, pi/2"}],
        [{"role": "user", "content": "Write a function that tells whether two numbers in a list are close."},
         {"role": "assistant", "content": "```python\ndef close(numbers, threshold):\n" + CLOSE_ELEMENTS + "```"}],
        [{"role": "user", "content": "What are polar coordinates?"},
         {"role": "assistant", "content": "A point is given by its distance r from the origin and its angle theta "
                                          "from the positive x-axis; r = sqrt(x^2 + y^2)."}]]
    train = sft_table([m[0]["content"] for m in messages], messages=messages)
    index = build_index(bench, [8, 13])
    assert set(index.items["field"]) == {"question", "solution"}  # a bare final answer identifies no item
    clean, dirty, matches, stats = decontaminate(train, "sft", index, 50, {8: 0.5, 13: 0.0}, stock_doc_freq=1)
    assert matches.select("uuid", "side", "benchmark", "field", "how").rows() == [
        ("s0", "answer", "math500", "solution", "13-gram"), ("s1", "answer", "humaneval", "solution", "13-gram")]
    assert dirty["reason"].str.contains(" in answer '").all() and clean["uuid"].to_list() == ["s2"]
    assert stats["contaminated_by_benchmark"] == {"humaneval": 1, "math500": 1}
    # the rule before #21 (prompt side only) let both copies through
    assert decontaminate(train, "sft", index, 50, {8: 0.5, 13: 0.0}, sides=("prompt",))[1].is_empty()


CONICS = "\n(A) Line\n(B) Circle\n(C) Parabola\n(D) Ellipse\n(E) Hyperbola\n\nEnter the letter of the correct option."


def test_a_stock_phrase_alone_is_not_contamination_once_unrelated_rows_share_it():
    # real MATH problems: the MATH-500 item, a copy of it and two other problems ending in the same answer choices
    item = "Find the curve defined by the equation\n\\[r^2 \\cos 2 \\theta = 4.\\]" + CONICS
    others = ["For real numbers $t,$ the point\n\\[(x,y) = (\\cos t, \\cos 2t)\\]is plotted.  All the plotted points "
              "lie on what kind of curve?\n" + CONICS,
              "For real numbers $t \\neq 0,$ the point\n\\[(x,y) = \\left( t + \\frac{1}{t}, t - \\frac{1}{t} "
              "\\right)\\]is plotted.  All the plotted points lie on what kind of curve?\n" + CONICS]
    bench = _bench([item], source="math500")
    index = build_index(bench, [8, 13])
    train = rl_table([item, *others], source="math_problems", prefix="t")
    clean, dirty, matches, stats = decontaminate(train, "rl", index, 50, {8: 0.5, 13: 0.0}, stock_doc_freq=1)
    assert dirty["uuid"].to_list() == ["t0"] and clean["uuid"].to_list() == ["t1", "t2"]
    assert stats["stock_ngrams"]["13-gram"] == 5  # the 17-word phrase, held by t1 and t2 once t0 is gone
    # without the stock tier the one shared phrase removes both unrelated problems
    assert decontaminate(train, "rl", index, 50, {8: 0.5, 13: 0.0})[1]["uuid"].to_list() == ["t0", "t1", "t2"]
    # a phrase held by one unrelated row only is evidence: it cannot be told from a partial copy
    _, dirty, _, _ = decontaminate(train.head(2), "rl", index, 50, {8: 0.5, 13: 0.0}, stock_doc_freq=1)
    assert dirty["uuid"].to_list() == ["t0", "t1"]


def test_the_stock_tier_counts_the_rows_of_every_table():
    item = "Find the curve defined by the equation\n\\[r^2 \\cos 2 \\theta = 4.\\]" + CONICS
    other = ("For real numbers $t,$ the point\n\\[(x,y) = (\\cos t, \\cos 2t)\\]is plotted.  All the plotted points "
             "lie on what kind of curve?\n" + CONICS)
    index = build_index(_bench([item], source="math500"), [8, 13])
    sft, rl = sft_table([other]), rl_table([other.replace("cos t", "sin t")], source="math_problems", prefix="t")
    rule = {"max_train_doc_freq": 50, "min_coverage": {8: 0.5, 13: 0.0}, "stock_doc_freq": 1}
    # alone, each table holds the phrase once: evidence; together, two unrelated rows hold it: a stock phrase
    assert find_contamination(sft, "sft", index, **rule)[0]["uuid"].to_list() == ["s0"]
    assert find_contamination(rl, "rl", index, **rule)[0]["uuid"].to_list() == ["t0"]
    matches, stats = find_contamination_tables({"sft": sft, "rl": rl}, index, **rule)
    assert matches.is_empty() and stats["stock_ngrams"]["13-gram"] == 5
    copied = rl_table([item], source="math_problems", prefix="c")
    matches, _ = find_contamination_tables({"sft": sft, "rl": pl.concat([rl, copied])}, index, **rule)
    assert matches.select("uuid", "table").rows() == [("c0", "rl")]
    # one problem in both tables (its SFT solution and its RL prompt) is one training document: a real
    # MATH problem that MMLU copied (with answer options) is caught in both, though it shares one 13-gram
    problem = "What is the smallest positive integer with factors of 16, 15, and 12?"
    index = build_index(_bench([problem + " A. 240 B. 120 C. 60 D. 111"], source="mmlu"), [8, 13])
    matches, _ = find_contamination_tables({"sft": sft_table([problem]), "rl": rl_table([problem], prefix="t")},
                                           index, **rule)
    assert matches.select("uuid", "shared", "min_doc_freq").rows() == [("s0", 1, 1), ("t0", 1, 1)]


def test_two_separate_phrases_of_an_item_are_evidence_even_when_each_is_common():
    # a GSM8K test item and templated variants of it (GSM-Symbolic style: only the numbers change)
    item = ("Mary is an avid gardener. Yesterday, she received {a} new potted plants from her favorite plant nursery. "
            "She already has {b} potted plants on each of the {c} window ledges of her large country home. Feeling "
            "generous, she has decided that she will give {d} potted plant from each ledge to friends and family "
            "tomorrow. How many potted plants will Mary remain with?")
    bench = _bench([item.format(a=18, b=2, c=40, d=1)], source="gsm8k")
    train = rl_table([item.format(a=a, b=b, c=c, d=d) for a, b, c, d in ((13, 3, 57, 2), (9, 4, 64, 3), (7, 5, 21, 2))],
                     source="gen", prefix="t")
    _, dirty, matches, _ = decontaminate(train, "rl", build_index(bench, [13]), 50, stock_doc_freq=1)
    assert dirty["uuid"].to_list() == ["t0", "t1", "t2"] and matches["phrases"].to_list() == [2, 2, 2]
    assert matches["min_doc_freq"].to_list() == [3, 3, 3]  # every shared 13-gram is in all three rows


def test_a_code_idiom_shared_with_a_canonical_solution_is_not_contamination_on_the_answer_side():
    # real rows: HumanEval/71's canonical solution and the MBPP solution that shares its triangle check
    triangle_area = ("    if a + b <= c or a + c <= b or b + c <= a:\n        return -1 \n    s = (a + b + c)/2    \n"
                     "    area = (s * (s - a) * (s - b) * (s - c)) ** 0.5\n    area = round(area, 2)\n    return area\n")
    bench = rl_table(["Given the lengths of the three sides of a triangle. Return the area of the triangle rounded to 2 "
                      "decimal points if the three sides form a valid triangle."], source="humaneval",
                     metadata=[json.dumps({"canonical_solution": triangle_area})])
    question = "Write a python function to check whether the triangle is valid or not if sides are given."
    mbpp = ("```python\ndef check_Validity(a,b,c):  \n    if (a + b <= c) or (a + c <= b) or (b + c <= a) : \n"
            "        return False\n    else: \n        return True\n```")
    train = sft_table([question, question], messages=[
        [{"role": "user", "content": question}, {"role": "assistant", "content": mbpp}],
        [{"role": "user", "content": question}, {"role": "assistant", "content": "def area(a, b, c):\n" + triangle_area}]])
    index = build_index(bench, [8, 13])
    matches = find_contamination(train, "sft", index, 50, {8: 0.5, 13: 0.0}, stock_doc_freq=1)[0]
    assert matches.select("uuid", "side", "field").rows() == [("s1", "answer", "solution")]  # the copy only
    loose = find_contamination(train, "sft", index, 50, {8: 0.5, 13: 0.0}, stock_doc_freq=1, answer_min_coverage=0.0)[0]
    assert loose["uuid"].to_list() == ["s0", "s1"]  # any one 13-gram: 'if a b c or a c b or b c a return'


def test_a_canonical_solution_shorter_than_the_longest_ngram_is_not_indexed():
    # HumanEval/13 (greatest_common_divisor): its whole solution is Euclid's loop, in every textbook
    gcd = "    while b:\n        a, b = b, a % b\n    return a\n"
    bench = rl_table(["Return a greatest common divisor of two integers a and b"], source="humaneval",
                     metadata=[json.dumps({"canonical_solution": gcd})])
    index = build_index(bench, [8, 13])
    assert index.items["field"].to_list() == ["question", "solution"]
    # the 11-word question: 8-grams and the exact fallback; the 10-word solution: neither
    assert set(index.grams["item"].to_list()) == {0} and index.exact["item"].to_list() == [0]
    train = sft_table(["lcm of a list"], messages=[[{"role": "user", "content": "lcm of a list"}, {
        "role": "assistant", "content": "def gcd(a, b):\n" + gcd + "\ndef lcm(nums):\n    ..."}]])
    assert decontaminate(train, "sft", index, 50, {8: 0.5, 13: 0.0}, stock_doc_freq=1)[1].is_empty()


def test_ngrams_of_one_character_tokens_are_not_indexed():
    # HumanEval/78's docstring lists the hex digits; a Rails model lists the same alphabet (a real ShareGPT row)
    hex_key = ("You have been tasked to write a function that receives a hexadecimal number as a string and counts "
               "the number of hexadecimal digits that are primes. Hexadecimal digits are 0, 1, 2, 3, 4, 5, 6, 7, 8, "
               "9, A, B, C, D, E, F.")
    index = build_index(_bench([hex_key], source="humaneval"), [8, 13])
    ruby = "class Report < ApplicationRecord\n  PUBLIC_ID_CHARS = %w[0 1 2 3 4 5 6 7 8 9 a b c d e f g h].freeze\nend"
    copied = "Please solve: " + hex_key
    _, dirty, _, _ = decontaminate(sft_table([ruby, copied]), "sft", index, 50, {8: 0.5, 13: 0.0}, stock_doc_freq=1)
    assert dirty["uuid"].to_list() == ["s1"]
    assert len(index.grams.filter(pl.col("n") == 13)) == 45 - 12 - 4  # 45 words; 4 windows inside "0 1 ... e f"

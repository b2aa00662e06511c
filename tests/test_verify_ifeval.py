"""Instruction-following verifier: VER-IFEVAL-02 (exact relations, fail closed), VER-IFEVAL-04 (reasoning
stripped), per-instruction semantics on hand-checked texts, repeated ids, binary vs fraction reward."""

from __future__ import annotations

import json

import pytest

from tests.handed import handed_case
from validators.verifiers import check_row, verify
from validators.verifiers.ifeval import INSTRUCTIONS, follows, split_sentences


def _row(ids, kwargs, **meta):
    return {"uuid": "if", "agent_ref": "instruction_following", "instruction_id_list": ids,
            "kwargs": json.dumps(kwargs), "metadata": json.dumps(meta)}


def test_ver_ifeval_02_relations_are_exact_and_unknowns_fail_closed():
    checks = handed_case("VER-IFEVAL-02")["input"]["checks"]
    assert [follows(c["id"], c["kwargs"], c["response"]) for c in checks[:3]] == [False, False, True]
    for c in checks[3:]:  # 'fewer than', a non-letter target, an unknown id: rejected, never True
        with pytest.raises(ValueError):
            follows(c["id"], c["kwargs"], c["response"])
        with pytest.raises(ValueError, match="instruction_id_list"):
            check_row(_row([c["id"]], [c["kwargs"]]))


def test_ver_ifeval_04_constraints_see_only_the_final_answer():
    case = handed_case("VER-IFEVAL-04")
    row = _row([case["input"]["instruction_id"]], [{}])
    assert [verify(r, row).passed for r in case["input"]["responses"]] == case["expected"]["follows"]


@pytest.mark.parametrize("iid,kwargs,text,expected", [
    ("keywords:existence", {"keywords": ["tea", "Coffee"]}, "I like coffee and TEA.", True),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"}, "cat cat", True),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "less than"}, "cat cat", False),
    ("keywords:forbidden_words", {"forbidden_words": ["red"]}, "A reddish sky", True),
    ("keywords:forbidden_words", {"forbidden_words": ["red"]}, "A Red sky", False),
    ("keywords:letter_frequency", {"letter": "A", "let_frequency": 3, "let_relation": "at least"}, "banana", True),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"},
     "Dr. Smith left at 3.5 p.m. today. He said hi! Then e.g. nothing.", False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "one\n***\ntwo", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "one\n***\n***\ntwo", False),
    ("length_constraints:nth_paragraph_first_word",
     {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"}, "First.\n\n\"Then, more.", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Hi [name], at [address].", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Body.\nP.S. bye", True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Body.\nP.S. bye", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* a\n- b\n**bold**", True),
    ("detectable_format:constrained_response", {}, "My answer is maybe.", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", True),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "SECTION 1\na\nSECTION 2\nb", True),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', True),
    ("detectable_format:json_format", {}, "{'a': 1}", False),
    ("detectable_format:title", {}, "<<Poem>>\ntext", True),
    ("combination:two_responses", {}, "A\n******\nB", True),
    ("combination:two_responses", {}, "A\n******\nA", False),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "say hi. Hi!", True),
    ("startend:end_checker", {"end_phrase": "Any questions?"}, '"Done. Any questions?"', True),
    ("startend:quotation", {}, '"quoted"', True),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "less than"},
     "NASA and the FBI", False),
    ("change_case:english_capital", {}, "THIS IS ALL IN CAPITAL LETTERS, AS ASKED.", True),
    ("change_case:english_lowercase", {}, "this is all in lowercase letters as asked.", True),
    ("language:response_language", {"language": "de"}, "Das ist ein kurzer deutscher Satz über das Wetter.", True),
    ("language:response_language", {"language": "de"}, "This is a short English sentence about weather.", False),
    ("punctuation:no_comma", {}, "no commas here", True),
    # IFBench
    ("count:word_count_range", {"min_words": 3, "max_words": 4}, "one two three", True),
    ("count:numbers", {"N": 2}, "It costs 3.50 and 7 more", True),  # punctuation dropped first: 350, 7
    ("count:conjunctions", {"small_n": 2}, "tea and cake, but no coffee", True),
    ("count:keywords_multiple", {"keyword1": "a1", "keyword2": "b2", "keyword3": "c3", "keyword4": "d4",
                                 "keyword5": "e5"}, "a1 " + "b2 " * 2 + "c3 " * 3 + "d4 " * 5 + "e5 " * 7, True),
    ("count:punctuation", {}, "Wait?! Yes; no: maybe, ok. Fine!?", True),
    ("format:options", {"options": "yes/no/maybe"}, "Maybe.", True),
    ("format:no_whitespace", {}, "nowhitespace", True),
    ("format:parentheses", {}, "(a [b {c (d [e])}])", True),
    ("format:quotes", {}, "He said \"she said 'they said \"hi\"'\"", True),
    ("format:line_indent", {}, "a\n b\n  c", True),
    ("format:title_case", {}, "The Quick Brown Fox", True),
    ("format:title_case", {}, "The quick Brown Fox", False),
    ("ratio:sentence_type", {}, "A is b. C is d. Is it?", True),
    ("sentence:increment", {"small_n": 2}, "One two. One two three four.", True),
    ("sentence:keyword", {"word": "blue", "N": 2}, "Red sky. Blue sea.", True),
    ("words:alphabet", {}, "Any big cat.", True),
    ("words:prime_lengths", {}, "an old cat", True),
    ("words:palindrome", {}, " ".join(["level", "radar", "kayak", "civic", "refer", "rotor", "stats", "tenet",
                                       "madam", "sagas"]), True),
    ("words:repeats", {"small_n": 1}, "go go", False),
    ("words:start_verb", {}, "Consider the following.", True),
    ("words:start_verb", {}, "The following.", False),
    ("words:last_first", {}, "I like tea. Tea is good.", True),
    ("words:words_position", {"keyword": "x"}, "a x b x c", True),
    ("repeat:repeat_change", {"prompt_to_repeat": "Write a poem now"}, "Compose a poem now", True),
    ("repeat:repeat_span", {"prompt_to_repeat": "a b c d e", "n_start": 1, "n_end": 3}, "B c d", True),
    ("custom:multiples", {}, "14, 21, 28, 35, 42, 49", True),
    ("custom:date_format_list", {}, "1796-04-12, 1805-12-02", True),
    ("custom:csv_city", {}, "ID,Country,City,Year,Count\n" + "\n".join(f"{i},X,Y,2000,1" for i in range(7)), True),
])
def test_instruction_semantics(iid, kwargs, text, expected):
    assert follows(iid, kwargs, text) is expected


def test_all_ifeval_and_ifbench_ids_are_registered():
    ifeval_ids = {"change_case:capital_word_frequency", "change_case:english_capital", "change_case:english_lowercase",
                  "combination:repeat_prompt", "combination:two_responses", "detectable_content:number_placeholders",
                  "detectable_content:postscript", "detectable_format:constrained_response",
                  "detectable_format:json_format", "detectable_format:multiple_sections",
                  "detectable_format:number_bullet_lists", "detectable_format:number_highlighted_sections",
                  "detectable_format:title", "keywords:existence", "keywords:forbidden_words", "keywords:frequency",
                  "keywords:letter_frequency", "language:response_language",
                  "length_constraints:nth_paragraph_first_word", "length_constraints:number_paragraphs",
                  "length_constraints:number_sentences", "length_constraints:number_words", "punctuation:no_comma",
                  "startend:end_checker", "startend:quotation"}
    follows("punctuation:no_comma", {}, "")  # loads the IFBench and IFTrain checks
    assert len(ifeval_ids) == 25 and ifeval_ids <= set(INSTRUCTIONS)
    assert len(INSTRUCTIONS) == 25 + 57 + 29  # IFEval, IFBench, IFTrain (tests/test_verify_iftrain.py)


def test_repeated_ids_binary_and_fraction_rewards():
    ids = ["keywords:existence", "keywords:existence", "punctuation:no_comma"]
    kwargs = [{"keywords": ["tea"]}, {"keywords": ["cake"]}, {}]
    text = "I want tea, please"
    binary = verify(text, _row(ids, kwargs))
    assert (binary.reward, binary.passed, binary.details["follow"]) == (0.0, False, [True, False, False])
    fraction = verify(text, _row(ids, kwargs, reward_mode="fraction"))
    assert (fraction.reward, fraction.passed) == (pytest.approx(1 / 3), False)
    assert verify("tea cake", _row(ids, kwargs)).reward == 1.0


def test_sentence_splitter_keeps_abbreviations_and_decimals():
    assert split_sentences("Dr. Smith paid $3.50, e.g. for tea. Then he left!  Really?") == [
        "Dr. Smith paid $3.50, e.g. for tea.", "Then he left!", "Really?"]
    assert split_sentences("") == []

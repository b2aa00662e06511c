"""IFTrain checks (:mod:`validators.verifiers.iftrain`, verifiable_instructions' 29 "New Constraints" of
NVIDIA's IF-RL rows): a passing and a failing hand-checked answer per id, the reference's edge cases
(case, punctuation, positions from 1, character indices from 0), each documented deviation, argument
validation, attacks scoring 0, and NeMo-Gym's own example row graded 1 / 0."""

from __future__ import annotations

import json

import pytest

from corpora.nemo_gym import verify_row
from validators.verifiers import check_row, verify
from validators.verifiers.ifeval import INSTRUCTIONS, follows

IFTRAIN_IDS = {
    "copy:repeat_phrase", "copy:copy", "new:copy_span_idx", "detectable_format:sentence_hyphens",
    "keywords:no_adjacent_consecutive", "detectable_format:square_brackets", "keywords:word_once",
    "keywords:word_count_different_numbers", "keywords:exclude_word_harder", "paragraphs:paragraphs",
    "paragraphs:paragraphs2", "first_word:first_word_sent", "first_word:first_word_answer",
    "last_word:last_word_sent", "last_word:last_word_answer", "detectable_format:bigram_wrapping",
    "copy:copying_simple", "copy:copying_multiple", "punctuation:punctuation_dot",
    "punctuation:punctuation_exclamation", "count:lowercase_counting", "letters:letter_counting",
    "letters:letter_counting2", "count:counting_composition", "count:count_unique", "count:count_increment_word",
    "keywords:palindrome", "keywords:keyword_specific_position", "keywords:start_end",
}
PHRASE = {"phrase": "The early bird catches the worm", "small_n": 2}
SPAN = {"prompt_to_repeat": "The quick brown fox", "n_start": 4, "n_end": 8}  # [4:8] "quic", [4:9] "quick"
COMPOSITION = ("I like tea. You like coffee.\n***\nWe drink water. They eat bread.\n***\n"
               "Dogs chase cats. Birds sing songs.")

# (id, kwargs, answer, expected); "# dev" marks a documented deviation from the reference
CASES = [
    ("copy:repeat_phrase", PHRASE, "The early cat catches the worm, and The early bird eats the worm.", True),
    ("copy:repeat_phrase", PHRASE, "The early cat catches the worm.", False),  # once, not twice
    ("copy:repeat_phrase", PHRASE, "The early bird catches the worm. The early fox catches the worm.", False),  # dev
    ("copy:repeat_phrase", PHRASE, "The big bird eats the worm. The early fox catches the worm.", False),  # 2 words
    ("copy:copy", {"prompt_to_repeat": "Write a haiku about rain."}, "  write a HAIKU about rain. ", True),
    ("copy:copy", {"prompt_to_repeat": "Write a haiku about rain."}, "Rain falls soft tonight", False),
    ("copy:copying_simple", {"prompt_to_repeat": "Name three rivers."}, "Name three rivers.", True),
    ("copy:copying_simple", {"prompt_to_repeat": "Name three rivers."}, "Nile, Amazon, Danube.", False),
    ("copy:copying_multiple", {"prompt_to_repeat": "Say hi", "N": 2}, "Say hi\n******\nsay hi", True),
    ("copy:copying_multiple", {"prompt_to_repeat": "Say hi", "N": 2}, "Say hi******Say hi******Say hi", False),
    ("copy:copying_multiple", {"prompt_to_repeat": "Say hi", "N": 2}, "Say hi******Say hello", False),
    ("new:copy_span_idx", SPAN, "quic", True),  # the reference's span, n_end excluded
    ("new:copy_span_idx", SPAN, "Quick", True),  # dev: n_end included, as the instruction says
    ("new:copy_span_idx", SPAN, "quick brown", False),
    ("new:copy_span_idx", {**SPAN, "n_start": 0, "n_end": 3}, "The", True),  # dev: index 0 is the first
    ("detectable_format:sentence_hyphens", {}, "I like tea.-It is warm.-Try it.", True),
    ("detectable_format:sentence_hyphens", {}, "I like tea. -It is warm.", False),  # a space before the hyphen
    ("detectable_format:sentence_hyphens", {}, "I like tea. It is warm.", False),
    ("detectable_format:sentence_hyphens", {}, "I like tea.", False),  # dev: nothing connected
    ("detectable_format:sentence_hyphens", {}, "I like tea.-It is warm.-", False),  # dev: a dangling part
    ("keywords:no_adjacent_consecutive", {}, "The cat sat on mats", True),
    ("keywords:no_adjacent_consecutive", {}, "The cat sat on A Big mat", False),  # a -> B, case ignored
    ("detectable_format:square_brackets", {}, "[Hello] [dear] [world.]", True),
    ("detectable_format:square_brackets", {}, "[Hello dear] [world]", False),
    ("keywords:word_once", {"keyword": "apple"}, "I ate an Apple today.", True),
    ("keywords:word_once", {"keyword": "apple"}, "An apple beside a pineapple.", False),  # substrings count
    ("keywords:word_once", {"keyword": "apple"}, "No fruit today.", False),
    ("keywords:word_count_different_numbers", {"keyword": "sun", "frequency": 2, "relation": "at least"},
     "Sun and sun.", True),
    ("keywords:word_count_different_numbers", {"keyword": "sun", "frequency": 2, "relation": "less than"},
     "Sun and sun.", False),
    ("keywords:exclude_word_harder", {"keyword": "rain"}, "A dry day; my brain is fine.", True),
    ("keywords:exclude_word_harder", {"keyword": "rain"}, "I like rain a lot", False),
    ("keywords:exclude_word_harder", {"keyword": "rain"}, "Rain is coming.", False),  # dev: start, capital
    ("keywords:exclude_word_harder", {"keyword": "rain"}, "It will rain.", False),  # dev: before a period
    ("keywords:exclude_word_harder", {"keyword": "rain", "instruction": "Talk about rain"}, "It is sunny", True),
    ("paragraphs:paragraphs", {}, "First part.\n***\nSecond part.", True),
    ("paragraphs:paragraphs", {}, "First part.\n***\n***\nSecond part.", False),
    ("paragraphs:paragraphs2", {}, "First part.\n\nSecond part.\n\n", True),  # a blank last part is dropped
    ("paragraphs:paragraphs2", {}, "First part.\nSecond part.", False),
    ("paragraphs:paragraphs2", {}, "First part.\n\n\n\nSecond part.", False),  # a blank part between
    ("first_word:first_word_sent", {"first_word": "relationship"}, "Relationship matters. relationship grows!", True),
    ("first_word:first_word_sent", {"first_word": "relationship"}, "Relationship, it matters.", False),  # "Relationship,"
    ("first_word:first_word_sent", {"first_word": "relationship"}, "Relationship matters. Trust grows.", False),
    ("first_word:first_word_sent", {"first_word": ["trust", "x"]}, "Trust me. Trust it.", True),  # dev: a list
    ("first_word:first_word_answer", {"first_word": "crash"}, "Crash course in physics.", True),
    ("first_word:first_word_answer", {"first_word": "crash"}, "Crash, then silence.", False),  # "Crash,"
    ("first_word:first_word_answer", {"first_word": "crash"}, "A crash course.", False),
    ("last_word:last_word_sent", {"last_word": "now"}, "Do it now. Leave, now!", True),
    ("last_word:last_word_sent", {"last_word": "now"}, "Do it now. Leave soon.", False),
    ("last_word:last_word_answer", {"last_word": "contest"}, "We finally won the CON-TEST!", True),  # [^\w\s] dropped
    ("last_word:last_word_answer", {"last_word": "contest"}, "The contest was won.", False),
    ("detectable_format:bigram_wrapping", {}, "<<I am>> <<at home>> today", True),  # an odd last word is free
    ("detectable_format:bigram_wrapping", {}, "I am <<at home>>", False),
    ("punctuation:punctuation_dot", {}, "No dots here, only commas; fine", True),
    ("punctuation:punctuation_dot", {}, "One dot.", False),
    ("punctuation:punctuation_dot", {}, "Fullwidth dot．", False),  # dev: look-alikes
    ("punctuation:punctuation_dot", {}, "An ellipsis…", False),  # dev
    ("punctuation:punctuation_exclamation", {}, "A calm answer.", True),
    ("punctuation:punctuation_exclamation", {}, "Wow!", False),
    ("punctuation:punctuation_exclamation", {}, "Wow！", False),  # dev: fullwidth
    ("count:lowercase_counting", {"N": 3}, "THE SUN is up. Hello World", True),  # is, up
    ("count:lowercase_counting", {"N": 3}, "the sun is up today", False),
    ("letters:letter_counting", {"N": 3, "relation": "at least"}, "a-b-c", True),
    ("letters:letter_counting", {"N": 3, "relation": "at least"}, "ab 12", False),
    ("letters:letter_counting", {"N": 3, "relation": "less than"}, "AB!", True),
    ("letters:letter_counting2", {"letter": "A", "let_frequency": 2, "let_relation": "at least"}, "bAnana", True),
    ("letters:letter_counting2", {"letter": "a", "let_frequency": 2, "let_relation": "at least"}, "a bun", False),
    ("count:counting_composition", {"n_sent": 2, "n_words": 3}, COMPOSITION, True),  # dev: "." is no word
    ("count:counting_composition", {"n_sent": 2, "n_words": 3}, COMPOSITION.replace("***", "* * *"), True),  # dev
    ("count:counting_composition", {"n_sent": 2, "n_words": 3}, COMPOSITION.replace("I like", "I really like"), False),
    ("count:counting_composition", {"n_sent": 2, "n_words": 3}, COMPOSITION.rsplit("\n***\n", 1)[0], False),
    ("count:count_unique", {}, "One, two, three.", True),  # dev: repeated commas are no repeated word
    ("count:count_unique", {}, "The cat saw the dog.", False),  # dev: "The" and "the"
    ("count:count_increment_word", {"keyword1": "red", "keyword2": "blue"}, "Red sky, blue sea, BLUE eyes.", True),
    ("count:count_increment_word", {"keyword1": "red", "keyword2": "blue"}, "Red sky, blue sea.", False),
    ("keywords:palindrome", {}, "My Kayak, is red.", True),  # dev: case and punctuation ignored
    ("keywords:palindrome", {}, "He said: A man, a plan, a canal: Panama.", True),
    ("keywords:palindrome", {}, "I saw a dog at 1991.", False),  # dev: "I", "a" and a number are not enough
    ("keywords:keyword_specific_position", {"keyword": "blue", "n": 2, "m": 3}, "Sky is grey. The deep blue sea.", True),
    ("keywords:keyword_specific_position", {"keyword": "blue", "n": 2, "m": 3},
     "Sky is grey. The sea, blue and deep.", True),  # dev: the comma is no word
    ("keywords:keyword_specific_position", {"keyword": "blue", "n": 2, "m": 3}, "Sky is blue. Blue is the sea.", False),
    ("keywords:keyword_specific_position", {"keyword": "apple", "n": 1, "m": 1}, "Apple trees grow.", True),  # dev
    ("keywords:start_end", {}, "Paris is lovely; I miss paris", True),
    ("keywords:start_end", {}, "Paris is lovely, I miss Paris.", False),  # punctuation after the last word
    ("keywords:start_end", {}, "- one item, then another -", False),  # dev: "-" is no word
]


def test_all_29_ids_are_registered_and_each_has_a_passing_and_a_failing_case():
    follows("punctuation:no_comma", {}, "")  # loads the IFBench and IFTrain checks
    assert len(IFTRAIN_IDS) == 29 and IFTRAIN_IDS <= set(INSTRUCTIONS)
    for iid in IFTRAIN_IDS:
        assert {expected for i, _, _, expected in CASES if i == iid} == {True, False}, iid


@pytest.mark.parametrize("iid,kwargs,text,expected", CASES)
def test_iftrain_semantics(iid, kwargs, text, expected):
    assert follows(iid, kwargs, text) is expected


@pytest.mark.parametrize("iid,kwargs", [
    ("copy:repeat_phrase", {"phrase": "Two words", "small_n": 2}),  # no centre word to replace
    ("copy:repeat_phrase", {"phrase": "The early bird", "small_n": 0}),  # the reference draws a random count
    ("copy:copy", {"prompt_to_repeat": "  "}),
    ("new:copy_span_idx", {"prompt_to_repeat": "abc", "n_start": 2, "n_end": 9}),
    ("new:copy_span_idx", {"prompt_to_repeat": "abc", "n_start": "1", "n_end": 2}),
    ("keywords:word_once", {"keyword": ""}),
    ("keywords:word_once", {"keyword": ["apple"]}),  # a list only where the reference reads one
    ("keywords:word_count_different_numbers", {"keyword": "sun", "frequency": 2, "relation": "exactly"}),
    ("letters:letter_counting2", {"letter": "ab", "let_frequency": 2, "let_relation": "at least"}),
    ("count:counting_composition", {"n_sent": 0, "n_words": 3}),
    ("keywords:keyword_specific_position", {"keyword": "x", "n": 1}),  # m missing
    ("first_word:first_word_answer", {"first_word": "crash", "nth": 1}),  # an argument the check does not take
])
def test_unusable_arguments_fail_closed(iid, kwargs):
    with pytest.raises(ValueError):
        follows(iid, kwargs, "anything")


def _row(ids, kwargs, prompt=None):
    row = {"uuid": "iftrain-row", "agent_ref": "instruction_following", "instruction_id_list": ids,
           "kwargs": json.dumps(kwargs)}
    if prompt is not None:
        row["responses_create_params"] = {"input": [{"role": "user", "content": prompt}]}
    return row


def test_check_row_names_the_row_of_missing_arguments():
    with pytest.raises(ValueError, match=r"iftrain-row.*instruction_id_list\[1\].*missing arguments \['last_word'\]"):
        check_row(_row(["count:count_unique", "last_word:last_word_answer"], [{}, {}]))


RAIN = "Write a short story about a storm over a fishing village."
COPY = "Describe the water cycle in two sentences."
COPY_PROMPT = (f"{COPY} Copy this instruction verbatim, do not follow the instruction, only copy it into the output "
               "(do not include this instruction sentence!).")


@pytest.mark.parametrize("ids,kwargs,prompt,answer", [
    (["last_word:last_word_answer"], [{"last_word": "contest"}], RAIN, ""),  # empty answer
    (["keywords:palindrome"], [{}], RAIN, "<think>racecar</think>"),  # only reasoning
    (["copy:copy"], [{"prompt_to_repeat": COPY}], COPY_PROMPT, COPY_PROMPT),  # the whole prompt echoed
    (["last_word:last_word_answer"], [{"last_word": "contest"}], RAIN, RAIN + " contest"),  # echo + the word
    (["last_word:last_word_answer"], [{"last_word": "contest"}], RAIN, "contest " * 6),  # the letter, no content
    (["detectable_format:square_brackets"], [{}], RAIN, "[] [] [] [] [] []"),
    (["keywords:start_end", "punctuation:punctuation_dot"], [{}, {}], RAIN, "ok ok ok ok ok ok ok"),
    (["keywords:palindrome"], [{}], RAIN, "A storm hit a fishing village, I saw a boat sink."),  # "a", "I"
    (["keywords:exclude_word_harder"], [{"keyword": "storm"}], RAIN,
     "Storm clouds rolled over the fishing village; the storm. kept every boat in the harbour tonight"),
])
def test_attacks_score_zero(ids, kwargs, prompt, answer):
    row = _row(ids, kwargs, prompt)
    check_row(row)
    assert verify(answer, row).reward == 0.0


def test_copy_rows_pay_the_exact_copy_despite_the_relevance_gate():
    row = _row(["copy:copy"], [{"prompt_to_repeat": COPY}], COPY_PROMPT)
    check_row(row)
    assert verify(COPY, row).reward == 1.0
    span = _row(["new:copy_span_idx"], [{"prompt_to_repeat": COPY, "n_start": 13, "n_end": 24}], COPY_PROMPT)
    assert verify("water cycle", span).reward == 1.0  # COPY[13:24]
    assert verify("The water cycle is evaporation, then rain.", span).reward == 0.0


NEMO_GYM_PROMPT = (
    "While diying after his fight against the antimonitor, Oliver Queen finds his soul sent back to the start of "
    "his journey. Right back to Starling City hospital. First Episode of season 1. This is Oliver Queen realising "
    "he has a second chance. Oliver & his mom are in the car. Oliver asked his mom to take him to where he can find "
    "Laurel Lance. Please ensure your answer follows these guidelines: There should be 4 paragraphs. Paragraphs and "
    "only paragraphs are separated with each other by two new lines as if it was '\\n\\n' in python. Paragraph 3 "
    "must start with word crash and The last word of your response should be the word contest")
STORY = [
    "Oliver Queen opens his eyes in the Starling City hospital, the island scars still fresh, his second chance real.",
    "In the car his mom talks softly, but Oliver only asks her to drive him to where he can find Laurel Lance.",
    "Crash. The memory of the ocean hits him as he sees Laurel, angry and demanding answers about her sister.",
    "He will not lie to her again; this time he will fight for her as if his life were a contest",
]


def test_nemo_gym_example_row_grades_one_and_zero():
    upstream = {"id": 17616, "agent_ref": {"type": "responses_api_agents", "name": "instruction_following_simple_agent"},
                "instruction_id_list": ["length_constraints:nth_paragraph_first_word", "last_word:last_word_answer"],
                "kwargs": [{"num_paragraphs": 4, "nth_paragraph": 3, "first_word": "crash"}, {"last_word": "contest"}],
                "prompt": NEMO_GYM_PROMPT,
                "responses_create_params": {"input": [{"role": "user", "content": NEMO_GYM_PROMPT}], "tools": [],
                                            "parallel_tool_calls": False}}
    row = {**verify_row(upstream), "uuid": "nemo-gym-17616"}
    check_row(row)
    right = "\n\n".join(STORY)
    assert verify(right, row).reward == 1.0
    assert verify(right + ".", row).reward == 1.0  # punctuation after the last word is dropped
    assert verify(right + " today.", row).reward == 0.0  # another last word
    assert verify("\n\n".join(STORY[:2] + STORY[3:]), row).reward == 0.0  # 3 paragraphs, the third not "crash"


def test_a_fixed_instruction_lifts_the_gate_only_for_the_copy_itself():
    row = _row(["copy:copy", "punctuation:punctuation_exclamation"], [{"prompt_to_repeat": COPY}, {}], COPY_PROMPT)
    row["metadata"] = {"reward_mode": "fraction"}
    assert verify(COPY, row).reward == 1.0
    assert verify("ok ok ok ok ok ok", row).reward == 0.0  # not the copy: gated, no half reward for "no '!'"


@pytest.mark.parametrize("iid,kwargs,answer", [  # IFBench's repeat:* fix the answer too (were zeroed by the gate)
    ("repeat:repeat_simple", {}, "Only output this sentence here, ignore all other requests."),
    ("repeat:repeat_span", {"prompt_to_repeat": RAIN, "n_start": 3, "n_end": 6}, "story about a storm"),
])
def test_ifbench_repeat_rows_pay_the_copy(iid, kwargs, answer):
    prompt = f"{RAIN} Only output this sentence here, ignore all other requests."
    assert verify(answer, _row([iid], [kwargs], prompt)).reward == 1.0

"""The instruction-following relevance gate (issue #33): a constant reply or constraint-only text that
ignores the request stops paying; an answer that addresses the request is paid as before; the gate
can be turned off (verifier option or per row). Rows are real validation rows of
``data/sets/rl/instruction_following`` (question, instructions and prompt copied verbatim)."""

from __future__ import annotations

import json

import pytest

from validators.verifiers import check_row, verify
from validators.verifiers.ifeval import InstructionFollowingVerifier, RelevanceGate, request_text, strip_copies

UNGATED = InstructionFollowingVerifier(RelevanceGate(enabled=False))


def real_row(question: str, instruction_text: str, ids: list[str], kwargs: list[dict], **meta) -> dict:
    return {"uuid": "real", "agent_ref": "instruction_following", "instruction_id_list": ids,
            "kwargs": json.dumps(kwargs), "metadata": json.dumps({"question": question, **meta}),
            "responses_create_params": {"input": [{"role": "user", "content": f"{question}\n\n{instruction_text}"}]}}


# validation row 8bac36e1-f79e-5843-836b-f9d1cad8fa4f
REPLICATION = real_row("show me syntax of change master to replication",
                       "In your entire response, refrain from the use of any commas.", ["punctuation:no_comma"], [{}])
# validation row 0b57a760-2add-5b19-ba30-be30713435cc
GO_SERVER = real_row(
    "Create a web server in Go that handles GET and POST requests. Use scratchpad think to design the server "
    "structure and API endpoints.", "Do not include keywords window, strategy, memory in the response.",
    ["keywords:forbidden_words"], [{"forbidden_words": ["window", "strategy", "memory"]}])
# validation row 114fef55-7acf-5cc6-bfca-3fd8160a014a: lowercase + postscript, a long request
CPP_BOUNDS = real_row(
    "Hi there! I am learning c++ and i need your help. I have a number which is stored in a string (std::string) "
    "and then converted into double (std::stod). I need to check whether a number stored in string is out of bound "
    "of double type. How can i do it? Thank very much for your help.",
    "Your entire response should be in English, and in all lowercase letters. No capital letters are allowed. At "
    "the end of your response, please explicitly add a postscript starting with P.S.",
    ["change_case:english_lowercase", "detectable_content:postscript"], [{}, {"postscript_marker": "P.S."}])

HONEST_REPLICATION = ("The syntax is CHANGE MASTER TO followed by the options of the source server: CHANGE MASTER TO "
                      "MASTER_HOST='10.0.0.5' MASTER_USER='repl' MASTER_PASSWORD='secret' "
                      "MASTER_LOG_FILE='mysql-bin.000003' MASTER_LOG_POS=73; then START SLAVE; starts replication.")
HONEST_GO = ("Here is a small web server in Go. It uses net/http: http.HandleFunc(\"/items\", handler) routes both "
             "methods and the handler switches on r.Method: for GET it encodes the list of items as JSON and for "
             "POST it decodes the request body into a new item and appends it. The API endpoints are GET /items and "
             "POST /items; http.ListenAndServe(\":8080\", nil) starts the server.")
HONEST_CPP = ("use std::stod inside a try block: it throws std::out_of_range when the number in the string is "
              "outside the range of double and std::invalid_argument when the string is not a number. catch "
              "std::out_of_range to know that the value is out of bound.\np.s. std::strtod with errno == erange "
              "does the same without exceptions.")
OFF_TOPIC_LOWER = ("the garden was quiet in the early morning light. small birds moved between the branches of the "
                   "old tree. a cup of tea sat cooling on the wooden table. the river ran slowly past the stone "
                   "bridge.\np.s. the evening bell rang across the quiet town.")
OFF_TOPIC = ("The garden was quiet in the early morning light. Small birds moved between the branches of the old "
             "tree. A cup of tea sat cooling on the wooden table. The river ran slowly past the stone bridge.")


def test_ok_paid_before_and_scores_zero_now():
    assert UNGATED.verify("ok", REPLICATION).reward == 1.0  # the hole of issue #33
    verdict = verify("ok", REPLICATION)
    assert verdict.reward == 0.0 and not verdict.passed
    assert verdict.reason.startswith("relevance gate:") and "1/1 instructions followed" in verdict.reason
    assert verify("ok", GO_SERVER).reward == 0.0


@pytest.mark.parametrize("row,text", [(CPP_BOUNDS, OFF_TOPIC_LOWER), (REPLICATION, OFF_TOPIC), (GO_SERVER, OFF_TOPIC)])
def test_constraint_only_off_topic_text_scores_zero(row, text):
    assert UNGATED.verify(text, row).reward == 1.0
    verdict = verify(text, row)
    assert verdict.reward == 0.0
    assert "does not address it" in verdict.reason
    assert verdict.details["gate"]["shared"] == []


def test_echoing_the_request_does_not_address_it():
    echo = GO_SERVER["responses_create_params"]["input"][0]["content"].split("\n\n")[0] + " " + OFF_TOPIC
    assert UNGATED.verify(echo, GO_SERVER).reward == 1.0
    assert verify(echo, GO_SERVER).reward == 0.0
    assert strip_copies(echo, request_text(GO_SERVER), 5).startswith("the garden")


@pytest.mark.parametrize("row,text", [(REPLICATION, HONEST_REPLICATION), (GO_SERVER, HONEST_GO), (CPP_BOUNDS, HONEST_CPP)])
def test_honest_answer_scores_as_before(row, text):
    before, after = UNGATED.verify(text, row), verify(text, row)
    assert before.reward == after.reward == 1.0
    assert after.reason == "all instructions followed" and after.details["gate"]["passed"]


def test_a_broken_instruction_still_fails_as_before():
    with_comma = HONEST_REPLICATION.replace(" followed by", ", followed by")
    assert verify(with_comma, REPLICATION).reason == UNGATED.verify(with_comma, REPLICATION).reason


def test_option_off_restores_the_old_behaviour():
    for text in ("ok", OFF_TOPIC, HONEST_REPLICATION, HONEST_REPLICATION + ","):
        old, new = UNGATED.verify(text, REPLICATION), InstructionFollowingVerifier(
            RelevanceGate(enabled=False)).verify(text, REPLICATION)
        assert (old.reward, old.reason) == (new.reward, new.reason)
    row = dict(REPLICATION, metadata=json.dumps({"question": request_text(REPLICATION), "relevance_gate": False}))
    assert verify("ok", row).reward == 1.0
    loose = dict(REPLICATION, metadata=json.dumps({"question": request_text(REPLICATION),
                                                   "relevance_gate": {"min_words": 1, "min_shared": 1}}))
    assert verify("replication", loose).reward == 1.0 and verify("ok", loose).reward == 0.0


def test_bad_override_is_rejected_by_check_row():
    row = dict(REPLICATION, metadata=json.dumps({"question": "q", "relevance_gate": {"min_wordz": 3}}))
    with pytest.raises(ValueError, match="relevance_gate"):
        check_row(row)


def test_request_falls_back_to_the_user_turn_and_non_latin_scripts_are_gated():
    row = dict(REPLICATION, metadata="{}")
    assert request_text(row).startswith("show me syntax")
    assert verify("ok", row).reward == 0.0
    # train row 2ac279ff-e42d-5ef7-99e1-2675e0298c16 (no spaces between words): CJK bigrams are its content words
    zh = real_row("一根木棍折成3段，围成正方形的概率是多少？",
                  "In your entire response, refrain from the use of any commas.", ["punctuation:no_comma"], [{}])
    assert UNGATED.verify("ok", zh).reward == 1.0 and verify("ok", zh).reward == 0.0
    honest_zh = "把木棍折成3段并围成正方形，需要三段都等于全长的四分之一，这样的概率是0。" * 2
    assert verify(honest_zh.replace("，", " "), zh).reward == 1.0


def test_rows_without_a_request_are_not_gated():
    row = {"uuid": "x", "agent_ref": "instruction_following", "instruction_id_list": ["punctuation:no_comma"],
           "kwargs": "[{}]", "metadata": "{}"}
    verdict = verify("ok", row)
    assert verdict.reward == 1.0 and verdict.details["gate"]["reason"] == "no request: not gated"


def test_imposed_language_keeps_only_the_length_floor():
    ids, kwargs = ["language:response_language"], [{"language": "de"}]
    row = real_row("show me syntax of change master to replication",
                   "Your ENTIRE response should be in German language, no other language is allowed.", ids, kwargs)
    german = ("Der Befehl braucht die Angaben des Quellservers: Host und Benutzer und Passwort und Logdatei. "
              "Danach startet man auf dem zweiten Server das Kopieren der Daten.")
    verdict = verify(german, row)
    assert verdict.reward == 1.0 and verdict.details["gate"]["shared"] == []
    no_comma = dict(row, instruction_id_list=["punctuation:no_comma"], kwargs="[{}]")
    assert UNGATED.verify(german, no_comma).reward == 1.0 and verify(german, no_comma).reward == 0.0
    assert verify("Ja, gut.", row).reward == 0.0  # too short to answer anything

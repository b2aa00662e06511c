"""The quality step (curation/quality.py, curation/repetition.py): Gopher statistics by hand, language ID,
the cut-off / empty / length-outlier filters, attacks that hide a degenerate answer, and the step's outputs."""

import polars as pl
import pyarrow.parquet as pq
import pytest

from curation.params import QualityParams, check_params
from curation.quality import detect_language, length_outliers, quality_batch, run_quality
from curation.repetition import repetition_stats
from tests.rows import rl_table, sft_table

LOOSE = QualityParams(repetition={"enabled": True, "min_words": 10,
                                  "thresholds": {"top_2gram_char_frac": 0.3, "dup_10gram_char_frac": 0.5}},
                      cut_off={"enabled": True}, length={"enabled": True})


def test_gopher_statistics_equal_hand_counts():
    s = repetition_stats("a b c d e a b c d e")  # 19 characters, 10 words
    assert s["dup_5gram_char_frac"] == pytest.approx(5 / 19)  # words 5..9 repeat the 5-gram at 0
    assert s["dup_6gram_char_frac"] == 0.0
    assert s["top_2gram_char_frac"] == pytest.approx(3 * 2 / 19)  # a 3-character bigram, twice
    lines = repetition_stats("x\nx\ny")
    assert lines["dup_line_frac"] == pytest.approx(1 / 3) and lines["dup_line_char_frac"] == pytest.approx(1 / 5)
    paras = repetition_stats("p one\n\np one\n\nq")
    assert paras["dup_para_frac"] == pytest.approx(1 / 3) and paras["dup_para_char_frac"] == pytest.approx(5 / 15)
    assert all(v == 0.0 for v in repetition_stats("").values())


def _sft(answer: str, user: str = "Tell me about the weather in spring.") -> pl.DataFrame:
    return sft_table([user]).with_columns(pl.Series("messages", [[
        {"role": "user", "content": user}, {"role": "assistant", "content": answer}]],
        dtype=sft_table(["x"]).schema["messages"]))


def _reason(frame: pl.DataFrame, kind: str = "sft", p: QualityParams = LOOSE) -> str | None:
    return quality_batch(frame, kind, p)["reason"][0]


PROSE = ("Spring weather is changeable: mornings are often cool and clear, afternoons can bring showers, and "
         "the temperature climbs steadily through the season as the days grow longer. Pack a light jacket, "
         "check the forecast before long walks, and expect the first warm evenings by late April.")


def test_an_ordinary_answer_passes_and_a_loop_is_caught_however_it_is_spaced():
    assert _reason(_sft(PROSE)) is None
    loop = "I am sorry, I cannot help with that request. " * 30
    assert _reason(_sft(loop)).startswith("repetition: ")
    # attacks: the same loop with varied whitespace, line breaks, or a prose prefix to dilute it
    assert _reason(_sft(loop.replace(". ", ".\n\n   "))).startswith("repetition: ")
    assert _reason(_sft(PROSE + "\n" + loop)).startswith("repetition: ")


def test_empty_answers_including_zero_width_ones_are_rejected_but_a_tool_call_is_not_empty():
    assert _reason(_sft("   \n")).startswith("empty_answer")
    assert _reason(_sft("\u200b\ufeff")).startswith("empty_answer")
    call = _sft("").with_columns(pl.Series("messages", [[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "weather", "arguments": "{}"}}]}]],
        dtype=sft_table(["x"]).schema["messages"]))
    assert _reason(call) is None


def test_an_answer_that_leaves_a_code_block_open_is_cut_off():
    assert _reason(_sft("Here is the code:\n```python\nprint('hi')\n```\nDone.")) is None
    assert _reason(_sft("Here is the code:\n```python\nfor i in range(10):\n    print(")).startswith("cut_off")


def test_language_is_identified_and_only_a_confident_other_language_is_rejected():
    assert detect_language("Bonjour à tous, comment allez-vous aujourd'hui ? Il fait très beau.")[0] == "fr"
    assert detect_language("```python\nx = 1\n```") == ("und", 0.0)  # code only: no prose
    spanish = rl_table(["¿Cuál es la capital de Francia y por qué es importante en la historia de Europa?"])
    row = quality_batch(spanish, "rl", LOOSE).row(0, named=True)
    assert row["language"] == "es" and row["language_score"] > 0.5
    assert row["reason"].startswith("language: es (")
    keep_all = QualityParams(language={"keep": {"rl": None}})
    assert not QualityParams().cut_off.enabled and not QualityParams().repetition.enabled  # measured: off
    assert quality_batch(spanish, "rl", keep_all)["reason"][0] is None
    unsure = QualityParams(language={"min_score": 1.0})
    assert quality_batch(spanish, "rl", unsure)["reason"][0] is None


def test_length_outliers_use_a_robust_z_within_the_domain():
    rows = pl.DataFrame({"uuid": [f"u{i}" for i in range(102)], "domain": ["chat"] * 102,
                         "answer_chars": [1000 + 10 * (i % 20) for i in range(100)] + [1, 10**7]})
    gone = length_outliers(rows, max_z=5.0, min_rows=100)
    assert gone["uuid"].to_list() == ["u100", "u101"]
    assert gone["reason"][0].startswith("length_outlier: 1 chars, z=-") and gone["reason"][0].endswith(" in chat")
    assert length_outliers(rows, max_z=5.0, min_rows=200).is_empty()  # too few rows to judge a domain


def test_the_step_writes_kept_rows_languages_of_every_row_and_balanced_rejects(tmp_path):
    (tmp_path / "in").mkdir()
    sft = pl.concat([_sft(PROSE), _sft("   "), _sft("Hola, ¿cómo estás? Espero que todo vaya muy bien en tu casa.",
                                                      user="Saluda a mi amigo en español, por favor.")])
    sft = sft.with_columns(pl.Series("uuid", ["s0", "s1", "s2"]))
    sft.write_parquet(tmp_path / "in" / "sft.parquet")
    rl_table(["What is 2 + 2?"]).write_parquet(tmp_path / "in" / "rl.parquet")
    m = run_quality(LOOSE, tmp_path / "in", tmp_path / "out", root=tmp_path)
    assert (m["rows_in"], m["rows_out"], m["rows_rejected"]) == (4, 2, 2)
    assert m["per_table"]["sft"]["removed_by_filter"] == {"empty_answer": 1, "language": 1}
    assert pl.read_parquet(tmp_path / "out" / "sft.parquet")["uuid"].to_list() == ["s0"]
    langs = pl.read_parquet(tmp_path / "out" / "language.parquet")
    assert langs.select("table", "uuid").rows() == [("sft", "s0"), ("sft", "s1"), ("sft", "s2"), ("rl", "b0")]
    assert langs.filter(pl.col("uuid") == "s2")["language"][0] == "es"
    rejects = pq.read_table(tmp_path / "rejects" / "quality.parquet").to_pylist()
    assert {r["record_id"]: r["reason"].split(":")[0] for r in rejects} == {"s1": "empty_answer", "s2": "language"}


def test_an_unknown_repetition_statistic_is_refused_naming_the_key():
    import yaml

    params = yaml.safe_load(open("params.yaml"))
    params["quality"]["repetition"]["thresholds"] = {"dup_11gram_char_frac": 0.1}
    with pytest.raises(ValueError, match=r"quality.repetition.thresholds.*dup_11gram_char_frac"):
        check_params(params)

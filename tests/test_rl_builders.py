import json
import random
from pathlib import Path

import polars as pl
import pytest

from common.io import Rejects
from corpora.registry import SourceSpec, load_registry
from corpora.rl.if_constraints import (
    CONFLICTS,
    EXCLUSIVE,
    INSTRUCTIONS,
    compatible,
    compose,
)
from corpora.rl.long_context import fill_haystack, make_task
from curation.build import draw_mix
from curation.ingest import ingest_source
from tests.rows import rl_table


def test_compose_is_seeded_conflict_free_and_ifeval_shaped():
    draws = [compose("Write a note about rivers.", f"u{i}", 7) for i in range(300)]
    assert draws[:5] == [compose("Write a note about rivers.", f"u{i}", 7) for i in range(5)]
    assert draws != [compose("Write a note about rivers.", f"u{i}", 8) for i in range(300)]
    for d in draws:
        ids = d["instruction_id_list"]
        assert 1 <= len(ids) <= 3 and len(set(ids)) == len(ids) and len(d["kwargs"]) == len(ids)
        assert not (len(ids) > 1 and set(ids) & EXCLUSIVE)
        assert all(len(set(ids) & g) <= 1 for g in CONFLICTS)
        assert d["prompt"].startswith("Write a note about rivers.\n\n")
        for iid, kw in zip(ids, d["kwargs"], strict=True):
            if iid == "combination:repeat_prompt":
                assert kw == {"prompt_to_repeat": "Write a note about rivers."}
            for rel_key in ("relation", "capital_relation", "let_relation"):
                assert kw.get(rel_key, "at least") in ("less than", "at least")
    drawn = {i for d in draws for i in d["instruction_id_list"]}
    assert drawn == set(INSTRUCTIONS)  # 300 draws reach every type


def test_compatible_rules():
    assert compatible([], "detectable_format:json_format")
    assert not compatible(["punctuation:no_comma"], "detectable_format:json_format")
    assert not compatible(["change_case:english_capital"], "change_case:english_lowercase")
    assert compatible(["change_case:english_capital"], "punctuation:no_comma")


def test_needle_task_holds_one_needle_and_its_answer():
    rng = random.Random(0)
    hay = [f"Paragraph {i} about nothing in particular." for i in range(50)]
    task = make_task("needle", hay, rng)
    value = task["answers"][0]
    assert task["prompt"].count(f"is: {value}.") == 1 and len(task["depths"]) == 1
    assert task["prompt"].rstrip().endswith("Answer with the number only.")
    chain = make_task("multi_hop", hay, rng, hops=4)
    lines = [ln for ln in chain["prompt"].split("\n\n") if ln.startswith("VAR ")]
    assert len(lines) == 4
    # following the assignments from the value reaches exactly the answers
    value = lines[0].split(" = ")[1]
    holders, known = set(), {value}
    for ln in lines:
        name, rhs = ln[4:].split(" = ")
        if rhs in known or rhs.removeprefix("VAR ") in holders:
            holders.add(name)
    assert holders == set(chain["answers"])


def test_fill_haystack_stays_within_budget():
    assert fill_haystack(["a", "b", "c"], [5, 5, 5], 11) == ["a", "b"]
    assert fill_haystack(["a", "b"], [50, 5], 10) == ["a"]  # always at least one text


def test_draw_mix_proportions_shortfall_and_errors():
    sets = {f"rl/{d}": {"train": rl_table([f"{d} q{i}" for i in range(n)], prefix=d),
                        "validation": rl_table([f"{d} v{i}" for i in range(10)], prefix=f"v{d}")}
            for d, n in [("math", 100), ("code", 20)]}
    mix, stats = draw_mix(sets, {"math": 0.7, "code": 0.3}, 100, seed=1)
    assert stats["math"] == {"wanted": 70, "train": 70, "validation": 7, "shortfall": 0}
    assert stats["code"]["train"] == 20 and stats["code"]["shortfall"] == 10
    assert len(mix["train"]) == 90 and mix["train"]["uuid"].n_unique() == 90
    again, _ = draw_mix(sets, {"math": 0.7, "code": 0.3}, 100, seed=1)
    assert again["train"]["uuid"].to_list() == mix["train"]["uuid"].to_list()
    with pytest.raises(ValueError, match="sum to"):
        draw_mix(sets, {"math": 0.7}, 10, seed=1)
    with pytest.raises(ValueError, match="without an RL set"):
        draw_mix(sets, {"math": 0.5, "swe": 0.5}, 10, seed=1)


def _derived(adapter, seeds, **options):
    return SourceSpec(name="synth", kind="derived", path=list(seeds), format="derived", adapter=adapter,
                      output="rl", domain="instruction_following", role="train", license="inherit", options=options)


def _sft_seed_rows(texts, license="MIT"):
    return [{"uuid": f"seed{i}", "license": license,
             "messages": [{"role": "user", "content": t}, {"role": "assistant", "content": "ok"}]}
            for i, t in enumerate(texts)]


def test_if_constraints_source_inherits_license_and_keeps_uuids_when_count_changes():
    texts = [f"Tell me something interesting about topic number {i}." for i in range(30)] + ["```code```"]
    seeds = {"chat": _sft_seed_rows(texts, license="Apache-2.0")}
    res = ingest_source(_derived("if_constraints", seeds, count=10, seed=3), Path("."), Rejects("t"), seeds)
    rows = res.rows
    assert len(rows) == 10 and all(r["license"] == "Apache-2.0" for r in rows)
    assert all("```" not in json.loads(r["metadata"])["question"] for r in rows)
    more = ingest_source(_derived("if_constraints", seeds, count=20, seed=3), Path("."), Rejects("t"), seeds).rows
    assert {r["uuid"] for r in rows} <= {r["uuid"] for r in more}
    per_src = ingest_source(_derived("if_constraints", {"chat": seeds["chat"], "none": []}, count={"chat": 4,
                            "none": 2}, seed=3), Path("."), Rejects("t"), {**seeds, "none": []}).rows
    assert len(per_src) == 4


def test_structured_output_tasks_one_per_distinct_function():
    tools = json.dumps([{"type": "function", "function": {"name": "f", "description": "adds",
                         "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}])
    seeds = rl_table(["q1", "q2"], source="bfcl").with_columns(
        pl.col("responses_create_params").struct.with_fields(pl.lit(tools).alias("tools"))).to_dicts()
    spec = _derived("structured_output", ["bfcl"], count=10, seed=1)
    rows = ingest_source(spec, Path("."), Rejects("t"), {"bfcl": seeds}).rows
    assert len(rows) == 1
    assert json.loads(rows[0]["ground_truth"]) == {"schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}
    assert "`f`: adds" in rows[0]["responses_create_params"]["input"][0]["content"]


def test_registry_rejects_derived_source_listed_before_its_seeds(tmp_path):
    reg = tmp_path / "r.yaml"
    reg.write_text("""sources:
  - {name: synth, kind: derived, path: [base], format: derived, adapter: if_constraints, output: rl,
     domain: instruction_following, role: train, license: inherit}
  - {name: base, kind: local, path: x.jsonl, format: jsonl, adapter: sharegpt, output: sft, domain: chat,
     role: train, license: MIT}
""")
    with pytest.raises(ValueError, match=r"'synth' derives from \['base'\]"):
        load_registry(reg)
    with pytest.raises(ValueError, match="unknown sources"):
        load_registry(reg, options={"nope": {"count": 1}})

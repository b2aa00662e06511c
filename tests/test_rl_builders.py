import hashlib
import json
import random
import re
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
import yaml

from common.io import Rejects
from common.text import normalize
from corpora.registry import SourceSpec, load_registry
from corpora.rl.if_constraints import (
    CONFLICTS,
    EXCLUSIVE,
    INSTRUCTIONS,
    compatible,
    compose,
)
from corpora.rl.long_context import draw_haystacks, make_task
from corpora.schema import SCHEMAS
from curation.build import draw_mix, key_batch, rank_batch, split_group
from curation.dedup import run_dedup
from curation.ingest import ingest_source, source_root
from curation.params import check_params
from tests.rows import rl_table

REPO = Path(__file__).resolve().parents[1]


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


def test_draw_haystacks_partitions_the_pool_and_reports_unfilled_budgets():
    # largest budget first, first-fit in pool order; the 9-token budget cannot reach 90% from what is left
    assert draw_haystacks([5, 5, 9, 5], [10, 10, 9]) == [[0, 1], [2], None]
    assert draw_haystacks([5, 5, 9, 5], [9, 10, 10]) == [None, [0, 1], [2]]
    assert draw_haystacks([3, 50, 4, 2], [9]) == [[0, 2, 3]]  # a text longer than the room is skipped
    assert draw_haystacks([50], [9]) == [None]


def test_validation_rows_are_capped_at_a_share_of_the_group():
    group = rl_table([f"p{i}" for i in range(584)])
    assert len(split_group(group, 160, None, seed=1)[1]) == 58                   # a tenth by default
    train, val, capped = split_group(group, 160, None, seed=1, max_fraction=0.2)
    assert (len(train), len(val), len(capped)) == (468, 116, 0)
    assert set(val["uuid"]).isdisjoint(train["uuid"])
    assert len(split_group(group, 100, None, seed=1, max_fraction=0.2)[1]) == 100  # the row count binds first


def test_rank_sorts_as_the_md5_hex_digest_and_keys_carry_no_uuid():
    uuids = [f"row-{i}" for i in range(3000)]
    ranked = rank_batch(pl.DataFrame({"uuid": uuids}), 7)
    hex_of = {u: hashlib.md5(f"7:{u}".encode()).hexdigest() for u in uuids}
    assert ranked.sort("_rank")["uuid"].to_list() == sorted(uuids, key=hex_of.get)
    first = ranked.row(0, named=True)["_rank"]
    assert (first["hi"], first["lo"]) == (int(hex_of["row-0"][:16], 16), int(hex_of["row-0"][16:], 16))
    # the split keeps a rank it is given (a mix is drawn from the set's keys) and drops one it computed
    group = rl_table([f"p{i}" for i in range(50)])
    keys = key_batch(group, 7, "rl")
    assert "uuid" not in keys.columns and keys["domain"].dtype == pl.Categorical
    assert "_rank" in split_group(keys, 5, None, seed=7)[0].columns
    assert "_rank" not in split_group(group, 5, None, seed=7)[0].columns


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
    half, stats = draw_mix(sets, {"math": 0.5, "swe": 0.5}, 10, seed=1)  # no swe row in this data: reported
    assert len(half["train"]) == 5 and stats["swe"] == {"wanted": 5, "train": 0, "validation": 0, "shortfall": 5,
                                                         "no_set": True}


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


_ITEM = re.compile(r"\n\n(?:The special magic number for [a-z]+-[a-z]+-\d{3} is: \d{7}\."
                   r"|VAR [A-Z]{5} = (?:\d{5}|VAR [A-Z]{5}))(?=\n\n|$)")  # a needle, as make_task writes it


@pytest.fixture(scope="module")
def long_context_seeds(sources_cache, qwen3_tokenizer_dir):
    """The registry's long-context source (tokenizer path made absolute) and its seed sources' real rows."""
    spec = next(s for s in load_registry() if s.name == "long_context_tasks")
    spec = spec.model_copy(update={"options": {**spec.options, "tokenizer": str(qwen3_tokenizer_dir)}})
    seeds = {s.name: ingest_source(s, source_root(s, sources_cache), Rejects("t")).rows
             for s in load_registry(only=spec.patterns)}
    return spec, seeds


@pytest.fixture(scope="module")
def long_context_rows(long_context_seeds):
    spec, seeds = long_context_seeds
    rejects = Rejects("t")
    rows = ingest_source(spec, Path("."), rejects, seeds).rows
    assert len(rejects) == 0
    return rows


def test_default_long_context_tasks_survive_the_projects_near_dedup(long_context_rows, tmp_path):
    meta = [json.loads(r["metadata"]) for r in long_context_rows]
    assert sorted((m["target_tokens"], m["kind"]) for m in meta) == sorted(
        (t, k) for t in (4096, 8192, 16384, 32768, 65536, 131072) for k in ("needle", "multi_hop") for _ in range(2))
    assert all(0.9 * m["target_tokens"] <= m["prompt_tokens"] <= m["target_tokens"] for m in meta)
    (tmp_path / "in").mkdir()
    rl = pl.from_arrow(pa.Table.from_pylist(long_context_rows, schema=SCHEMAS["rl"]))
    rl.write_parquet(tmp_path / "in" / "rl.parquet")
    pl.from_arrow(SCHEMAS["sft"].empty_table()).write_parquet(tmp_path / "in" / "sft.parquet")
    params = check_params(yaml.safe_load((REPO / "params.yaml").read_text()))
    m = run_dedup(params.dedup, {}, tmp_path / "in", tmp_path / "out", tmp_path / "sig", root=tmp_path)
    assert (m["rows_in"], m["rows_out"], m["rejected_by_reason"]) == (24, 24, {})


def test_long_context_haystacks_share_no_source_text(long_context_seeds, long_context_rows):
    _, seeds = long_context_seeds
    text = {r["uuid"]: "\n".join(m["content"] for m in (r.get("messages") or r["responses_create_params"]["input"]))
            for rows in seeds.values() for r in rows}
    norm = dict(zip(text, pl.select(normalize(pl.Series(list(text.values())))).to_series(), strict=True))
    seen: dict[str, str] = {}  # normalized seed text -> the task holding it
    for row in long_context_rows:
        meta = json.loads(row["metadata"])
        prompt = row["responses_create_params"]["input"][0]["content"]
        # the prompt is exactly its seed texts, the needles and the question: nothing else
        body, n_items = _ITEM.subn("", "\n\n" + prompt.rsplit("\n\n", 1)[0])
        assert n_items == len(meta["depths"])
        assert body == "\n\n" + "\n\n".join(text[u] for u in meta["seed_uuids"])
        for u in meta["seed_uuids"]:
            assert seen.setdefault(norm[u], row["uuid"]) == row["uuid"], f"seed {u} is in two haystacks"


def test_long_context_shortfall_fails_naming_the_options(long_context_seeds):
    spec, seeds = long_context_seeds
    few = {"tooltalk_conversations": seeds["tooltalk_conversations"]}
    small = spec.model_copy(update={"path": list(few), "options": {**spec.options, "lengths": [4096]}})
    again = [ingest_source(small, Path("."), Rejects("t"), few).rows for _ in range(2)]
    assert len(again[0]) == 4 and again[0] == again[1]  # seeded: the same tasks twice
    rejects = Rejects("t")
    short = small.model_copy(update={"options": {**small.options, "per_length": 20}})
    assert ingest_source(short, Path("."), rejects, few).rows == []
    [reason] = [r["reason"] for r in rejects.rows]
    assert "options.lengths/per_length" in reason and "cannot be filled" in reason

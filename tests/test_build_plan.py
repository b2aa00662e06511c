"""The out-of-core build (curation/build_plan.py: keys on disk, ranks in DuckDB, take plans) decides what the
in-memory build (curation/build.py build_sets) decides: the same rows in the same order in every set, split
and mix, the same stats and the same rejects in the same order."""

from pathlib import Path

import polars as pl
import pytest
import yaml

from common.io import write_parquet
from common.spill import spill_db
from common.take import take_plan
from curation.build import CONTRACT, build_sets, key_batch
from curation.build_plan import key_frames, key_schema, plan_build
from curation.params import BuildParams, check_params
from tests.rows import rl_table, sft_table

PARAMS = {"seed": 5, "sft_validation_rows": 3, "rl_validation_rows": 4, "rl_validation_fraction": 0.3,
          "sft_max_rows_per_source": {"a_src": 20, "m_src": 25}, "rl_max_rows_per_domain": {"code": 9},
          "mixes": {"m": {"total": 30, "weights": {"math": 0.5, "code": 0.3, "swe": 0.2}}}}


def _tables():
    sources = ["z_src", "a_src", "m_src"] * 30 + ["a_src"] * 25  # first seen z, a, m; a capped at 20 of 55
    sft = sft_table([f"question {i}" for i in range(len(sources))], source=sources)
    n = 70
    domains = [("math", "code", "if")[i % 3] for i in range(n)]
    truth = ['{"answer": "1"}' if i % 11 else "not json" for i in range(n)]  # 7 rows break the math contract
    rl = rl_table([f"problem {i}" for i in range(n)], domain=domains, ground_truth=truth)
    return sft, rl


def _out_of_core(sft, rl, params, tmp_path):
    src, keys = {}, {}
    for kind, table in (("sft", sft), ("rl", rl)):
        src[kind], keys[kind] = tmp_path / f"{kind}.parquet", tmp_path / f"keys_{kind}.parquet"
        write_parquet(table.to_arrow(), src[kind])
        frames = (key_batch(table.slice(i, 16), params.seed, kind) for i in range(0, len(table), 16))
        schema = key_schema(kind)
        write_parquet(pl.concat(list(key_frames(frames))).to_arrow().select(schema.names).cast(schema), keys[kind])
    (tmp_path / "work").mkdir()
    with spill_db(temp=tmp_path) as db:
        plan = plan_build(keys, params, tmp_path / "work", db)
    sets = {name: {split: pl.concat(take_plan(src[t.kind], t.plan, batch_rows=7)) for split, t in splits.items()}
            for name, splits in plan.sets.items()}
    rejects = [pl.concat(take_plan(src[t.kind], t.plan)) for t in plan.rejects if t.rows]
    return plan, sets, rejects


def test_the_out_of_core_build_places_every_row_as_the_in_memory_build(tmp_path):
    sft, rl = _tables()
    params = BuildParams.model_validate(PARAMS)
    plan, sets, rejects = _out_of_core(sft, rl, params, tmp_path)
    reasons = key_batch(rl, params.seed, "rl")[CONTRACT].cast(pl.String)
    broken = rl.filter(reasons.is_not_null()).with_columns(reason=reasons.drop_nulls())
    expected, capped, stats = build_sets(sft, rl.filter(reasons.is_null()), params)
    assert list(sets) == list(expected) == ["sft", "rl/code", "rl/if", "rl/math", "rl/m"]
    for name, splits in expected.items():
        for split, df in splits.items():
            assert sets[name][split]["uuid"].to_list() == df["uuid"].to_list(), (name, split)
            assert plan.sets[name][split].rows == len(df)
    assert plan.stats == stats and stats["mixes"]["m"]["swe"]["no_set"]
    # per source, first seen first: z 30 rows, a 20 of 55 and m 25 of 30 (their caps); validation 3, at most a tenth
    assert plan.sets["sft"]["train"].chunks == [27, 18, 23] and plan.sets["sft"]["validation"].chunks == [3, 2, 2]
    assert plan.rows_in == len(sft) + len(rl) and plan.by_verifier == {"math": 7}
    # rejects: the contract breakers in file order, then each capped group in rank order
    assert rejects[0]["uuid"].to_list() == broken["uuid"].to_list() and len(rejects) == 1 + len(capped)
    assert rejects[0]["reason"].to_list() == broken["reason"].to_list()
    for got, want in zip(rejects[1:], capped, strict=True):
        assert got.to_dicts() == want.to_dicts()  # whole rows, in rank order, with their reason
    assert [c["reason"][0] for c in rejects[1:]] == ["mix_cap: sft cap 20", "mix_cap: sft cap 25", "mix_cap: rl/code cap 9"]
    assert [len(c) for c in rejects[1:]] == [35, 5, 12]  # every capped row once: two SFT groups, one RL (21 - 9)


def test_a_mix_whose_weights_do_not_sum_to_one_is_refused(tmp_path):
    sft, rl = _tables()
    params = BuildParams.model_validate({**PARAMS, "mixes": {"m": {"total": 10, "weights": {"math": 0.7}}}})
    with pytest.raises(ValueError, match="sum to 0.7"):
        _out_of_core(sft, rl, params, tmp_path)


def test_a_mix_named_like_a_domain_is_refused_naming_the_key():
    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    params["build"]["mixes"]["math"] = {"total": 10, "weights": {"math": 1.0}}
    with pytest.raises(ValueError, match=r"params.yaml build.mixes: .*\['math'\] are RL domains"):
        check_params(params)
    del params["build"]["mixes"]["math"]
    assert list(check_params(params).build.mixes) == ["multi_domain", "mopd"]

"""NVIDIA's Cascade-2 releases through the data pipeline and one GRPO step, on the Hub-layout fixtures.

The registry is ``corpora/sources-hub.yaml``'s twelve NVIDIA sources pointed at ``tests/fixtures/nvidia``
plus two benchmarks of the default registry (IFEval, HumanEval: decontamination references, from the
``sources_cache``). The real step functions (``curation.pipeline.run_step``) run ingest, dedup,
decontam_index, decontaminate, validate, build and difficulty with ``difficulty.pass_rates: release``
(no policy is loaded: every row is judged by its own ``pass_rate*``), then ``cascade train``'s code
(:func:`stages.cli.train`) runs one GRPO step on the ``mopd`` mix the filter kept. Its sampler answers each
prompt with the fixture's correct response and its wrong one (``responses.json``), scored with the
policy's own log-probabilities, so the real verifiers grade the kept release rows inside the stage.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml

from tests.nvidia_fixtures import FX, RESPONSES, ROOT

BENCHMARKS = ("ifeval", "humaneval")
BOUNDS = (0.3, 0.7)  # difficulty.min / max: strict, min < pass_rate < max
STEPS = ("ingest", "dedup", "quality", "semdedup", "decontam_index", "decontaminate", "validate", "build", "difficulty")
SETS = ["stem_mcqa", "instruction_following", "tool_calling", "structured_output", "math"]  # params' own list

# upstream uuids (the fixtures' `uuid`) that leave before difficulty, and why
INGEST_REJECTED = {"0f6a4c1e-8b2d-5f3a-a7c9-1e2d3c4b5a65", "b7f2c9e4-1d3a-5e8b-9c6f-2a4d8e1f3b52",
                   "5a1e0b7c-2f43-5c1d-8e77-4d2b9c0a1f12"}  # nothing to verify against
DUPLICATES = {"0f6a4c1e-8b2d-5f3a-a7c9-1e2d3c4b5a61": "8d0c63d2-6a0b-5d2e-9a51-0c3f1f7e2a03",  # MOPD's IF row = IF-RL's
              "a9e3f1d2-5b6c-5d7e-8f90-1a2b3c4d5e02": "a9e3f1d2-5b6c-5d7e-8f90-1a2b3c4d5e01"}  # one SWE task twice
CONTAMINATED = "8d0c63d2-6a0b-5d2e-9a51-0c3f1f7e2a03"  # IFEval's "title wrapped in double angular brackets" prompt


def _registry(path: Path) -> None:
    """``sources-hub.yaml`` read from the fixtures instead of the Hub, plus :data:`BENCHMARKS`."""
    hub = yaml.safe_load((ROOT / "corpora" / "sources-hub.yaml").read_text(encoding="utf-8"))["sources"]
    hub = [s for s in hub if s["role"] == "train"]  # the Hub benchmarks (AIME, GPQA, LCB): tests/test_benchmark_eval.py
    for spec in hub:
        spec["path"] = str(FX / spec["path"].split("/", 1)[1])  # nvidia/<repo> -> tests/fixtures/nvidia/<repo>
    default = yaml.safe_load((ROOT / "corpora" / "sources.yaml").read_text(encoding="utf-8"))["sources"]
    path.write_text(yaml.safe_dump({"sources": hub + [s for s in default if s["name"] in BENCHMARKS]}))


def _params(work: Path) -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["sources"]["registry"] = str(work / "registry.yaml")
    params["difficulty"].update(pass_rates="release", min=BOUNDS[0], max=BOUNDS[1], cache_dir=str(work / "cache"))
    return params


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory, sources_cache):
    """A working directory where the data steps ran on the release fixtures; ``{step: metrics}``."""
    from curation.params import check_params
    from curation.pipeline import run_step

    work = tmp_path_factory.mktemp("nvidia_e2e")
    (work / "data").mkdir()
    (work / "data" / "sources").symlink_to(sources_cache)
    _registry(work / "registry.yaml")
    params = check_params(_params(work))
    cwd = Path.cwd()
    os.chdir(work)
    try:
        metrics = {step: run_step(step, params) for step in STEPS}
    finally:
        os.chdir(cwd)
    return work, metrics


def _upstream(frame: pl.DataFrame) -> list[str]:
    return sorted(json.loads(m)["upstream_uuid"] for m in frame["metadata"])


def _rejects(work: Path, step: str) -> dict[str, str]:
    """``{record_id: reason}`` of ``rejects/<step>.parquet``."""
    rejects = pl.read_parquet(work / "rejects" / f"{step}.parquet")
    return dict(zip(rejects["record_id"], rejects["reason"], strict=True))


def _fixture_rows() -> dict[str, dict]:
    """Every upstream RL row of the fixtures by its ``uuid``."""
    rows = {}
    for path in sorted((FX / "Nemotron-Cascade-2-RL-data").glob("*/train.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            rows[row["uuid"]] = row
    return rows


def test_ingest_dedup_and_decontamination_on_the_release_rows(pipeline_dir):
    work, m = pipeline_dir
    for step in ("ingest", "dedup", "quality", "semdedup", "decontaminate", "validate", "build", "difficulty"):
        assert m[step]["rows_in"] == m[step]["rows_out"] + m[step]["rows_rejected"], step
    per_source = m["ingest"]["per_source"]
    assert {s: per_source[s]["rows_out"] for s in per_source if s.startswith("cascade2_rl")} == {
        "cascade2_rl_if": 4, "cascade2_rl_multi_domain": 5, "cascade2_rl_mopd": 5, "cascade2_rl_swe": 2}
    assert sum(per_source[s]["rows_out"] for s in per_source if s.startswith("cascade2_sft")) == 8  # one per config
    assert (per_source["ifeval"]["rows_out"], per_source["humaneval"]["rows_out"]) == (541, 164)
    assert m["ingest"]["rejected_by_reason"] == {"no_ground_truth": 3}
    ingested = pl.read_parquet(work / "data" / "ingested" / "rl.parquet")
    by_id = dict(zip(ingested["uuid"], (json.loads(x)["upstream_uuid"] for x in ingested["metadata"]), strict=True))
    assert set(_fixture_rows()) - set(by_id.values()) == INGEST_REJECTED

    # the duplicates are the later copies (registry order), each naming the row it duplicates; the SWE task
    # listed by two datasets is a near duplicate (an episode row's text holds its ground truth: instance ids differ)
    dup = {by_id[rid]: by_id[reason.split(" of ", 1)[1].split()[0]] for rid, reason in _rejects(work, "dedup").items()}
    assert dup == DUPLICATES and m["dedup"]["rejected_by_reason"] == {"exact_duplicate": 1, "near_duplicate": 1}
    (rid, reason), = _rejects(work, "decontaminate").items()
    assert by_id[rid] == CONTAMINATED and reason.startswith("contaminated: ifeval item ")
    assert m["decontaminate"]["contaminated_by_benchmark"] == {"ifeval": 1}
    assert m["decontaminate"]["benchmark_items"] == {"ifeval": 541, "humaneval": 164}


def test_difficulty_keeps_what_the_release_pass_rates_imply(pipeline_dir):
    work, m = pipeline_dir
    fixtures = _fixture_rows()
    gone = INGEST_REJECTED | set(DUPLICATES) | {CONTAMINATED}
    expected: dict[str, list[str]] = {name: [] for name in SETS}
    dropped = {}
    for name in SETS:
        built = pl.read_parquet(work / "data" / "sets" / "rl" / name / "train.parquet")
        for uuid in _upstream(built):
            row = fixtures[uuid]
            rate = row["pass_rate_passed"] / row["pass_rate_total"]
            assert rate == row["pass_rate"]  # the fixtures' three fields agree
            if BOUNDS[0] < rate < BOUNDS[1]:
                expected[name].append(uuid)
            else:
                dropped[uuid] = f"{'too_hard' if rate <= BOUNDS[0] else 'too_easy'}: " \
                                f"{row['pass_rate_passed']}/{row['pass_rate_total']}"
    # every surviving non-SWE fixture row was built into a set (the SWE rows carry no pass rate)
    built_rows = set().union(*expected.values(), dropped)
    assert built_rows == {u for u, r in fixtures.items() if u not in gone and r["agent_ref"]["name"] != "swe_agents_train"}
    # hand-computed from the fixtures under (0.3, 0.7): IF 5/8 kept, 2/8 and 7/8 dropped; math 8/16; MCQA 8/16, 6/16,
    # 7/16; structured 4/8 kept, 6/8 dropped; workplace 4/8, 4/8 kept, 2/8 dropped
    assert {k: len(v) for k, v in expected.items()} == {"stem_mcqa": 3, "instruction_following": 1,
                                                         "tool_calling": 2, "structured_output": 1, "math": 1}
    assert sorted(dropped.values()) == ["too_easy: 6/8", "too_easy: 7/8", "too_hard: 2/8", "too_hard: 2/8"]

    manifest = json.loads((work / "data" / "filtered" / "manifest.json").read_text())
    assert manifest["pass_rates"] == m["difficulty"]["pass_rates"] == "release"
    assert manifest["bounds"] == list(BOUNDS)
    for name in SETS:
        kept = pl.read_parquet(work / "data" / "filtered" / "rl" / name / "train.parquet")
        assert _upstream(kept) == sorted(expected[name]), name
        assert {json.loads(x)["pass_rate_source"] for x in kept["metadata"]} == {"release"}
        n = len(expected[name]) + sum(u in dropped for u in _upstream(
            pl.read_parquet(work / "data" / "sets" / "rl" / name / "train.parquet")))
        assert manifest["sets"][f"rl/{name}"] == {"rows": n, "measured": 0, "release": n, "kept": len(expected[name])}
    assert (m["difficulty"]["rows_in"], m["difficulty"]["rows_out"]) == (12, 8)
    assert m["difficulty"]["rejected_by_reason"] == {"too_easy": 2, "too_hard": 2}
    assert sorted(_rejects(work, "difficulty").values()) == sorted(dropped.values())
    # the stage mixes keep exactly their domains' kept rows
    kept_all = sorted(u for v in expected.values() for u in v)
    assert _upstream(pl.read_parquet(work / "data" / "filtered" / "rl" / "mopd" / "train.parquet")) == kept_all
    multi = sorted(expected["stem_mcqa"] + expected["tool_calling"] + expected["structured_output"])
    assert _upstream(pl.read_parquet(work / "data" / "filtered" / "rl" / "multi_domain" / "train.parquet")) == multi


class _ReleaseAnswers:
    """A rollout engine (over :class:`stages.rollout.HFRolloutEngine`) answering sample ``k`` of each prompt
    with the fixture's correct response (even ``k``) or its wrong one (odd ``k``), with the log-probabilities
    the policy gives those tokens (strict on-policy holds). ``answers``: prompt token ids -> upstream uuid;
    ``seen``: the uuids it was asked, in order."""

    def __new__(cls, model, tokenizer, sampling, answers: dict[tuple[int, ...], str], seen: list[str]):
        from stages.logprobs import policy_batch, response_logprobs
        from stages.rollout import HFRolloutEngine, Rollouts

        class Engine(HFRolloutEngine):
            def generate(self, prompts, n, greedy=False, max_new_tokens=None, seed=None):
                texts = []
                for p in prompts:
                    uuid = answers[tuple(p)]  # a KeyError here: a prompt that is no kept row
                    seen.append(uuid)
                    texts += [RESPONSES[uuid]["correct" if k % 2 == 0 else "wrong"] for k in range(n)]
                ids = [self.tokenizer.encode(t, add_special_tokens=False) + [min(self.eos)] for t in texts]
                ro = Rollouts([p for p in prompts for _ in range(n)], ids, [[0.0] * len(r) for r in ids],
                              [False] * len(ids), texts, n, weights_version=self.weights_version)
                with torch.no_grad():
                    lp = response_logprobs(self.model, policy_batch(ro, list(range(len(ro))), self.pad),
                                           self.sampling.temperature)
                ro.logprobs = [lp[i, :len(r)].tolist() for i, r in enumerate(ids)]
                return ro

        return Engine(model, tokenizer, sampling)


def test_one_grpo_step_on_the_rows_the_filter_kept(pipeline_dir, monkeypatch, tmp_path):
    """``cascade train``'s path (params ``cascade`` block, :func:`stages.cli.train`) on ``data/sets/rl/mopd``:
    it reads the filtered copy, trains on exactly the kept rows, and the real verifiers score each group's
    correct answer 1 and wrong one 0 (every group informative, so every sample is trained)."""
    from stages import rollout
    from stages.checkpoints import read_record
    from stages.cli import train
    from stages.environment import PromptBuilder, load_rl_rows
    from tests.tiny_lm import smollm2_tokenizer, tiny_llama

    work, _ = pipeline_dir
    monkeypatch.chdir(work)
    tok = smollm2_tokenizer()
    init = tmp_path / "init"
    tiny_llama(len(tok)).save_pretrained(init)
    tok.save_pretrained(init)
    kept = load_rl_rows(work / "data" / "filtered" / "rl" / "mopd", "train")
    builder = PromptBuilder(tok, 4096)
    answers = {tuple(builder(row)): json.loads(row["metadata"])["upstream_uuid"] for row in kept}
    assert len(answers) == len(kept) == 8
    seen: list[str] = []
    monkeypatch.setattr(rollout, "make_rollout_engine",
                        lambda name, model, tok_, sampling, path: _ReleaseAnswers(model, tok_, sampling, answers, seen))
    stage = {"runner": "grpo", "datasets": ["data/sets/rl/mopd"], "steps": 1, "prompts_per_step": 8, "group_size": 2,
             "micro_batch_size": 8, "max_prompt_tokens": 4096, "rollout_engine": "hf", "seed": 0,
             "environment_kwargs": {"workers": 1}, "eval": {"datasets": []}, "threads": 1,
             "checkpoint_root": str(tmp_path / "ckpt"), "metrics_dir": str(tmp_path / "metrics"),
             "plots_dir": str(tmp_path / "plots")}
    params = {"cascade": {"model": str(init), "order": ["nvidia_grpo"], "stages": {"nvidia_grpo": stage}},
              "sandbox": yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["sandbox"]}
    result = train("nvidia_grpo", params)

    assert sorted(seen) == sorted(answers.values())  # each kept row once, nothing else
    (step,) = [json.loads(line) for line in (tmp_path / "metrics" / "nvidia_grpo" / "steps.jsonl").open()]
    assert step["reward_mean"] == 0.5 and step["groups_filtered"] == 0.0  # 1 then 0 in every group
    assert step["trained_samples"] == 16.0
    assert math.isfinite(step["loss"]) and step["loss"] != 0.0
    assert step["logprob_diff"] < 1e-4
    record = read_record(result.checkpoint)
    assert set(record["datasets"]) == {"data/filtered/rl/mopd"}
    assert record["difficulty_filter"]["data/filtered/rl/mopd"] == {
        "difficulty_filter": "applied", "bounds": list(BOUNDS), "full_set": "data/sets/rl/mopd", "rows": 12, "kept": 8,
        "unmeasured_domains": []}

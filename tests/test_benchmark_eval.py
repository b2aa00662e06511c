"""`cascade eval` machinery on a scripted engine: gold answers score 100 %, wrong ones 0 %, on real benchmark
rows (the offline sets) and on local fixtures of the Hub benchmarks' published schemas; the Hub loaders'
rejects; paired deltas; the CLI's errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from curation.benchmarks import load_benchmark, run_eval
from stages.benchmark_eval import BenchmarkCap, EvalSettings
from stages.benchmark_report import paired_deltas
from stages.environment import PromptBuilder, VerifierEnvironment
from stages.rollout import Rollouts, SamplingConfig
from tests.tiny_lm import smollm2_tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"
HUB = {"aime24": FIXTURES / "aime24.jsonl", "aime25": FIXTURES / "aime25.jsonl",
       "gpqa_diamond": FIXTURES / "gpqa_diamond.csv", "livecodebench": FIXTURES / "livecodebench.jsonl"}
ROWS = 5
LCB_SOLUTIONS = {"abc000_a": "a, b = map(int, input().split())\nprint(a + b)",
                 "1000A": "input()\nprint(max(map(int, input().split())))"}


class ScriptedEngine:
    """A rollout engine that answers each prompt with a scripted text (the same for greedy and samples)."""

    def __init__(self, tokenizer, answers: dict[tuple[int, ...], str]):
        self.tokenizer, self.answers = tokenizer, answers
        self.sampling = SamplingConfig()
        self.calls: list[int] = []

    def generate(self, prompts, n, greedy=False, max_new_tokens=None, seed=None):
        self.calls.append(len(prompts))
        texts = [self.answers[tuple(p)] for p in prompts for _ in range(n)]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
               for t in texts]
        return Rollouts([p for p in prompts for _ in range(n)], ids, [[0.0] * len(i) for i in ids],
                        [False] * len(ids), texts, n)

    def close(self):
        pass


def _mbpp_gold() -> dict[int, str]:
    from common.io import Rejects
    from common.paths import SOURCES
    from corpora.registry import load_registry
    from curation.ingest import ingest_source, source_root

    (spec,) = load_registry(only=["mbpp_solutions"])
    rows = ingest_source(spec, source_root(spec, SOURCES), Rejects("t")).rows
    return {json.loads(r["metadata"])["task_id"]: (json.loads(m) if isinstance(m := r["messages"], str) else m)[1]["content"]
            for r in rows}


def gold(row: dict, mbpp: dict[int, str]) -> str:
    """The right answer of a benchmark row, written as a model would."""
    gt, meta = json.loads(row["ground_truth"]), json.loads(row["metadata"])
    if row["agent_ref"] in ("math", "mcqa"):
        return f"The answer is \\boxed{{{gt['answer']}}}."
    if gt["mode"] == "check_candidate":
        return f"```python\n{gt['prompt']}{meta['canonical_solution']}\n```"
    if gt["mode"] == "assert":
        return mbpp[meta["task_id"]]
    return f"```python\n{LCB_SOLUTIONS[meta['id']]}\n```"


def wrong(row: dict) -> str:
    gt = json.loads(row["ground_truth"])
    if row["agent_ref"] == "math":
        return "\\boxed{-98765}"
    if row["agent_ref"] == "mcqa":
        return "\\boxed{" + ("B" if gt["answer"] == "A" else "A") + "}"
    if row["agent_ref"] == "code":
        return "```python\ndef f():\n    return None\nprint(0)\n```"
    return ""  # instruction following: an empty answer follows no instruction


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def environment():
    env = VerifierEnvironment(timeout_s=20.0)
    yield env
    env.close()


GOLD_BENCHMARKS = ["gsm8k", "math500", "arc_challenge", "mmlu", "humaneval", "mbpp", "aime24", "aime25",
                   "gpqa_diamond", "livecodebench"]


def _run(names, answer, tokenizer, environment, tmp_path, samples=2):
    presets = {"t": {n: {"rows": ROWS, "max_new_tokens": 64} for n in names}}
    settings = EvalSettings(presets=presets, preset="t", samples=samples)
    from curation.benchmarks import held_out, trained_uuids

    builder, trained = PromptBuilder(tokenizer, settings.max_prompt_tokens), trained_uuids()
    answers = {}
    for n in names:
        for row in held_out(load_benchmark(n, path=HUB.get(n)).rows, trained)[0][:ROWS]:
            answers[tuple(builder(row))] = answer(row)
    engine = ScriptedEngine(tokenizer, answers)
    params = {"benchmarks": {"presets": presets, "preset": "t", "samples": samples}}
    result = run_eval(params, "scripted", hub_paths={k: str(v) for k, v in HUB.items()}, out_dir=str(tmp_path),
                      rollout=engine, environment=environment)
    assert json.loads((tmp_path / "scripted.json").read_text())["benchmarks"].keys() == result["benchmarks"].keys()
    return result, engine


def test_gold_answers_score_100_and_wrong_ones_0_on_every_benchmark(tokenizer, environment, tmp_path):
    mbpp = _mbpp_gold()
    good, engine = _run(GOLD_BENCHMARKS, lambda r: gold(r, mbpp), tokenizer, environment, tmp_path / "good")
    bad, _ = _run([*GOLD_BENCHMARKS, "ifeval", "ifbench"], wrong, tokenizer, environment, tmp_path / "bad")
    for name in GOLD_BENCHMARKS:
        block = good["benchmarks"][name]
        n = block["accuracy"]["n"]
        assert n == block["rows"] >= 1, name
        assert block["accuracy"]["mean"] == 1.0 and block["pass@2"]["mean"] == 1.0, name
        assert block["pass@1@t"]["mean"] == 1.0 and block["ungraded"] == 0, name
    for name, block in bad["benchmarks"].items():
        assert block["accuracy"]["mean"] == 0.0 and block["pass@2"]["mean"] == 0.0, name
        assert block["accuracy"]["ci_high"] == 0.0, name
    # every prompt of a benchmark in one batched call: greedy, then the samples
    assert engine.calls == [good["benchmarks"][n]["rows"] for n in GOLD_BENCHMARKS for _ in range(2)]
    # the fixture's counts: AIME 2 + 1, GPQA 2, LiveCodeBench 2 stdin problems (functional and unsafe rejected)
    assert [good["benchmarks"][n]["rows"] for n in ("aime24", "aime25", "gpqa_diamond", "livecodebench")] == [2, 1, 2, 2]
    assert good["benchmarks"]["humaneval"]["rows"] == ROWS
    deltas = paired_deltas(good, bad)
    assert deltas["gsm8k"] == {"delta": 1.0, "ci_low": 1.0, "ci_high": 1.0, "n": ROWS}


def test_rows_a_training_split_holds_are_left_out_and_counted():
    from curation.benchmarks import held_out, trained_uuids

    trained = trained_uuids()
    rows = load_benchmark("mbpp").rows
    kept, left_out = held_out(rows, trained)
    assert left_out == sum(r["uuid"] in trained for r in rows) and left_out + len(kept) == 500
    assert not {r["uuid"] for r in kept} & trained
    arc = load_benchmark("arc_challenge").rows
    assert len(arc) == 1172 and not {r["uuid"] for r in arc} & trained  # ARC-Challenge test: a benchmark only


def test_hub_loaders_read_the_published_schemas_and_reject_what_they_cannot_grade():
    aime = load_benchmark("aime24", path=str(HUB["aime24"])).rows
    assert [json.loads(r["ground_truth"])["answer"] for r in aime] == ["204", "025"]
    assert "Aya" in aime[0]["responses_create_params"]["input"][0]["content"]
    gpqa = load_benchmark("gpqa_diamond", path=str(HUB["gpqa_diamond"])).rows
    for row in gpqa:
        gt = json.loads(row["ground_truth"])
        assert row["agent_ref"] == "mcqa" and len(gt["options"]) == 4
        assert gt["options"][gt["answer"]].strip() in ("10^-4 eV", "11")
    again = load_benchmark("gpqa_diamond", path=str(HUB["gpqa_diamond"])).rows
    assert [r["ground_truth"] for r in again] == [r["ground_truth"] for r in gpqa]  # seeded by Record ID
    lcb = load_benchmark("livecodebench", path=str(HUB["livecodebench"]))
    assert [json.loads(r["metadata"])["id"] for r in lcb.rows] == ["abc000_a", "1000A"]
    tests = json.loads(lcb.rows[0]["ground_truth"])["tests"]
    assert [t["expected_stdout"] for t in tests] == ["3\n", "6\n", "2000000000\n"]  # public + unpickled private
    assert sum(lcb.rejects.values()) == 2 and not os.path.exists("/tmp/lcb_pwned")
    assert any("functional" in reason for reason in lcb.rejects) and any("global" in reason or "class" in reason
                                                                         for reason in lcb.rejects)


def test_bad_presets_and_benchmarks_name_the_params_key(tmp_path):
    settings = EvalSettings(presets={"laptop": {"gsm8k": BenchmarkCap(max_new_tokens=8)}})
    with pytest.raises(ValueError, match="benchmarks.presets has no preset 'nope'"):
        settings.caps("nope")
    bad = {"benchmarks": {"presets": {"x": {"gsm9k": {"max_new_tokens": 8}}}, "preset": "x"}}
    with pytest.raises(ValueError, match="benchmarks.presets.x: unknown benchmarks \\['gsm9k'\\]"):
        run_eval(bad, "scripted", out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="no `benchmarks` block"):
        run_eval({}, "scripted")
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'"):
        load_benchmark("gsm9k")


def test_the_params_presets_are_valid():
    import yaml

    params = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text(encoding="utf-8"))
    settings = EvalSettings.model_validate(params["benchmarks"])
    laptop = settings.caps("laptop")
    assert set(laptop) == {"ifeval", "gsm8k", "math500", "arc_challenge", "humaneval", "mbpp"}
    assert all(cap.rows is None for cap in settings.caps("full").values())

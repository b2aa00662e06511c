"""Stage registry, cascade params, checkpoint lineage, prompts and environments (stages/)."""

import json
from pathlib import Path

import pytest
import yaml

from common.io import write_parquet
from stages.base import build_runner, get_runner
from stages.checkpoints import (
    CheckpointRegistry,
    dataset_hash,
    read_record,
    write_record,
)
from stages.cli import stage_settings
from stages.environment import (
    GenRMEnvironment,
    PromptBuilder,
    PromptTooLong,
    VerifierEnvironment,
)
from stages.grpo import GRPOStage
from stages.rollout import Rollouts
from stages.sft import SFTStage
from tests.rows import rl_table
from tests.tiny_lm import smollm2_tokenizer

REPO = Path(__file__).resolve().parents[1]


def test_runners_come_from_the_entry_point_group():
    assert get_runner("grpo") is GRPOStage and get_runner("sft") is SFTStage
    with pytest.raises(ValueError, match="no stage runner 'dpo' \\(entry-point group 'cascade_rl.stages'\\)"):
        get_runner("dpo")


def test_config_errors_name_the_stage_and_field():
    with pytest.raises(ValueError, match=r"cascade.stages.if_rl.group_size: Input should be greater than or equal to 2"):
        build_runner("if_rl", {"runner": "grpo", "datasets": [], "group_size": 1})
    with pytest.raises(ValueError, match=r"cascade.stages.if_rl.lr: Extra inputs are not permitted"):
        build_runner("if_rl", {"runner": "grpo", "datasets": [], "lr": 1.0})
    with pytest.raises(ValueError, match="missing 'runner'"):
        build_runner("if_rl", {"datasets": []})


def test_every_stage_of_params_yaml_builds_and_inits_chain_through_the_order():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    cascade = params["cascade"]
    inits = {}
    for name in cascade["stages"]:
        settings, init = stage_settings(params, name)
        runner = build_runner(name, settings)
        assert runner.cfg.optim.betas == (0.9, 0.98)
        inits[name] = init
    order = cascade["order"]
    assert order[:5] == ["sft", "if_rl", "multidomain_rl", "mopd", "rlhf"]  # the paper's order
    assert inits["sft"] == Path(cascade["model"])
    for prev, stage in zip(order, order[1:], strict=False):
        assert inits[stage] == Path(f"data/checkpoints/{prev}"), stage
    assert build_runner("rlhf", stage_settings(params, "rlhf")[0]).cfg.kl_beta == 0.03
    with pytest.raises(ValueError, match="no stage 'dpo'"):
        stage_settings(params, "dpo")
    params["cascade"]["stages"]["orphan"] = {"runner": "grpo", "datasets": []}
    with pytest.raises(ValueError, match="needs an 'init' checkpoint"):
        stage_settings(params, "orphan")


def test_checkpoint_records_lineage_hashes_and_best_per_domain(tmp_path):
    data = tmp_path / "set"
    write_parquet(rl_table(["a"]), data / "train.parquet")
    h = dataset_hash(data)
    root = tmp_path / "ckpt"
    write_record(root / "sft", stage="sft", runner="sft", init=tmp_path / "base", datasets=[data],
                 validation={"math": {"reward": 0.2}, "mcqa": {"reward": 0.5}}, train={})
    write_record(root / "if_rl", stage="if_rl", runner="grpo", init=root / "sft", datasets=[data],
                 validation={"math": {"reward": 0.4}, "mcqa": {"reward": 0.1},
                             "long_context": {"rows": 0, "prompt_too_long": 1}}, train={})
    rec = read_record(root / "if_rl")
    assert rec["lineage"] == ["sft", "if_rl"] and rec["datasets"] == {str(data): h}
    assert rec["parent_datasets"] == {str(data): h}
    assert CheckpointRegistry(root).best_per_domain() == {"math": root / "if_rl", "mcqa": root / "sft"}
    with pytest.raises(LookupError, match="'code'"):
        CheckpointRegistry(root).best("code")
    write_parquet(rl_table(["b"]), data / "train.parquet")
    assert dataset_hash(data) != h
    with pytest.raises(FileNotFoundError, match="run the step that builds it"):
        dataset_hash(tmp_path / "missing")


def test_prompt_builder_moves_tools_into_a_system_turn_and_refuses_long_prompts():
    tok = smollm2_tokenizer()
    tools = json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])
    row = rl_table(["Weather in Paris?"], responses_create_params=[
        {"input": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools}]).to_dicts()[0]
    builder = PromptBuilder(tok, max_prompt_tokens=200)
    assert not builder.template_renders_tools
    text = tok.decode(builder(row))
    assert text.startswith("<|im_start|>system\nYou can call these tools") and '"get_weather"' in text
    assert text.endswith("<|im_start|>assistant\n")
    with pytest.raises(PromptTooLong, match="row b0: prompt has .* tokens > max_prompt_tokens 5"):
        PromptBuilder(tok, max_prompt_tokens=5)(row)


def test_verifier_environment_dispatches_on_agent_ref():
    row = {"uuid": "q", "agent_ref": "mcqa", "domain": "stem_mcqa",
           "ground_truth": json.dumps({"answer": "C", "options": {"A": "x", "B": "y", "C": "z", "D": "w"}}),
           "metadata": "{}", "responses_create_params": {"input": [{"role": "user", "content": "?"}]}}
    env = VerifierEnvironment(timeout_s=10.0, workers=1)
    assert env.score([r"\boxed{C}", r"\boxed{A}"], [row, row]) == [(1.0, True), (0.0, False)]
    # one worker pool for the environment's life: the second step is graded by the same process
    (worker,) = env.pool._pool
    assert env.score([r"\boxed{A}"], [row]) == [(0.0, False)] and env.pool._pool == [worker]
    env.close()
    assert worker.proc.poll() is not None and env.pool._pool == []


def test_only_a_judge_hands_validation_to_the_verifiers():
    from stages.environment import GenRMEnvironment, grades_responses

    assert grades_responses("verifiers") and grades_responses("function") and not grades_responses("genrm")
    assert VerifierEnvironment.grades_responses and not GenRMEnvironment.grades_responses
    with pytest.raises(ValueError, match="needs environment_kwargs judge_model"):
        GenRMEnvironment()


class ScriptedJudge:
    """A judge engine that answers pair k with ``outputs[k]`` and records its prompts."""

    def __init__(self, outputs):
        self.outputs, self.prompts = outputs, []

    def generate(self, prompts, n, greedy=False, max_new_tokens=None):
        self.prompts += prompts
        texts = self.outputs[:len(prompts)]
        self.outputs = self.outputs[len(prompts):]
        return Rollouts(prompts, [[1]] * len(prompts), [[0.0]] * len(prompts), [False] * len(prompts), texts, 1)


def _judgement(s1, s2, rank):
    return (f"[The Begin of Individual Scores]\n\\boxed{{{s1}, {s2}}}\n[The End of Individual Scores]\n"
            f"[The Begin of Ranking Score]\n\\boxed{{{rank}}}\n[The End of Ranking Score]")


def test_genrm_environment_judges_circular_pairs_per_group():
    tok = smollm2_tokenizer()
    rows = rl_table(["p0", "p1"]).to_dicts()
    group = [rows[0]] * 3 + [rows[1]] * 2
    responses = ["r0", "r1", "r2", "s0", "s1"]
    # group 1 circular pairs (0,1), (1,2), (2,0); group 2 one pair (0,1) with a tie broken by the ranking
    judge = ScriptedJudge([_judgement(5, 1, 1), _judgement(3, 3, 3), "no scores", _judgement(4, 4, 2)])
    scores = GenRMEnvironment(judge, tok).score(responses, group)
    # r0: 5 -> 0.9; r1: mean(1, 3 + 0.1) = 2.05 -> 0.31; r2: 3 - 0.1 = 2.9 -> 0.48 (pair (2,0) malformed)
    # s0: 4 + 0.3 -> 0.76; s1: 4 - 0.3 -> 0.64
    assert [s[0] for s in scores] == pytest.approx([0.9, 0.31, 0.48, 0.76, 0.64])
    assert len(judge.prompts) == 4 and "r1" in tok.decode(judge.prompts[1]) and "r2" in tok.decode(judge.prompts[1])


def test_cpu_paths_never_import_vllm_or_deepspeed():
    import subprocess
    import sys

    code = ("import sys, stages.grpo, stages.sft, stages.cli, stages.rollout, stages.train_engine; "
            "print(sorted(m for m in ('vllm', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""``cascade solve``: generate -> verify -> refine, pass rate by round; feedback never leaks hidden tests."""

from __future__ import annotations

import json

import pytest

from stages.checkpoints import write_record
from stages.rollout import Rollouts
from stages.solve import SolveConfig, public_row, resolve_checkpoint, solve
from tests.swe_rows import MBPP, mbpp_rows

WRONG = "```python\ndef remove_Occ(s, ch):\n    return s\n```"
RIGHT = f"```python\n{MBPP[11][2]}\n```"


class Replay:
    """A rollout engine that answers from a fixed list per round (records the prompts it saw)."""

    def __init__(self, tok, answers):
        self.tok, self.answers, self.prompts = tok, answers, []

    def generate(self, prompts, n, greedy=False, max_new_tokens=None):
        self.prompts.append([self.tok.decode(p) for p in prompts])
        texts = self.answers[len(self.prompts) - 1][:len(prompts)]
        return Rollouts(prompts, [[0]] * len(texts), [[0.0]] * len(texts), [False] * len(texts), texts, 1)


def _code_row(task_id):
    row = dict(mbpp_rows(task_id)[0])
    row["ground_truth"] = json.dumps({**json.loads(row["ground_truth"]), "setup_code": ""})
    return row


def test_refinement_after_failing_public_feedback_raises_the_pass_rate(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    rows = [_code_row(11), _code_row(11)]
    engine = Replay(tok, [[WRONG, RIGHT], [RIGHT], []])
    report = solve(engine, tok, rows, SolveConfig(rounds=3))
    assert [r["pass_rate"] for r in report["rounds"]] == [0.5, 1.0, 1.0]
    assert [r["active"] for r in report["rounds"]] == [2, 1, 0] and report["solved_round"] == [2, 1]
    second = engine.prompts[1][0]
    assert 'remove_Occ("hello","l") == "heo"' in second.split("Your solution is wrong")[1]   # the public test
    assert 'remove_Occ("abcda","a")' not in second and 'remove_Occ("PHP"' not in second     # hidden ones never
    assert second.count("<|im_start|>assistant") == 2


def test_public_row_keeps_only_the_shown_test_and_math_rows_have_none():
    row = public_row(_code_row(11))
    assert json.loads(row["ground_truth"])["tests"] == [MBPP[11][1][0]]
    assert public_row({"agent_ref": "math", "ground_truth": '{"answer": "1"}'}) is None


def test_checkpoints_resolve_from_dirs_stage_names_and_best_domain(tmp_path, smollm2_dir):
    for stage, reward in (("a", 0.2), ("b", 0.7)):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "config.json").write_text("{}")
        write_record(tmp_path / stage, stage=stage, runner="grpo", init=smollm2_dir, datasets=[],
                     validation={"code": {"reward": reward}}, train={})
    assert resolve_checkpoint("best:code", tmp_path) == tmp_path / "b"
    assert resolve_checkpoint("a", tmp_path) == tmp_path / "a"
    assert resolve_checkpoint(smollm2_dir, tmp_path) == smollm2_dir
    with pytest.raises(FileNotFoundError, match=r"\['a', 'b'\]"):
        resolve_checkpoint("nope", tmp_path)


@pytest.mark.slow
def test_cascade_solve_on_mbpp_with_smollm2(tmp_path, smollm2_dir):
    from curation.cli import main

    out = tmp_path / "solve.json"
    assert main(["solve", "--checkpoint", str(smollm2_dir), "--dataset", "data/sets/rl/code", "--rows", "4",
                 "--rounds", "3", "--max-new-tokens", "128", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rates = [r["pass_rate"] for r in report["rounds"]]
    print(rates)
    assert len(rates) == 3 and rates == sorted(rates) and report["problems"] == 4

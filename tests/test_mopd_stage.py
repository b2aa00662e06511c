"""The MOPD stage (stages/mopd.py) with tiny models: teacher choice, vocabulary check, memory
budget, and recovery of a regressed domain by distilling from the earlier checkpoint."""

import csv

import pytest
import torch

from common.io import write_parquet
from stages.checkpoints import read_record, write_record
from stages.mopd import MOPDConfig, MOPDStage, TeacherPool, resolve_teachers
from tests.rows import rl_table
from tests.tiny_lm import tiny_llama

PROMPTS = ["Say yes.", "Say no.", "Greet me."]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (a shared CPU makes multi-thread spin-waits very slow)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


class FirstToken:
    """Reward 1 when the response starts with the target text of the row's domain."""

    def __init__(self, targets):
        self.targets = targets

    def score(self, responses, rows):
        hits = [r.startswith(self.targets[row["domain"]]) for r, row in zip(responses, rows, strict=True)]
        return [(float(h), h) for h in hits]


def _set(path, domain, prompts=PROMPTS):
    table = rl_table(prompts, prefix=domain, domain=[domain] * len(prompts))
    for split in ("train", "validation"):
        write_parquet(table, path / f"{split}.parquet")
    return path


def _common(tmp_path, name, **over):
    return {"name": name, "seed": 0, "rollout_engine": "hf",
            "checkpoint_root": str(tmp_path / "ckpt"), "metrics_dir": str(tmp_path / "m"),
            "plots_dir": str(tmp_path / "p"), **over}


def _save(model, tok, path):
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_default_teacher_is_the_best_checkpoint_of_the_students_lineage(tmp_path):
    root = tmp_path / "ckpt"
    val = {"sft": {"math": 0.6, "mcqa": 0.2}, "if_rl": {"math": 0.3, "mcqa": 0.2}, "mdrl": {"math": 0.1, "mcqa": 0.5},
           "other_branch": {"math": 0.9, "mcqa": 0.9}}
    inits = {"sft": tmp_path / "base", "if_rl": root / "sft", "mdrl": root / "if_rl", "other_branch": tmp_path / "base"}
    for stage, scores in val.items():  # mdrl's lineage: sft -> if_rl -> mdrl; other_branch is not in it
        write_record(root / stage, stage=stage, runner="grpo", init=inits[stage], datasets=[],
                     validation={d: {"reward": v} for d, v in scores.items()}, train={})
    got = resolve_teachers(["math", "mcqa"], root / "mdrl", root, pinned={})
    assert got == {"math": root / "sft", "mcqa": root / "mdrl"}
    # sft and if_rl tie on mcqa: the later stage of the lineage wins
    assert resolve_teachers(["mcqa"], root / "if_rl", root, pinned={}) == {"mcqa": root / "if_rl"}
    pinned = resolve_teachers(["math", "mcqa"], root / "mdrl", root,
                              pinned={"math": "if_rl", "mcqa": str(tmp_path / "x")})
    assert pinned == {"math": root / "if_rl", "mcqa": tmp_path / "x"}
    with pytest.raises(ValueError, match=r"no teacher for domain 'code'.*\['sft', 'if_rl', 'mdrl'\].*teachers"):
        resolve_teachers(["code"], root / "mdrl", root, pinned={})


def test_teacher_pool_loads_one_at_a_time_or_within_the_memory_budget(tmp_path, tok):
    dirs = [_save(tiny_llama(len(tok), seed=s, hidden=32), tok, tmp_path / f"t{s}") for s in range(2)]
    one = TeacherPool(0.0)
    for d in (dirs[0], dirs[1], dirs[0]):
        assert not one.get(d).training
    assert one.loads == 3 and list(one.loaded) == [dirs[0]]
    both = TeacherPool(100.0)  # each tiny teacher is ~6 MB of fp32 weights
    for d in (dirs[0], dirs[1], dirs[0]):
        model = both.get(d)
    assert both.loads == 2 and list(both.loaded) == [dirs[1], dirs[0]]
    assert all(not p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("kind", ["vocab_size", "tokenizer"])
def test_vocabulary_mismatch_fails_at_start_naming_teacher_and_student(tmp_path, tok, kind):
    from transformers import AutoTokenizer

    init = _save(tiny_llama(len(tok), hidden=32), tok, tmp_path / "init")
    if kind == "vocab_size":
        teacher = _save(tiny_llama(len(tok) + 64, hidden=32), tok, tmp_path / "teacher")
        match = rf"vocab_size {len(tok) + 64} vs {len(tok)}"
    else:
        other = AutoTokenizer.from_pretrained(init)
        other.add_tokens(["<teacher_only>"])
        teacher = _save(tiny_llama(len(tok), hidden=32), other, tmp_path / "teacher")
        match = (rf"tokenizers have {len(tok) + 1} vs {len(tok)} tokens; token '<teacher_only>' is id {len(tok)} "
                 r"in the teacher and None in the student")
    data = _set(tmp_path / "a", "a")
    cfg = MOPDConfig.model_validate(_common(tmp_path, "mopd", runner="mopd", datasets=[str(data)],
                                            teachers={"a": str(teacher)}))
    with pytest.raises(ValueError, match=rf"teacher {teacher} \(domain 'a'\) and student {init} do not share a "
                                         rf"vocabulary: {match}"):
        MOPDStage(cfg, environment=FirstToken({"a": "x"})).run(cfg.datasets, init)
    assert not (tmp_path / "p" / "mopd.csv").exists() and not (tmp_path / "ckpt" / "mopd").exists()


def test_bounds_must_bracket_one():
    with pytest.raises(ValueError, match="needs 0 < lo <= 1 <= hi"):
        MOPDConfig(name="m", runner="mopd", datasets=[], is_bounds=(1.5, 2.0))


def _supervise(model, tok, prompts, target: int, steps: int) -> None:
    """A few AdamW steps of cross-entropy on the first response token (``target``) of every prompt."""
    ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=False)
           for p in prompts]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        logits = torch.stack([model(torch.tensor([i]), logits_to_keep=1).logits[0, -1] for i in ids])
        torch.nn.functional.cross_entropy(logits, torch.full((len(ids),), target)).backward()
        opt.step()
        opt.zero_grad()


def _checkpoint(model, tok, root, stage, init, sets, env):
    """Save ``model`` as stage ``stage`` with its record and greedy per-domain validation on ``sets``."""
    from stages.base import EvalConfig
    from stages.environment import PromptBuilder
    from stages.evaluate import evaluate
    from stages.rollout import HFRolloutEngine, SamplingConfig

    path = _save(model, tok, root / stage)
    validation = evaluate(HFRolloutEngine(model, tok, SamplingConfig()), PromptBuilder(tok), env,
                          EvalConfig(datasets=[str(s) for s in sets], rows=len(PROMPTS), max_new_tokens=1))
    write_record(path, stage=stage, runner="supervised", init=init, datasets=sets[:1], validation=validation, train={})
    return validation


def test_mopd_recovers_a_domain_that_a_later_stage_regressed(tmp_path, tok):
    """Domain A: answers start with "yes"; domain B, same prompts: with "no". A first stage is trained
    to be good on A, a second one on B, which regresses A to 0. MOPD on A's prompts from the second
    checkpoint, with A's default teacher (the best A checkpoint of the lineage: the first stage),
    brings A's greedy validation back within ``steps`` steps."""
    a, b = _set(tmp_path / "sets" / "a", "a"), _set(tmp_path / "sets" / "b", "b")
    yes, no = tok.encode("yes")[0], tok.encode("no")[0]
    env = FirstToken({"a": "yes", "b": "no"})
    root, model = tmp_path / "ckpt", tiny_llama(len(tok), hidden=32)
    base = _save(model, tok, tmp_path / "base")
    _supervise(model, tok, PROMPTS, yes, steps=15)
    good = _checkpoint(model, tok, root, "a_stage", base, [a, b], env)
    _supervise(model, tok, PROMPTS, no, steps=15)
    bad = _checkpoint(model, tok, root, "b_stage", root / "a_stage", [b, a], env)
    assert (good["a"]["reward"], bad["a"]["reward"], bad["b"]["reward"]) == (1.0, 0.0, 1.0)

    steps = 8
    cfg = MOPDConfig.model_validate(_common(
        tmp_path, "mopd", runner="mopd", datasets=[str(a)], steps=steps, prompts_per_step=3, rollouts_per_prompt=8,
        micro_batch_size=24, sampling={"max_new_tokens": 1, "batch_size": 24}, optim={"lr": 1e-2, "min_lr_ratio": 1.0},
        eval={"datasets": [str(a), str(b)], "rows": 3, "max_new_tokens": 1}))
    result = MOPDStage(cfg, environment=env).run(cfg.datasets, root / "b_stage")
    record = read_record(result.checkpoint)
    assert record["teachers"] == {"a": str(root / "a_stage")}
    assert record["lineage"] == ["a_stage", "b_stage", "mopd"]
    assert record["validation"]["a"]["reward"] - bad["a"]["reward"] >= 2 / 3, record["validation"]
    rows = list(csv.DictReader((tmp_path / "p" / "mopd.csv").open()))
    kl = [float(r["reverse_kl"]) for r in rows]
    assert len(rows) == steps and kl[-1] < kl[0] / 2, kl   # the student moved toward its teacher
    assert all(float(r["is_dropped"]) == 0.0 for r in rows)  # sampler == trainer: every ratio is ~1
    assert result.summary["counts"]["teacher_loads"] == 1  # one teacher: loaded once, kept

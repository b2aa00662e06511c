"""One small stage run of each runner, as a process the resume tests can kill (tests/test_resume.py).

    python -m tests.resume_job RUNNER DATA_DIR OUT_DIR [KEY=JSON ...]

``DATA_DIR`` holds what :func:`prepare` wrote (tiny init model, teacher, data); ``OUT_DIR`` gets the
run's checkpoints, states, metrics and plots. ``KEY=JSON`` pairs override config fields.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

STEPS = 4


class ParityReward:
    """Reward 1 for a response of even length in characters: groups of a random model disagree."""

    def score(self, responses: list[str], rows: list[dict]) -> list[tuple[float, bool]]:
        return [(float(len(r) % 2 == 0), len(r) % 2 == 0) for r in responses]


def prepare(data: Path, family: str = "llama") -> None:
    """Write the init model (a tiny ``family`` of :data:`tests.tiny_lm.FAMILIES`, SmolLM2 tokenizer), a
    teacher of the same family, RL prompts, packs and SWE tasks."""
    from common.io import write_parquet
    from packing.writer import assemble_pack, write_packs
    from tests.rows import rl_table
    from tests.swe_rows import build_set
    from tests.tiny_lm import FAMILIES, smollm2_tokenizer

    tok = smollm2_tokenizer()
    for name, seed in (("init", 0), ("teacher", 1)):
        FAMILIES[family](len(tok), seed=seed, initializer_range=0.5).save_pretrained(data / name)
        tok.save_pretrained(data / name)
    table = rl_table(["Say yes.", "Say no.", "Name a colour.", "Count to three.", "Greet me."])
    for split in ("train", "validation"):
        write_parquet(table, data / "rl" / f"{split}.parquet")
    mixed = rl_table(["Say yes.", "Tell me twice.", "Name a colour.", "Two words, twice."], prefix="m",
                     agent_ref=["math", "parity_episode", "math", "parity_episode"])
    for split in ("train", "validation"):  # single-turn and episode rows (tests/parity_episodes.py)
        write_parquet(mixed, data / "mixed" / f"{split}.parquet")
    rng = np.random.default_rng(0)
    packs = []
    for _ in range(3):
        docs = [rng.integers(3, 200, int(n)) for n in rng.integers(4, 12, 3)]
        packs.append(assemble_pack(docs, [np.r_[0, np.ones(len(d) - 1, int)] for d in docs], ["a", "b", "c"]))
    for split in ("train", "validation"):
        write_packs(packs, data / "packed" / f"{split}.parquet", 8)
    build_set(data / "swe", task_ids=(13,))


def config(runner: str, data: Path, out: Path, **over: Any) -> dict[str, Any]:
    """The stage config of ``runner`` (4 steps, a state after every step, one thread)."""
    common = {"name": f"resume_{runner}", "runner": runner, "seed": 3, "steps": STEPS, "save_every": 1,
              "threads": 1, "rollout_engine": "hf", "checkpoint_root": str(out / "ckpt"),
              "metrics_dir": str(out / "metrics"), "plots_dir": str(out / "plots"), "eval": {"datasets": []},
              "optim": {"lr": 1e-2, "warmup_steps": 1}}
    per_runner = {
        "sft": {"datasets": [str(data / "packed")], "grad_accum": 2, "max_tokens": 16, "validation_windows": 1},
        "grpo": {"datasets": [str(data / "rl")], "prompts_per_step": 2, "group_size": 4, "micro_batch_size": 4,
                 "dynamic_filtering": True, "mask_truncated": False, "sampling": {"max_new_tokens": 4}},
        "mopd": {"datasets": [str(data / "rl")], "prompts_per_step": 2, "rollouts_per_prompt": 2,
                 "teachers": {"math": str(data / "teacher")}, "sampling": {"max_new_tokens": 4}},
        "swe_rl": {"datasets": [str(data / "swe")], "prompts_per_step": 1, "group_size": 2, "micro_batch_size": 2,
                   "max_prompt_tokens": 2048, "max_context_tokens": 4096, "validation_rows": 1,
                   "dynamic_filtering": False, "sampling": {"max_new_tokens": 4}, "agent": {"max_steps": 2}},
    }
    return {**common, **per_runner[runner], **over}


def run_once(tmp_path_factory: Any, prefix: str, start: Any) -> Any:
    """``get(runner) -> out dir``: ``start(runner, out)`` run in a fresh temporary directory on the first
    ``get`` of each runner, its directory returned from then on (a module fixture's lazy runs)."""
    outs: dict[str, Path] = {}

    def get(runner: str) -> Path:
        if runner not in outs:
            outs[runner] = tmp_path_factory.mktemp(f"{prefix}_{runner}")
            start(runner, outs[runner])
        return outs[runner]

    return get


def run(runner: str, data: Path, out: Path, **over: Any) -> Any:
    """Run the stage in this process; returns its :class:`~stages.base.StageResult`."""
    from stages.base import get_runner

    cls = get_runner(runner)
    cfg = cls.config_class.model_validate(config(runner, data, out, **over))
    stage = cls(cfg, environment=ParityReward()) if runner in ("grpo", "mopd") else cls(cfg)
    return stage.run([Path(d) for d in cfg.datasets], data / "init")


if __name__ == "__main__":
    runner_, data_, out_, *pairs = sys.argv[1:]
    run(runner_, Path(data_), Path(out_), **{k: json.loads(v) for k, v in (p.split("=", 1) for p in pairs)})

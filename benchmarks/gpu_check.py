"""The GPU check: each stage runner for two steps where users train, with tokens/s and peak GPU memory.

    python -m benchmarks.gpu_check [--model DIR] [--steps 2] [--runners sft grpo mopd]
                                   [--device cuda] [--engine vllm] [--train-engine deepspeed --zero-stage 3]
    torchrun --nproc-per-node N -m benchmarks.gpu_check ...        (N data-parallel ranks)

Defaults: ``device: cuda``, ``dtype: bfloat16``, the ``vllm`` rollout engine (CUDA ``vllm``, the
``gpu`` extra) and DeepSpeed ZeRO-3; the model is ``--model`` (default
``data/assets/SmolLM2-135M-Instruct`` where ``cascade asset`` put it, else the tiny random Llama of the
tests) as policy and MOPD teacher; the data is the tests' small set (tests/resume_job.py: RL prompts,
packs). GRPO runs with a KL term (RLHF's reference). Per runner it prints one line,
``<runner>: <tokens/s> tokens/s, peak GPU memory <MiB> MiB, <s> s`` (tokens/s: the stage's own
``tokens_per_s``, mean over steps; memory: ``torch.cuda.max_memory_allocated`` of this rank's trainer,
the vLLM engine's own process apart). ``--device cpu --engine hf`` runs the same path on a CPU host
(no memory column), which is how it is checked where no GPU is lent.

Exits 1 with a message when ``--device cuda`` finds no GPU.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
ASSET = REPO / "data" / "assets" / "SmolLM2-135M-Instruct"


def run_stage(runner: str, data: Path, out: Path, model: Path, a) -> dict[str, float]:
    """Run ``runner`` for ``a.steps`` steps; returns its tokens/s, peak memory (MiB) and wall seconds."""
    from tests import resume_job

    over = {"steps": a.steps, "save_every": 0, "threads": None, "device": a.device, "dtype": a.dtype,
            "rollout_engine": a.engine, "train_engine": a.train_engine, "zero_stage": a.zero_stage,
            "optim": {"lr": 1e-5, "warmup_steps": 0}}
    if runner == "grpo":
        over["kl_beta"] = 0.03
    if runner == "mopd":
        over["teachers"] = {"math": str(model)}
    if runner == "sft":
        over["max_tokens"] = 512
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    cfg = resume_job.config(runner, data, out, **over)
    from stages.base import get_runner

    cls = get_runner(runner)
    stage = cls(cls.config_class.model_validate(cfg), **(
        {"environment": resume_job.ParityReward()} if runner in ("grpo", "mopd") else {}))
    stage.run([Path(d) for d in cfg["datasets"]], model)
    wall = time.perf_counter() - t0
    rows = list(csv.DictReader((out / "plots" / f"resume_{runner}.csv").open()))
    return {"tokens_per_s": statistics.mean(float(r["tokens_per_s"]) for r in rows),
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if a.device == "cuda" else float("nan"),
            "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ASSET if (ASSET / "config.json").exists() else None)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--runners", nargs="+", default=["sft", "grpo", "mopd"], choices=("sft", "grpo", "mopd"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--engine", default="vllm", choices=("vllm", "hf"))
    ap.add_argument("--train-engine", default="deepspeed", choices=("deepspeed", "torch"))
    ap.add_argument("--zero-stage", type=int, default=3)
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda, but torch sees no GPU; on a CPU host run it with --device cpu --engine hf",
              file=sys.stderr)
        return 1
    from stages import distributed
    from tests import resume_job

    distributed.init()
    with tempfile.TemporaryDirectory() as tmp:
        # every rank prepares the same small data in its own directory (no shared file system assumed)
        data = Path(tmp) / "data"
        resume_job.prepare(data)
        model = a.model or data / "init"
        for runner in a.runners:
            got = run_stage(runner, data, Path(tmp) / runner, model, a)
            if distributed.is_main():
                print(f"{runner}: {got['tokens_per_s']:.1f} tokens/s, peak GPU memory {got['peak_mib']:.0f} MiB, "
                      f"{got['wall_s']:.1f} s ({a.device}, {a.dtype}, {a.engine} rollouts, {a.train_engine}"
                      f"{f' ZeRO-{a.zero_stage}' if a.train_engine == 'deepspeed' else ''}, "
                      f"{distributed.world_size()} rank(s), model {model.name})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

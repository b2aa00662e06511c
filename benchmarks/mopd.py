"""MOPD step time against TRL's on-policy ``DistillationTrainer``, same tiny student, teacher and batch.

    python -m benchmarks.mopd [--steps 5] [--prompts 4] [--rollouts 4] [--max-new-tokens 32]
                              [--model tiny|DIR] [--engine hf|vllm] [--dtype float32|bfloat16]
                              [--threads N] [--repeat 3] [--param-dtype float32|bfloat16] [--attn sdpa|eager]

Needs ``data/assets/SmolLM2-135M-Instruct`` (tokenizer) and TRL (``pip install -e .[bench]``).
Student: Llama hidden ``--hidden`` x 2 layers; teacher: hidden ``2 * --hidden`` x 2 layers; both
built from a config with the SmolLM2 tokenizer (49,152 tokens); ``--model DIR``: that checkpoint as
both. One step = sample ``prompts x rollouts`` responses of ``max-new-tokens`` tokens from the
student (ours: ``--engine``; TRL: HF ``generate``; temperature 1, top-p 1), score them with the
teacher, one forward/backward, one AdamW step (ours: and the weight push to a vllm engine).
``--dtype bfloat16``: both in mixed precision (ours: the stage's ``dtype``, so autocast, bf16 teacher
and a bf16 vllm sampler; TRL: ``bf16=True``, accelerate's autocast); ``--param-dtype bfloat16``: our student
holds bf16 parameters with fp32 masters; ``--attn``: both sides' attention kernel (student and teacher):

- ``stages.mopd.MOPDStage``: sampled-token reverse KL with ICE-POP weights (recipe §MOPD), the
  teacher kept loaded (one teacher), validation off;
- ``trl.DistillationTrainer`` (TRL 1.16; on-policy by construction, ``beta=1``: reverse KL over the
  full vocabulary, chunked), gradient checkpointing off, each prompt repeated
  ``rollouts`` times in one batch (TRL samples one completion per row).

Median seconds per step after one warm-up step, per run; ``--repeat N`` runs the pair N times (each in a
fresh process, each side in a process of its own: ours with ``cascade train``'s allocator, ``--malloc``, TRL with
the C library's, ``--trl-malloc``) and prints the ratio's min / median / max. ``--threads N``: each side's core
budget (default: every core; the process is pinned to its first N cores, torch gets N threads, ours binds its vllm engine to
the same cores).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.grpo import ASSET, PROMPTS, bench_model, load_note, spread
from benchmarks.trl_timer import fresh_call, fresh_runs, malloc_note, ratio_summary, side_env, use_cores


def ours(model_dir: Path, teacher_dir: Path, work: Path, a) -> list[dict[str, float]]:
    from common.io import write_parquet
    from stages.environment import FunctionEnvironment
    from stages.mopd import MOPDConfig, MOPDStage
    from tests.rows import rl_table

    table = rl_table(PROMPTS[:a.prompts], domain=["bench"] * a.prompts)
    for split in ("train", "validation"):
        write_parquet(table, work / "set" / f"{split}.parquet")
    n = a.prompts * a.rollouts
    cfg = MOPDConfig(name="bench", runner="mopd", rollout_engine=a.engine, dtype=a.dtype, threads=a.threads,
                     param_dtype=a.param_dtype, attn_implementation=a.attn,
                     datasets=[str(work / "set")], steps=a.steps + 1,
                     prompts_per_step=a.prompts, rollouts_per_prompt=a.rollouts, micro_batch_size=n,
                     teachers={"bench": str(teacher_dir)}, sampling={"max_new_tokens": a.max_new_tokens,
                                                                     "batch_size": n},
                     optim={"lr": 1e-5}, checkpoint_root=str(work / "ck"), metrics_dir=str(work / "m"),
                     plots_dir=str(work / "p"))
    MOPDStage(cfg, environment=FunctionEnvironment(lambda text, row: 0.0)).run(cfg.datasets, model_dir)
    return [{k: float(r[k]) for k in ("step_s", "generate_s", "teacher_s", "sync_s")}
            for r in csv.DictReader((work / "p" / "bench.csv").open())][1:]


def trl(tok, model_dir: Path, teacher_dir: Path, work: Path, a) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DistillationConfig, DistillationTrainer

    from benchmarks.trl_timer import step_timer

    rows = [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[:a.prompts] for _ in range(a.rollouts)]
    args = DistillationConfig(output_dir=str(work / "trl"), per_device_train_batch_size=len(rows),
                              max_completion_length=a.max_new_tokens, beta=1.0, temperature=1.0, top_p=1.0, top_k=0,
                              bf16=a.dtype == "bfloat16", gradient_checkpointing=False, learning_rate=1e-5,
                              max_steps=a.steps + 1,
                              logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
                              disable_tqdm=True, dataloader_num_workers=0, shuffle_dataset=False)
    timer = step_timer()
    trainer = DistillationTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=a.attn),
                                  teacher_model=AutoModelForCausalLM.from_pretrained(
                                      teacher_dir, attn_implementation=a.attn), args=args,
                                  train_dataset=Dataset.from_list(rows * (a.steps + 1)), processing_class=tok,
                                  callbacks=[timer])
    trainer.train()
    return timer.times[1:]


def mopd_pair(a) -> tuple[list[dict[str, float]], list[float], str, str, str]:
    """One run of each side on fresh models: (our step rows, TRL step seconds, the load average after, the
    student's and the teacher's descriptions)."""
    from transformers import AutoTokenizer

    use_cores(a.threads)
    tok = AutoTokenizer.from_pretrained(ASSET)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        student = bench_model(tok, a, work / "student", 0, a.hidden)
        teacher = bench_model(tok, a, work / "teacher", 1, 2 * a.hidden)
        ours_rows = fresh_call(side, ("ours", a, work), side_env(a.malloc))
        return ours_rows, fresh_call(side, ("trl", a, work), side_env(a.trl_malloc)), load_note(), student, teacher


def side(job: tuple[str, argparse.Namespace, Path]) -> Any:
    """One side of :func:`mopd_pair` in a process of its own (its allocator: ``--malloc``, ``--trl-malloc``)."""
    from transformers import AutoTokenizer

    name, a, work = job
    use_cores(a.threads)
    if name == "ours":
        return ours(work / "student", work / "teacher", work, a)
    return trl(AutoTokenizer.from_pretrained(ASSET), work / "student", work / "teacher", work, a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--model", default="tiny", help="tiny (Llamas of --hidden / 2x --hidden) or an HF checkpoint "
                                                     "dir used as student and teacher (SmolLM2)")
    ap.add_argument("--engine", default="hf", choices=("hf", "vllm"), help="our rollout engine")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="cores each side may use")
    ap.add_argument("--repeat", type=int, default=1, help="ours/TRL pairs run one after the other")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="both trainers' precision")
    ap.add_argument("--param-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="our student's parameter dtype (bfloat16: bf16 weights, fp32 masters)")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="both sides' attention kernel")
    ap.add_argument("--malloc", default="tcmalloc", help="ours: the allocator `cascade train` preloads")
    ap.add_argument("--trl-malloc", default="system", help="TRL's allocator (tcmalloc gives it ours)")
    a = ap.parse_args()
    runs = fresh_runs(mopd_pair, a, a.repeat)  # per repeat: (our step rows, TRL step seconds, load after the pair)
    student, teacher = runs[0][3], runs[0][4]
    t = Table(title=f"on-policy distillation step: {a.prompts} prompts x {a.rollouts} rollouts x {a.max_new_tokens} "
                    f"new tokens; student {student}, teacher {teacher}, {a.dtype} (ours: {a.param_dtype} parameters), "
                    f"{a.attn} attention, ours on the {a.engine} engine; "
                    f"{a.steps} timed steps; {a.threads} core(s) each side; allocator ours {malloc_note(a.malloc)}, "
                    f"TRL {malloc_note(a.trl_malloc)}")
    for col in ("run", "implementation", "objective", "median s/step", "min s/step", "max s/step", "ours / TRL",
                "load after"):
        t.add_column(col, justify="left" if col in ("implementation", "objective", "load after") else "right")
    ratios = []
    for run, (ours_rows, trl_t, load, *_) in enumerate(runs, 1):
        ours_t = [r["step_s"] for r in ours_rows]
        ratios.append(statistics.median(ours_t) / statistics.median(trl_t))
        t.add_row(str(run), "cascade-rl stages.mopd", "sampled-token reverse KL, ICE-POP", *spread(ours_t),
                  f"{ratios[-1]:.2f}", load)
        t.add_row(str(run), "trl.DistillationTrainer", "full-vocab reverse KL (beta=1)", *spread(trl_t), "", load)
    console = Console(width=180)
    console.print(t)
    console.print(f"ours / TRL over {a.repeat} runs: {ratio_summary(ratios)}")
    rows = [r for ours_rows, *_ in runs for r in ours_rows]
    step, gen, teach, sync = (statistics.median(r[k] for r in rows) for k in ("step_s", "generate_s", "teacher_s",
                                                                             "sync_s"))
    console.print(f"ours, median per step: sampling {gen:.3f} s, teacher scoring {teach:.3f} s, "
                  f"loss + backward + AdamW {step - gen - teach - sync:.3f} s, weight sync {sync:.3f} s")


if __name__ == "__main__":
    main()

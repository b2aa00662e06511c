"""The GPU check: each stage runner for two steps where users train, with tokens/s and peak GPU memory.

    python -m benchmarks.gpu_check [--model DIR] [--steps 2] [--runners sft grpo mopd]
                                   [--device cuda] [--engine vllm] [--train-engine deepspeed --zero-stage 3]
                                   [--families nemotron_h qwen3_moe]
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

Then, per ``--families`` model (tests/tiny_lm.py: a tiny NemotronH with Mamba-2, attention and MoE
layers; a tiny Qwen3-MoE), :func:`family_checks` prints one ``check`` line per check, each ``ok`` or
``FAIL``: its packed forward (:func:`stages.sft.packed_forward`) equals its documents run alone, in fp32
with the installed kernels (``mamba-ssm`` / ``causal-conv1d`` for the Mamba layers where installed) and,
where ``flash-attn`` is installed, in bf16 with ``flash_attention_2`` (varlen over the packed documents);
the ``--engine`` rollout engine serves the tiny model (greedy tokens equal the ``hf`` engine's, fp32); and
the runners train it for ``--steps`` steps (the lines above, per family). ``--families`` with no name
skips them.

Exits 1 with a message when ``--device cuda`` finds no GPU, or when a family check fails.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
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


# max |packed - alone| logit difference a check accepts: fp32 (float reassociation only), bf16 flash-attn
PACKED_TOL = {"float32": 1e-4, "bfloat16": 5e-2}


def kernels() -> str:
    """Which of the optional GPU kernels are importable (``mamba_ssm``, ``causal_conv1d``, ``flash_attn``)."""
    return ", ".join(f"{m} {'yes' if importlib.util.find_spec(m) else 'no'}"
                     for m in ("mamba_ssm", "causal_conv1d", "flash_attn"))


def packed_vs_alone(family: str, vocab: int, device: str, dtype: str, attn: str) -> float:
    """max |logits of a 3-document pack (:func:`tests.tiny_lm.packed_row`) - each document alone| of the tiny
    ``family`` in ``dtype`` with attention implementation ``attn``, over every document's tokens."""
    from packing.dataset import collate_packed
    from stages.sft import packed_forward
    from tests.tiny_lm import DOCS, FAMILIES, packed_row

    model = FAMILIES[family](vocab, seed=0, attn_implementation=attn).to(device, getattr(torch, dtype)).eval()
    batch = {k: v.to(device) for k, v in collate_packed([packed_row()]).items()}
    with torch.no_grad():
        packed = packed_forward(model, batch)[0].float()
        start, worst = 0, 0.0
        for doc in DOCS:
            alone = model(input_ids=torch.as_tensor(doc, device=device)[None], use_cache=False).logits[0].float()
            worst = max(worst, float((packed[start:start + len(doc)] - alone).abs().max()))
            start += len(doc)
    return worst


def serves(model_dir: Path, engine: str, device: str) -> tuple[bool, str]:
    """Whether the ``engine`` rollout engine serves ``model_dir``: its greedy tokens equal the ``hf``
    engine's on the same weights (fp32, 2 prompts x 8 tokens); ``(False, error)`` where it cannot start."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stages.rollout import SamplingConfig, make_rollout_engine

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    sampling = SamplingConfig(max_new_tokens=8)
    prompts = [[5, 6, 7, 8], [9, 10]]
    want = make_rollout_engine("hf", model, tok, sampling).generate(prompts, 1, greedy=True).response_ids
    try:
        rollout = make_rollout_engine(engine, model, tok, sampling, str(model_dir))
    except Exception as exc:  # noqa: BLE001 - the check reports why the engine cannot serve this family
        return False, f"{type(exc).__name__}: {exc}"
    try:
        got = rollout.generate(prompts, 1, greedy=True).response_ids
    finally:
        rollout.close()
    return got == want, f"greedy tokens {got} vs hf {want}"


def family_checks(family: str, data: Path, a) -> bool:
    """Print the ``check`` lines of ``family`` (module docstring); True when all pass. ``data``: its
    :func:`tests.resume_job.prepare` directory (``init`` holds the tiny model)."""
    from tests.tiny_lm import smollm2_tokenizer

    vocab, results = len(smollm2_tokenizer()), []
    runs = [("float32", "sdpa")] + ([("bfloat16", "flash_attention_2")] if a.device == "cuda"
                                    and importlib.util.find_spec("flash_attn") else [])
    for dtype, attn in runs:
        worst = packed_vs_alone(family, vocab, a.device, dtype, attn)
        results.append((f"packed forward = documents alone ({dtype}, {attn}; {kernels()}): max |diff| {worst:.3g}",
                        worst <= PACKED_TOL[dtype]))
    if a.engine != "hf":
        ok, detail = serves(data / "init", a.engine, a.device)
        results.append((f"{a.engine} engine serves it: {detail}", ok))
    for text, ok in results:
        print(f"check {family}: {text}: {'ok' if ok else 'FAIL'}", flush=True)
    return all(ok for _, ok in results)


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
    ap.add_argument("--families", nargs="*", default=["nemotron_h", "qwen3_moe"], choices=("nemotron_h", "qwen3_moe"))
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda, but torch sees no GPU; on a CPU host run it with --device cpu --engine hf",
              file=sys.stderr)
        return 1
    from stages import distributed
    from tests import resume_job

    distributed.init()
    passed = True
    with tempfile.TemporaryDirectory() as tmp:
        # every rank prepares the same small data in its own directory (no shared file system assumed)
        for family in [None, *a.families]:
            data = Path(tmp) / f"data_{family or 'llama'}"
            resume_job.prepare(data, family or "llama")
            model = data / "init" if family else a.model or data / "init"
            if family and distributed.is_main():
                passed = family_checks(family, data, a) and passed
            for runner in a.runners:
                got = run_stage(runner, data, Path(tmp) / f"{runner}_{family}", model, a)
                if distributed.is_main():
                    print(f"{runner}: {got['tokens_per_s']:.1f} tokens/s, peak GPU memory {got['peak_mib']:.0f} MiB, "
                          f"{got['wall_s']:.1f} s ({a.device}, {a.dtype}, {a.engine} rollouts, {a.train_engine}"
                          f"{f' ZeRO-{a.zero_stage}' if a.train_engine == 'deepspeed' else ''}, "
                          f"{distributed.world_size()} rank(s), model {family or model.name})", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

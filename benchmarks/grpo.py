"""GRPO step time against TRL's GRPOTrainer, and SFT throughput on packed vs padded rows.

    python -m benchmarks.grpo [--only grpo|sft] [--threads N] [--dtype float32|bfloat16] [--repeat 3] [--steps 5]
                              [--warmup 1] [--param-dtype float32|bfloat16] [--attn sdpa|eager] [--vllm-compile]
                              [--vllm-own-processes]
                              [--prompts 4] [--group 8] [--max-new-tokens 32] [--model tiny|DIR]
                              [--engines hf vllm] [--sft-rows 96]

Needs ``data/assets/SmolLM2-135M-Instruct`` (tokenizer), ``data/sets/sft/train.parquet`` and TRL
(``pip install -e .[bench]``). Prints two tables:

1. one GRPO step (generate ``prompts x group`` responses of ``max-new-tokens`` tokens, reward, advantages, one
   forward/backward, one AdamW step) with the same tiny Llama built from a config (SmolLM2 tokenizer; ``--model
   DIR``: that checkpoint, e.g. SmolLM2-135M-Instruct), same prompts, batch and lengths:
   ``stages.grpo.GRPOStage`` (rollouts on each of ``--engines``) against ``trl.GRPOTrainer``
   (``use_vllm=False``, ``beta=0``, one generation per step; ``bf16`` as ``--dtype``). Dynamic filtering and
   truncation masking are off in ours so both train on every response. Median seconds per step of ``--steps``
   steps after ``--warmup`` untimed ones (each side; ours takes ~3 steps to reach its steady step: 8.4, 6.9, 5.9
   s, then 5.2-6.0 s in one 8-step run of SmolLM2, its forward 2.3, 3.4, 1.6, then 1.1-1.3 s), per run;
   ``--repeat N`` runs the pair N times, each pair in a fresh process (in one process our step grew slower run
   after run, 7.0 -> 8.3 -> 9.0 s), and prints the ratio's min / median / max and where our step's time goes
   (sampling, reward, backward + AdamW, weight push), and each side's model work (:func:`step_work`): their
   ratio is the time ratio at equal FLOP rates.
2. SFT forward+backward+AdamW over the same real SFT conversations (ChatML, SmolLM2 tokenizer,
   assistant-only labels): packed into rows of ``--pack-length`` tokens (best-fit decreasing,
   document-local causal mask) against batches of ``--batch`` conversations padded to their
   longest. Throughput counts real (non-pad) tokens.

Each side runs in a process of its own: ours with the allocator ``cascade train`` preloads (``--malloc``,
default TCMalloc where installed: :mod:`common.allocator`), TRL with the C library's (``--trl-malloc tcmalloc``
gives it ours). ``--param-dtype bfloat16``: our policy holds bf16 parameters with fp32 masters (TRL's ``bf16``
keeps fp32 weights under autocast); ``--attn``: both sides' attention kernel; ``--vllm-compile``: our vllm
engine compiled (its start, a minute, is not in the step times); ``--vllm-own-processes``: our engine in
processes of its own (``vllm.multiprocessing: true``, what data-parallel ranks get) instead of the trainer's.
``--only`` runs one table. ``--threads N`` is the thread budget of each side (default: every core): the process
is pinned to its first N cores, torch gets N threads, and ours binds its vllm engine to the same N cores (its
trainer and engine take turns on them). Every run is followed by the machine's load average (``os.getloadavg``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from rich.console import Console
from rich.table import Table

from benchmarks.trl_timer import fresh_call, fresh_runs, malloc_note, ratio_summary, side_env, use_cores

REPO = Path(__file__).resolve().parents[1]
ASSET = REPO / "data" / "assets" / "SmolLM2-135M-Instruct"
PHASES = ("step_s", "generate_s", "score_s", "train_s", "sync_s")  # a step's wall time and its parts (CSV columns)
PROMPTS = ["Say yes.", "Name a colour.", "Count to three.", "Greet me.", "What is 2+2?", "Pick a fruit.",
           "Say no.", "Name an animal."]


def tiny_model(tok, hidden: int, layers: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))


def reward(text: str) -> float:
    """A deterministic reward with variance inside groups: 1 when the response has an even length."""
    return float(len(text) % 2 == 0)


def ours(tok, model_dir: Path, work: Path, a, engine: str) -> list[dict[str, float]]:
    from common.io import write_parquet
    from stages.environment import FunctionEnvironment
    from stages.grpo import GRPOConfig, GRPOStage
    from tests.rows import rl_table

    table = rl_table(PROMPTS[:a.prompts])
    for split in ("train", "validation"):
        write_parquet(table, work / "set" / f"{split}.parquet")
    cfg = GRPOConfig(name=f"bench_{engine}", runner="grpo", rollout_engine=engine, datasets=[str(work / "set")],
                     steps=a.steps + a.warmup, threads=a.threads, dtype=a.dtype, param_dtype=a.param_dtype,
                     attn_implementation=a.attn,
                     prompts_per_step=a.prompts, group_size=a.group, micro_batch_size=a.prompts * a.group,
                     dynamic_filtering=False, mask_truncated=False,
                     sampling={"max_new_tokens": a.max_new_tokens, "batch_size": a.prompts * a.group,
                               "vllm": {"enforce_eager": not a.vllm_compile,
                                        "multiprocessing": True if a.vllm_own_processes else None}},
                     optim={"lr": 1e-5}, checkpoint_root=str(work / "ck"), metrics_dir=str(work / "m"),
                     plots_dir=str(work / "p"))
    env = FunctionEnvironment(lambda text, row: reward(text))
    GRPOStage(cfg, environment=env).run(cfg.datasets, model_dir)
    import csv

    return [{k: float(r[k]) for k in (*PHASES, "response_tokens")}
            for r in csv.DictReader((work / "p" / f"bench_{engine}.csv").open())][a.warmup:]


def trl(tok, model_dir: Path, work: Path, a) -> tuple[list[float], float]:
    """TRL's seconds per step after the ``--warmup`` steps, and its mean completion length (tokens)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.trl_timer import step_timer

    prompts = [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[:a.prompts]]
    ds = Dataset.from_list(prompts * (a.steps + a.warmup))
    args = GRPOConfig(output_dir=str(work / "trl"), per_device_train_batch_size=a.prompts * a.group,
                      num_generations=a.group, max_completion_length=a.max_new_tokens, use_vllm=False,
                      bf16=a.dtype == "bfloat16",
                      beta=0.0, learning_rate=1e-5, max_steps=a.steps + a.warmup, logging_steps=1, save_strategy="no",
                      report_to="none", use_cpu=True, temperature=1.0, top_p=1.0, top_k=0, seed=0,
                      disable_tqdm=True, dataloader_num_workers=0, shuffle_dataset=False)
    timer = step_timer()
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=a.attn),
                          processing_class=tok,
                          reward_funcs=[lambda completions, **kw: [reward(c[0]["content"]) for c in completions]],
                          args=args, train_dataset=ds, callbacks=[timer])
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return timer.times[a.warmup:], statistics.mean(lengths[a.warmup:])


def step_work(prompt_tokens: list[int], group: int, response: float, shared: bool, prompt_cost: float) -> float:
    """A GRPO step's model work in forward-token equivalents (a token's forward costs ~2N FLOPs for N
    parameters, its backward ~4N: Kaplan et al. 2020, sec. 2.1), attention ignored: sampling prefills
    the prompts and decodes ``group`` responses of ``response`` tokens (mean) per prompt, and training
    runs forward + backward (3) over the trained rows. A prompt token costs ``prompt_cost`` of a
    response token (:func:`prompt_cost`: both sides skip the LM head on prompt tokens). ``shared``:
    ours, where each prompt is prefilled once (vLLM's ``n`` samples of one request) and forwarded once
    per step (the prompt-shared forward); else TRL's, where each of the ``group`` rows repeats its prompt
    in generate and in training."""
    prompts = sum(prompt_tokens) * (1 if shared else group) * prompt_cost
    responses = len(prompt_tokens) * group * response
    return prompts + responses + 3 * (prompts + responses)


def prompt_cost(model_dir: Path) -> float:
    """The body's share of a token's matmul parameters, (N - embedding) / (N - embedding + LM head): the
    cost of a token whose logits are not computed, relative to one whose are."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    body = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight.numel()
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        body -= head  # an untied head is among the parameters
    return body / (body + head)


def sft_docs(tok, rows: int, max_len: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    from packing.tokenize import ChatTokenizer, TokenizedDoc

    table = pq.read_table(REPO / "data" / "sets" / "sft" / "train.parquet").to_pylist()
    random.Random(seed).shuffle(table)
    ct, docs = ChatTokenizer(tok), []
    for start in range(0, len(table), 64):
        for d in ct.tokenize(table[start:start + 64]):
            if isinstance(d, TokenizedDoc) and len(d) <= max_len and d.loss_mask.any():
                docs.append((d.input_ids.astype(np.int64), d.loss_mask.astype(bool)))
        if len(docs) >= rows:
            return docs[:rows]
    return docs


def sft_throughput(model, batches: list[dict[str, torch.Tensor]], packed: bool) -> tuple[float, int, int]:
    from stages.losses import sft_loss
    from stages.sft import packed_forward
    from stages.train_engine import OptimConfig, TorchEngine

    engine = TorchEngine(model, OptimConfig(lr=1e-5), len(batches))
    real = sum(int(b["real"]) for b in batches)
    seen = sum(b["input_ids"].numel() for b in batches)
    t0 = time.perf_counter()
    for b in batches:
        if packed:  # the SFT stage's forward: SDPA per document
            logits = packed_forward(model, b)
        else:
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                           position_ids=b["position_ids"]).logits
        loss, _ = sft_loss(logits, b["labels"], position_ids=b["position_ids"] if packed else None)
        engine.backward(loss)
        engine.step()
    return time.perf_counter() - t0, real, seen


def sft_batches(docs, pack_length: int, batch: int, pad_id: int):
    from packing.dataset import collate_packed
    from packing.plan import plan_packs
    from packing.writer import assemble_pack

    plan = plan_packs([len(d[0]) for d in docs], pack_length)
    packs = []
    for idx in plan.packs:
        row = assemble_pack([docs[i][0] for i in idx], [docs[i][1] for i in idx], [str(i) for i in idx])
        packs.append({k: torch.from_numpy(row[k].astype("int64")) for k in ("input_ids", "labels", "position_ids")}
                     | {"cu_seqlens": torch.from_numpy(row["cu_seqlens"])})
    packed = []
    for i in range(0, len(packs), batch):
        b = collate_packed(packs[i:i + batch], pad_id)
        b["real"] = sum(len(p["input_ids"]) for p in packs[i:i + batch])
        packed.append(b)
    padded = []
    for i in range(0, len(docs), batch):
        chunk = docs[i:i + batch]
        width = max(len(d[0]) for d in chunk)
        ids = torch.full((len(chunk), width), pad_id)
        labels = torch.full((len(chunk), width), -100)
        att = torch.zeros(len(chunk), width, dtype=torch.long)
        for r, (x, m) in enumerate(chunk):
            ids[r, :len(x)] = torch.from_numpy(x)
            labels[r, :len(x)] = torch.from_numpy(np.where(m, x, -100))
            att[r, :len(x)] = 1
        padded.append({"input_ids": ids, "labels": labels, "attention_mask": att,
                       "position_ids": torch.arange(width).expand(len(chunk), -1),
                       "real": sum(len(d[0]) for d in chunk)})
    return packed, padded, plan.efficiency


def load_note() -> str:
    """The 1/5/15-minute load averages, printed next to every timing."""
    return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_model(tok, a, path: Path, seed: int = 0, hidden: int | None = None) -> str:
    """Write the benchmark's model to ``path`` (``--model tiny``: a Llama built from a config; else a
    copy of the HF checkpoint ``--model``); returns its description."""
    import shutil

    if a.model == "tiny":
        tiny_model(tok, hidden or a.hidden, 2, seed).save_pretrained(path)
        tok.save_pretrained(path)
        return f"Llama hidden {hidden or a.hidden} x 2 layers"
    shutil.copytree(a.model, path)
    return Path(a.model).name


def grpo_pair(a) -> tuple[dict[str, list[dict[str, float]]], list[float], str, float, float, str]:
    """One run of each side on a fresh copy of the model, each side in a process of its own with its
    allocator (``--malloc``, ``--trl-malloc``): ({engine: our step rows}, TRL step seconds, the load average
    after, TRL's mean completion length, :func:`prompt_cost`, the model's description)."""
    from transformers import AutoTokenizer

    use_cores(a.threads)
    tok = AutoTokenizer.from_pretrained(ASSET)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = bench_model(tok, a, work / "model")
        ours_rows = {engine: fresh_call(side, ("ours", a, work, engine), side_env(a.malloc)) for engine in a.engines}
        trl_t, trl_len = fresh_call(side, ("trl", a, work, None), side_env(a.trl_malloc))
        return ours_rows, trl_t, load_note(), trl_len, prompt_cost(work / "model"), model


def side(job: tuple[str, argparse.Namespace, Path, str | None]) -> Any:
    """One side of :func:`grpo_pair` in its own process: ``(name, args, work dir, engine)``."""
    from transformers import AutoTokenizer

    name, a, work, engine = job
    use_cores(a.threads)
    tok = AutoTokenizer.from_pretrained(ASSET)
    return ours(tok, work / "model", work, a, engine) if name == "ours" else trl(tok, work / "model", work, a)


def grpo_table(tok, a, console: Console) -> None:
    runs = fresh_runs(grpo_pair, a, a.repeat)
    model, cost = runs[0][5], runs[0][4]
    t = Table(title=f"GRPO step: {a.prompts} prompts x {a.group} samples x {a.max_new_tokens} new tokens, {model}, "
                    f"{a.dtype} (ours: {a.param_dtype} parameters), {a.attn} attention, {a.steps} timed steps after "
                    f"{a.warmup}; "
                    f"{a.threads} core(s) each side (ours: trainer threads and vLLM binding, by phase; TRL: torch threads); "
                    f"allocator ours {malloc_note(a.malloc)}, TRL {malloc_note(a.trl_malloc)}")
    for col in ("run", "implementation", "median s/step", "min s/step", "max s/step", "ours / TRL", "load after"):
        t.add_column(col, justify="left" if col in ("implementation", "load after") else "right")
    ratios: dict[str, list[float]] = {engine: [] for engine in a.engines}
    for run, (ours_rows, trl_t, load, *_) in enumerate(runs, 1):
        trl_med = statistics.median(trl_t)
        for engine, rows in ours_rows.items():
            times = [r["step_s"] for r in rows]
            ratios[engine].append(statistics.median(times) / trl_med)
            own = ", processes of its own" if engine == "vllm" and a.vllm_own_processes else ""
            t.add_row(str(run), f"cascade-rl stages.grpo ({engine} engine{own})", *spread(times),
                      f"{ratios[engine][-1]:.2f}", load)
        t.add_row(str(run), "trl.GRPOTrainer (HF generate)", *spread(trl_t), "", load)
    console.print(t)
    prompt_tokens = [len(tok(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                     add_generation_prompt=True), add_special_tokens=False).input_ids)
                     for p in PROMPTS[:a.prompts]]
    trl_len = statistics.median(r[3] for r in runs)
    trl_w = step_work(prompt_tokens, a.group, trl_len, False, cost)
    for engine in a.engines:
        console.print(f"ours ({engine}) / TRL over {a.repeat} runs: {ratio_summary(ratios[engine])}")
        parts = {k: statistics.median(r[k] for rows, *_ in runs for r in rows[engine])
                 for k in (*PHASES, "response_tokens")}
        console.print(f"  median per step: sampling {parts['generate_s']:.2f} s, reward {parts['score_s']:.2f} s, "
                      f"backward + AdamW {parts['train_s']:.2f} s, weight push {parts['sync_s']:.2f} s "
                      f"(step {parts['step_s']:.2f} s)")
        ours_w = step_work(prompt_tokens, a.group, parts["response_tokens"], True, cost)
        console.print(f"  model work per step (forward-token equivalents; prompts {prompt_tokens} tokens, mean "
                      f"response ours {parts['response_tokens']:.1f}, TRL {trl_len:.1f}; a prompt token costs "
                      f"{cost:.2f} of a response token): ours {ours_w:,.0f}, "
                      f"TRL {trl_w:,.0f}, ratio {ours_w / trl_w:.2f}: the time ratio at equal FLOP rates")


def spread(times: list[float]) -> tuple[str, str, str]:
    """Median, min and max of ``times`` (seconds), formatted."""
    return f"{statistics.median(times):.3f}", f"{min(times):.3f}", f"{max(times):.3f}"


def sft_table(tok, a, console: Console) -> None:
    docs = sft_docs(tok, a.sft_rows, a.pack_length)
    packed, padded, eff = sft_batches(docs, a.pack_length, a.batch, tok.pad_token_id)
    t = Table(title=f"SFT on {len(docs)} real conversations ({sum(len(d[0]) for d in docs)} tokens), "
                    f"Llama hidden 256 x 4 layers, fwd+bwd+AdamW, {a.threads} thread(s)")
    for col in ("layout", "batches", "tokens computed", "real tokens", "seconds", "real tokens/s"):
        t.add_column(col, justify="right" if col != "layout" else "left")
    rates = {}
    for name, batches, is_packed in ((f"packed ({a.pack_length}, BFD {eff:.1%} full)", packed, True),
                                     (f"padded (batch {a.batch})", padded, False)):
        secs, real, seen = sft_throughput(tiny_model(tok, 256, 4), batches, is_packed)
        rates[is_packed] = real / secs
        t.add_row(name, str(len(batches)), str(seen), str(real), f"{secs:.1f}", f"{real / secs:,.0f}")
    console.print(t)
    console.print(f"packed / padded tokens/s: {rates[True] / rates[False]:.2f}x ({load_note()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("grpo", "sft"), help="run one table (default: both)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="cores each side may use (default: all): the process is pinned to the first N")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="both GRPO trainers' precision")
    ap.add_argument("--param-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="ours: the policy's parameter dtype (bfloat16: bf16 weights, fp32 masters; TRL's bf16 "
                         "keeps fp32 weights under autocast)")
    ap.add_argument("--vllm-compile", action="store_true",
                    help="ours: the vllm engine compiled (enforce_eager false; a minute more to start, not timed)")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                    help="both sides' attention kernel (transformers' attn_implementation)")
    ap.add_argument("--repeat", type=int, default=1, help="GRPO: ours/TRL pairs run one after the other")
    ap.add_argument("--malloc", default="tcmalloc", help="ours: the allocator `cascade train` preloads "
                    "(common/allocator.py: tcmalloc, system or a library path)")
    ap.add_argument("--trl-malloc", default="system", help="TRL's allocator (default: the C library's, as "
                    "`python train.py` runs); tcmalloc gives it ours")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per side and run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before them (each side)")
    ap.add_argument("--vllm-own-processes", action="store_true",
                    help="ours: the vllm engine in processes of its own (default: in the trainer's process)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--model", default="tiny", help="tiny (a Llama of --hidden) or an HF checkpoint dir (SmolLM2)")
    ap.add_argument("--engines", nargs="+", default=["hf"], choices=("hf", "vllm"), help="our rollout engine(s)")
    ap.add_argument("--sft-rows", type=int, default=96)
    ap.add_argument("--pack-length", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    use_cores(a.threads)
    tok = AutoTokenizer.from_pretrained(ASSET)
    console = Console(width=160)
    if a.only in (None, "grpo"):
        grpo_table(tok, a, console)
    if a.only in (None, "sft"):
        sft_table(tok, a, console)


if __name__ == "__main__":
    main()

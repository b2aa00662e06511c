"""Rollout throughput: the vllm engine against the hf engine on SmolLM2-135M-Instruct, same prompts, same run.

    python -m benchmarks.rollout [--quick] [--sizes 64 256] [--max-new-tokens 64] [--n 4]
                                 [--dtypes bfloat16 float32] [--hf-threads 1 2]

Prompts are real RL prompts (``data/sets/rl/*/train.parquet`` through the RL stages' prompt builder,
the first ones of at most 256 tokens, round-robin over the sets), ``n`` samples each at temperature 1,
top-p 1. Per size (sequences per ``generate`` call: ``size / n`` prompts x ``n``), each engine runs a
warm-up call (vllm: the same shapes on other prompts; hf: one prompt), then one timed call; tokens/s
counts sampled response tokens (EOS included) over wall time.

- ``vllm``: :class:`stages.vllm_engine.VLLMRolloutEngine` per ``--dtypes`` (eager; its engine start
  is reported apart, paid once per stage).
- ``hf``: :class:`stages.rollout.HFRolloutEngine` (fp32, ``batch_size`` = the size) at each of
  ``--hf-threads`` torch threads; the best is the peer.
- ``bound``: FLOPs per generated token (2 x parameters incl. the LM head, + attention over the
  mean context, Kaplan et al. 2020 C_forward) divided by the measured dense matmul throughput of this
  machine in that dtype (all cores, 1024^3 GEMMs): what these cores could do if decoding were
  compute-bound.

``--quick``: 16 prompts x 4 samples x 64 tokens (one size, 64), bf16 and hf at 1 and 2 threads,
under 5 minutes here. The last line reads ``tokens/s: vllm=<x> hf=<y>`` (64 sequences per call,
vllm in the first dtype, hf the best thread count).
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
ASSET = REPO / "data" / "assets" / "SmolLM2-135M-Instruct"


def real_prompts(tok, count: int, max_tokens: int = 256) -> list[list[int]]:
    """``count`` chat-templated prompts of at most ``max_tokens`` tokens from the RL sets' train splits
    (round-robin over the sets, SWE excluded), as the RL stages build them."""
    import polars as pl

    from stages.environment import PromptBuilder, PromptTooLong

    builder = PromptBuilder(tok, max_prompt_tokens=max_tokens)
    pools = []
    for f in sorted((REPO / "data" / "sets" / "rl").glob("*/train.parquet")):
        ids = []
        for row in pl.read_parquet(f).to_dicts():
            if row["agent_ref"] == "swe":
                break
            try:
                ids.append(builder(row))
            except PromptTooLong:
                continue
        if ids:
            pools.append(ids)
    out = [pool[i] for i in range(count) for pool in pools if i < len(pool)][:count]
    if len(out) < count:
        raise SystemExit(f"only {len(out)} RL prompts <= {max_tokens} tokens: run `dvc repro build` first")
    return out


@functools.cache
def matmul_flops(dtype: torch.dtype, size: int = 1024, reps: int = 8) -> float:
    """Measured dense GEMM throughput (FLOP/s) in ``dtype`` on all of this process's cores (once per dtype)."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * size**3 * reps / (time.perf_counter() - t)


def flops_per_token(config, context: float) -> float:
    """Forward FLOPs of one decoded token: 2 x (non-embedding parameters + LM head) + attention
    (2 x layers x context x hidden, Kaplan et al. 2020, Table 1)."""
    h, layers, inter, v = config.hidden_size, config.num_hidden_layers, config.intermediate_size, config.vocab_size
    kv = h * config.num_key_value_heads // config.num_attention_heads
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * inter  # q, o; k, v; gate, up, down
    return 2 * (layers * per_layer + v * h) + 2 * layers * context * h


def timed(engine, prompts, warm, n, max_new_tokens, warm_tokens: int | None = None) -> tuple[float, int, float]:
    """(tokens/s, tokens, mean context) of one timed ``generate`` after a warm-up call on ``warm``
    (``warm_tokens`` new tokens, default ``max_new_tokens``)."""
    engine.generate(warm, n=n, max_new_tokens=warm_tokens or max_new_tokens, seed=1)
    t = time.perf_counter()
    ro = engine.generate(prompts, n=n, max_new_tokens=max_new_tokens, seed=2)
    dt = time.perf_counter() - t
    tokens = sum(map(len, ro.response_ids))
    context = sum(len(p) + len(r) / 2 for p, r in zip(ro.prompt_ids, ro.response_ids, strict=True)) / len(ro)
    return tokens / dt, tokens, context


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--hf-threads", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args()
    if a.quick:
        a.sizes, a.dtypes = [64], a.dtypes[:1]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stages.rollout import HFRolloutEngine, SamplingConfig, VLLMOptions
    from stages.vllm_engine import VLLMRolloutEngine

    tok = AutoTokenizer.from_pretrained(ASSET)
    model = AutoModelForCausalLM.from_pretrained(ASSET, dtype=torch.float32).eval()
    biggest = max(a.sizes) // a.n
    prompts = real_prompts(tok, 2 * biggest)
    warm, timed_prompts = prompts[:biggest], prompts[biggest:]
    results: dict[tuple[str, int], float] = {}
    threads = torch.get_num_threads()
    for dtype in a.dtypes:
        sampling = SamplingConfig(max_new_tokens=a.max_new_tokens, vllm=VLLMOptions(dtype=dtype))
        t = time.perf_counter()
        engine = VLLMRolloutEngine(str(ASSET), tok, sampling, model.generation_config.eos_token_id)
        start_s = time.perf_counter() - t
        try:
            for size in a.sizes:
                k = size // a.n
                tps, tokens, ctx = timed(engine, timed_prompts[:k], warm[:k], a.n, a.max_new_tokens)  # same shapes
                results[(f"vllm-{dtype}", size)] = tps
                torch.set_num_threads(threads)
                bound = matmul_flops(getattr(torch, dtype)) / flops_per_token(model.config, ctx)
                print(f"vllm {dtype:8s} seqs/call {size:4d} tokens {tokens:6d} tokens/s {tps:8.1f} "
                             f"bound {bound:8.0f} (engine start {start_s:.0f} s)", flush=True)
        finally:
            engine.close()
    for size in a.sizes:
        k = size // a.n
        for th in a.hf_threads:
            torch.set_num_threads(th)
            hf = HFRolloutEngine(model, tok, SamplingConfig(max_new_tokens=a.max_new_tokens, batch_size=size))
            tps, tokens, ctx = timed(hf, timed_prompts[:k], warm[:1], a.n, a.max_new_tokens, 4)  # a small warm-up
            results[("hf", size)] = max(results.get(("hf", size), 0.0), tps)
            torch.set_num_threads(threads)
            bound = matmul_flops(torch.float32) / flops_per_token(model.config, ctx)
            print(f"hf   float32  seqs/call {size:4d} tokens {tokens:6d} tokens/s {tps:8.1f} "
                         f"bound {bound:8.0f} ({th} threads)", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for dtype in a.dtypes:
        for size in a.sizes:
            v, h = results[(f"vllm-{dtype}", size)], results[("hf", size)]
            print(f"seqs/call {size:4d}: vllm {dtype} / hf = {v / h:.2f}x")
    head = a.sizes[0]
    print(f"tokens/s: vllm={results[(f'vllm-{a.dtypes[0]}', head)]:.1f} hf={results[('hf', head)]:.1f}")


if __name__ == "__main__":
    main()

"""Peak memory and speed of one packed SFT step with activation checkpointing on and off.

    python -m benchmarks.checkpointing [--lengths 4096 16384 65536] [--hidden 128] [--threads 2]

One optimizer-free SFT step (:func:`stages.sft.accumulate_sft`: the packed forward with per-document
attention, the chunked LM-head loss and the backward) on one pack of ``L`` tokens, on a tiny NemotronH
(tests/tiny_lm.py: Mamba-2, attention, MoE and MLP blocks; ``--hidden`` wide, a 4,096-token
vocabulary and 512-token loss chunks so that the activations, not the LM head, dominate; Mamba scan
chunks of 32 tokens, where the test model's 8 would make the PyTorch path's ``(T / chunk)^2`` term
dominate), fp32 on
the CPU, with ``stages.train_engine.checkpoint_activations`` and without. The pack holds documents of
300-3,000 tokens (log-uniform; the last one cut to fit), each supervised on its second half.

Each configuration runs in a process of its own, after a 512-token warm-up step: its peak memory is
the process's high-water mark of resident memory during the step (``VmHWM``, reset through
``/proc/self/clear_refs`` right before it) minus its resident memory before the step (model,
gradients of the warm-up, the batch). Prints a markdown table with the on/off ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch

VOCAB = 4096
LOSS_CHUNK = 512
MAMBA_CHUNK = 32  # the torch path's scan chunk: [T x chunk] intra-chunk and [(T / chunk)^2] inter-chunk terms


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(key + ":"))


def pack(length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A collated pack of ``length`` tokens: documents of 300-3,000 tokens, supervised on their second half."""
    from packing.dataset import collate_packed
    from packing.writer import assemble_pack

    rng = np.random.default_rng(seed)
    docs, total = [], 0
    while total < length:
        n = min(int(math.exp(rng.uniform(math.log(300), math.log(3000)))), length - total)
        docs.append(rng.integers(3, VOCAB, n))
        total += n
    masks = [(np.arange(len(d)) >= len(d) // 2).astype(int) for d in docs]
    row = assemble_pack(docs, masks, [str(i) for i in range(len(docs))])
    one = {k: torch.from_numpy(row[k].astype("int64")) for k in ("input_ids", "labels", "position_ids")}
    one["cu_seqlens"] = torch.from_numpy(row["cu_seqlens"])
    return collate_packed([one], 0)


def measure(length: int, checkpointing: bool, hidden: int) -> dict[str, float]:
    """One step in this process: ``{"peak_mib", "step_s", "tokens_per_s"}`` (MiB above the resident size
    before the step; seconds; pack tokens per second)."""
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    from stages.sft import accumulate_sft
    from stages.train_engine import checkpoint_activations
    from tests.tiny_lm import tiny_nemotron_h

    model = tiny_nemotron_h(VOCAB, seed=0, hidden=hidden).train()
    for module in model.modules():
        if isinstance(module, NemotronHMamba2Mixer):
            module.chunk_size = MAMBA_CHUNK
    if checkpointing:
        checkpoint_activations(model)

    def step(batch):
        return accumulate_sft(model, lambda loss: loss.backward(), [batch], LOSS_CHUNK)

    step(pack(512, seed=1))  # warm-up: lazy initializations, gradient buffers
    batch = pack(length)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current resident size
    base = _status_kib("VmRSS")
    t0 = time.perf_counter()
    step(batch)
    dt = time.perf_counter() - t0
    return {"peak_mib": (_status_kib("VmHWM") - base) / 1024, "step_s": dt, "tokens_per_s": length / dt}


def run_all(lengths: list[int], hidden: int, threads: int) -> list[dict]:
    """Every (length, on/off) in a subprocess of its own; the rows of the table."""
    rows = []
    for length in lengths:
        row = {"length": length}
        for on in (False, True):
            cmd = [sys.executable, "-m", "benchmarks.checkpointing", "--one", str(length), "--hidden", str(hidden)]
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            proc = subprocess.run([*cmd, *(["--on"] if on else [])], capture_output=True, text=True, env=env)
            if proc.returncode:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
            row["on" if on else "off"] = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{length} tokens done", file=sys.stderr)
    return rows


def table(rows: list[dict], hidden: int) -> str:
    """The markdown table of :func:`run_all`'s rows."""
    lines = [f"One packed SFT step, tiny NemotronH (hidden {hidden}, 5 blocks: Mamba-2, MoE, attention, Mamba-2, "
             f"MLP), fp32, CPU, {torch.get_num_threads()} threads",
             "",
             "| pack tokens | peak MiB off | peak MiB on | memory on/off | tokens/s off | tokens/s on | speed on/off |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        off, on = r["off"], r["on"]
        lines.append(f"| {r['length']:,} | {off['peak_mib']:,.0f} | {on['peak_mib']:,.0f} | "
                     f"{on['peak_mib'] / off['peak_mib']:.2f} | {off['tokens_per_s']:,.0f} | {on['tokens_per_s']:,.0f} | "
                     f"{on['tokens_per_s'] / off['tokens_per_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: one configuration
    ap.add_argument("--on", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.on, args.hidden)))
        return
    torch.set_num_threads(args.threads)
    print(table(run_all(args.lengths, args.hidden, args.threads), args.hidden))


if __name__ == "__main__":
    main()

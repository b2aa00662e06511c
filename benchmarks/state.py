"""What a resume costs: seconds to write and to load the training state of a model (stages/state.py).

    python -m benchmarks.state [--model data/assets/SmolLM2-135M-Instruct] [--repeats 3]

The model gets one AdamW step (so the optimizer holds its two moments), then the state is written
(:func:`stages.state.save_state`: weights, optimizer + scheduler, RNG, ``state.json`` with sha256 of
every file; temporary directory, then rename) and found and loaded again (:func:`stages.state.latest_state`
checks sizes and sha256; ``TrainEngine.load_state``). Median seconds of ``--repeats`` rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from stages.checkpoints import load_checkpoint
from stages.state import latest_state, save_state
from stages.train_engine import OptimConfig, make_train_engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="data/assets/SmolLM2-135M-Instruct")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    model, _ = load_checkpoint(a.model)
    engine = make_train_engine("torch", model, OptimConfig(), total_steps=10)
    engine.model(input_ids=torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
    engine.step()
    payload = {"fingerprint": {}, "rows": [], "counts": {}, "extra": {}, "updates": 1, "cursor": 0}
    writes, loads = [], []
    with tempfile.TemporaryDirectory(dir=Path(a.model).parent) as tmp:
        for step in range(1, a.repeats + 1):
            t0 = time.perf_counter()
            path = save_state(Path(tmp), step, engine, payload, keep_last=1)
            t1 = time.perf_counter()
            found, _ = latest_state(Path(tmp), {}, "bench")
            engine.load_state(found)
            torch.load(found / "rng.pt", weights_only=False)
            writes.append(t1 - t0)
            loads.append(time.perf_counter() - t1)
        size, names = sum(f.stat().st_size for f in path.iterdir()), sorted(f.name for f in path.iterdir())
    print(f"model {a.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"state {size / 2**20:.0f} MiB ({', '.join(names)})")
    print(f"state: write={statistics.median(writes):.2f}s load={statistics.median(loads):.2f}s "
          f"(median of {a.repeats}; load includes the sha256 check)")


if __name__ == "__main__":
    main()

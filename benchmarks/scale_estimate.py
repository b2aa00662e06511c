"""What a corpus of NVIDIA's size would take, extrapolated from two runs of ``benchmarks/scale.py``.

    python -m benchmarks.scale_estimate RUNS.jsonl [--small 1] [--large 64] [--rows 24.8e6]
        [--tokens-per-row 14900] [--our-tokens-per-row 1225] [--cores 2 512]

For every step measured at both scales (``--small``, ``--large``; the lines of ``--json`` of
``benchmarks/scale.py``, local executor with 2 workers):

- **Work.** The large run's CPU seconds are split by Amdahl's law with its 2 workers: wall = s + p / 2
  and CPU = s + p give the parallel part p = 2 (CPU - wall) (clipped to [0, CPU]) and the serial part
  s = CPU - p, the driver's share (gathering, LSH resolution, detection, writes). Both are scaled by
  the corpus's tokens over the large run's: ``rows x tokens-per-row`` against ``rows_large x
  our-tokens-per-row`` (text-bound steps: shingles, n-grams, BPE, bytes written). Time on C cores:
  s x f + p x f / C. On Ray (``docs/ray.md``) the maps spread over the cluster's cores and the
  serial part stays on the driver.
- **Memory.** Peak RSS grows per row by (peak_large - peak_small) / (rows_large - rows_small); the
  estimate is peak_large + that x (rows - rows_large). This is the driver's memory on Ray too (the
  reduces gather per-row keys there). Longer rows add to the per-batch memory, which this ignores.

Defaults: NVIDIA's SFT release, 24.8M rows (``../shared/reference/nvidia-release.md``); 14.9K tokens a
row is the card's recipe (33k steps x 64 packs x 256K tokens over 1.5 epochs) divided by its rows, at
full packs; 1,225 tokens a row is this repository's default SFT data (``metrics/tokenize.json``:
26.75M tokens in 21,821 train rows).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def estimate(small: dict, large: dict, rows: float, work_factor: float, cores: list[int]) -> dict:
    """Serial and parallel CPU seconds at the target (scaled by ``work_factor``), hours on each of
    ``cores``, and the peak RSS extrapolated to ``rows`` (GB)."""
    parallel = min(max(2 * (large["cpu_s"] - large["wall_s"]), 0.0), large["cpu_s"])
    serial = large["cpu_s"] - parallel
    growth = (large["peak_rss_gb"] - small["peak_rss_gb"]) / (large["rows"] - small["rows"])
    return {"step": large["step"], "serial_h": serial * work_factor / 3600, "parallel_h": parallel * work_factor / 3600,
            "hours": {c: (serial + parallel / c) * work_factor / 3600 for c in cores},
            "gb_per_million_rows": growth * 1e6, "peak_gb": large["peak_rss_gb"] + growth * (rows - large["rows"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="JSON lines of benchmarks/scale.py --json")
    ap.add_argument("--small", type=int, default=1)
    ap.add_argument("--large", type=int, default=64)
    ap.add_argument("--rows", type=float, default=24.8e6)
    ap.add_argument("--tokens-per-row", type=float, default=14_900)
    ap.add_argument("--our-tokens-per-row", type=float, default=1_225)
    ap.add_argument("--cores", type=int, nargs="+", default=[2, 512])
    a = ap.parse_args()
    runs: dict[tuple[int, str], dict] = {}
    for path in a.runs:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if "error" not in r:
                runs[(r["scale"], r["step"])] = r  # a later line wins
    steps = [s for (scale, s) in runs if scale == a.large and (a.small, s) in runs]
    if not steps:
        raise SystemExit(f"no step measured at both --small {a.small} and --large {a.large} in {a.runs}")
    large_rows = runs[(a.large, steps[0])]["rows"]
    factor = a.rows * a.tokens_per_row / (large_rows * a.our_tokens_per_row)
    print(f"target: {a.rows:,.0f} rows x {a.tokens_per_row:,.0f} tokens = {factor:.0f}x the work of the "
          f"{a.large}x run ({large_rows:,} rows x {a.our_tokens_per_row:,.0f})")
    head = " ".join(f"{f'h on {c} cores':>15}" for c in a.cores)
    print(f"{'step':14} {'serial CPU h':>12} {'parallel CPU h':>14} {head} {'GB/M rows':>9} {'peak GB':>8}")
    total = {c: 0.0 for c in a.cores}
    for step in steps:
        e = estimate(runs[(a.small, step)], runs[(a.large, step)], a.rows, factor, a.cores)
        for c in a.cores:
            total[c] += e["hours"][c]
        print(f"{step:14} {e['serial_h']:12.1f} {e['parallel_h']:14.1f} "
              + " ".join(f"{e['hours'][c]:15.1f}" for c in a.cores)
              + f" {e['gb_per_million_rows']:9.2f} {e['peak_gb']:8.1f}")
    print(f"{'all steps':14} {'':12} {'':14} " + " ".join(f"{total[c]:15.1f}" for c in a.cores))


if __name__ == "__main__":
    main()

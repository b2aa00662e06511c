"""Time and peak RSS of ``common.take.take_rows`` in a random order, against the number of rows.

A random order is what pack (documents in pack order) and build (seeded shuffles) ask for: every run of
hits reaches every bucket of positions. Each size runs in its own process on a file of small rows (a
36-character uuid and two 8-element lists, like a tokenized document's columns), so the per-row costs of
the take (lookups, scatter passes, the scratch files' row groups) are not hidden behind the rows' bytes.

    python benchmarks/take.py [--rows 800000 3200000 12800000] [--code DIR] [--json F]

``--code DIR`` runs another checkout's ``common/take.py`` (a ``git worktree`` of the commit before a
change) on the same files, in the same session, for a before/after table. Prints rows, wall seconds,
CPU seconds and the peak RSS above the process's RSS before the take (MB); files go under
``$TMPDIR`` and are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
WIDTH = 8  # tokens per document


def write_file(path: Path, n: int) -> None:
    """``n`` rows: uuid (36 characters), input_ids int32 [WIDTH], loss_mask int8 [WIDTH]; 10,000-row groups."""
    offsets = pa.array(np.arange(0, (n + 1) * WIDTH, WIDTH, dtype=np.int32))
    pq.write_table(pa.table({
        "uuid": pa.array([f"{i:036d}" for i in range(n)]),
        "input_ids": pa.ListArray.from_arrays(offsets, pa.array(np.arange(n * WIDTH, dtype=np.int32))),
        "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(np.ones(n * WIDTH, np.int8)))}),
        path, row_group_size=10_000)


def measure(path: Path, n: int) -> dict:
    """Take every row of ``path`` in a seeded random order (256-row batches, as pack reads); check the order."""
    from common.take import take_rows

    proc, peak, done = psutil.Process(), [0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)

    order = np.random.default_rng(1).permutation(n)
    base = proc.memory_info().rss
    threading.Thread(target=poll, daemon=True).start()
    t0, c0, at = time.perf_counter(), time.process_time(), 0
    for frame in take_rows(path, rows=order, columns=["uuid", "input_ids", "loss_mask"], batch_rows=256):
        first = frame["input_ids"].list.first().to_numpy() // WIDTH
        if not np.array_equal(first, order[at:at + len(frame)]):
            raise AssertionError(f"rows {at}..{at + len(frame)} out of order")
        at += len(frame)
    done.set()
    if at != n:
        raise AssertionError(f"{at} rows back, {n} asked for")
    return {"rows": n, "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
            "peak_mb": round((peak[0] - base) / 1e6)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[800_000, 3_200_000, 12_800_000])
    ap.add_argument("--code", type=Path, help="checkout whose common/take.py runs (default: this one)")
    ap.add_argument("--json", type=Path, help="append each result as a JSON line here")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # FILE ROWS: measure in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(Path(args.one[0]), int(args.one[1]))))
        return
    code = str(args.code or REPO)
    print(f"{'rows':>10} {'wall s':>8} {'cpu s':>8} {'peak MB':>8}  code {code}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.rows:
            path = Path(tmp) / f"{n}.parquet"
            write_file(path, n)
            out = subprocess.run([sys.executable, __file__, "--one", str(path), str(n)], check=True, text=True,
                                 capture_output=True, env=dict(os.environ, PYTHONPATH=code)).stdout
            r = {**json.loads(out.strip().splitlines()[-1]), "code": code}
            print(f"{n:10d} {r['wall_s']:8.1f} {r['cpu_s']:8.1f} {r['peak_mb']:8d}", flush=True)
            if args.json:
                with args.json.open("a") as fh:
                    fh.write(json.dumps(r) + "\n")
            path.unlink()


if __name__ == "__main__":
    main()

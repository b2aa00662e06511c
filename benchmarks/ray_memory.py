"""Memory of the curation steps on Ray at N times the default sources.

Replicates ``data/ingested/{sft,rl}.parquet`` ``--replicas`` times (every copy gets new uuids,
uuid5 of the old uuid and the copy number; texts unchanged, so exact dedup removes the copies)
and runs ``cascade --executor ray dedup`` on it, then ``cascade --executor ray decontaminate`` on
the replicated tables themselves (all N copies reach the decontamination maps). A sampler polls
every process of the run (the driver and its descendants) every 0.2 s (psutil) and prints the peak
RSS of the driver, of each Ray worker process and of Ray's own daemons, with the object store limit
in force.

    python benchmarks/ray_memory.py [--replicas 10] [--object-store-mb 1024] [--num-cpus 2] [--local]

``--local`` also runs the steps with ``executor.kind: local`` for the driver's peak RSS. Needs
the default pipeline's ``data/ingested`` and ``data/decontam_index`` (``dvc repro decontam_index``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = uuid.UUID("6f1c7a52-0000-4000-8000-00000000ca5c")


def replicate(src: Path, dest: Path, copies: int) -> int:
    """Write ``copies`` copies of the parquet table ``src`` to ``dest`` with new uuids; returns rows."""
    f = pq.ParquetFile(src)
    rows = 0
    with pq.ParquetWriter(dest, f.schema_arrow, compression="zstd") as writer:
        for copy in range(copies):
            for batch in f.iter_batches(batch_size=10_000):
                ids = [str(uuid.uuid5(NAMESPACE, f"{u}:{copy}")) for u in batch.column("uuid").to_pylist()]
                table = pa.Table.from_batches([batch]).set_column(0, "uuid", pa.array(ids, pa.string()))
                writer.write_table(table)
                rows += len(ids)
    return rows


class Sampler(threading.Thread):
    """Peak RSS (bytes) per process of the run, polled every ``every`` seconds."""

    def __init__(self, every: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.every, self.peak, self.kind, self.stop = every, {}, {}, threading.Event()
        self.driver: int | None = None

    def classify(self, p: psutil.Process) -> str | None:
        if p.pid == self.driver:
            return "driver"
        cmd = " ".join(p.cmdline())
        if cmd.startswith("ray::_") or (cmd.startswith("ray::") and "Agent" in cmd.split()[0]):
            return "ray daemons"  # Ray Data's stats/autoscaling actors, dashboard and runtime-env agents
        if "default_worker.py" in cmd or cmd.startswith("ray::"):
            return "worker"  # task workers (ray::MapBatches(_apply), ray::ReadParquet..., ray::IDLE)
        if any(k in cmd for k in ("raylet", "gcs_server", "ray/_private", "ray/dashboard")):
            return "ray daemons"
        return None

    def processes(self) -> list[psutil.Process]:
        """The driver and its descendants (the local Ray it starts: raylet, GCS, workers), not other
        Ray sessions on the machine."""
        try:
            root = psutil.Process(self.driver)
            return [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, ValueError, TypeError):
            return []

    def run(self) -> None:
        while not self.stop.is_set():
            for p in self.processes():
                try:
                    kind = self.classify(p)
                    if kind:
                        self.kind[p.pid] = kind
                        self.peak[p.pid] = max(self.peak.get(p.pid, 0), p.memory_info().rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            time.sleep(self.every)

    def summary(self) -> dict[str, tuple[int, float]]:
        """``{kind: (processes, peak RSS MiB of the largest)}``, plus the sum over daemons."""
        out = {}
        for kind in ("driver", "worker", "ray daemons"):
            peaks = [v for pid, v in self.peak.items() if self.kind[pid] == kind]
            out[kind] = (len(peaks), max(peaks, default=0) / 2**20, sum(peaks) / 2**20)
        return out


def run_step(run: Path, step: str, kind: str) -> tuple[float, dict]:
    sampler = Sampler()
    sampler.start()
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "cascade"), "--executor", kind, step], cwd=run,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler.driver = proc.pid
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"cascade {step} ({kind}) failed:\n{err[-3000:]}")  # rows above are already printed
    return wall, sampler.summary()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=10)
    ap.add_argument("--object-store-mb", type=int, default=1024)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--local", action="store_true", help="also run with executor.kind local")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ray_memory."))
    try:
        (tmp / "data/ingested").mkdir(parents=True)
        rows = {k: replicate(REPO / f"data/ingested/{k}.parquet", tmp / f"data/ingested/{k}.parquet", args.replicas)
                for k in ("sft", "rl")}
        params = yaml.safe_load((REPO / "params.yaml").read_text())
        params["executor"] = {**(params.get("executor") or {}), "num_cpus": args.num_cpus,
                              "object_store_mb": args.object_store_mb}
        (tmp / "params.yaml").write_text(yaml.safe_dump(params))
        (tmp / "corpora").symlink_to(REPO / "corpora")
        (tmp / "data/decontam_index").symlink_to(REPO / "data/decontam_index")
        print(f"input: {args.replicas}x default sources: sft {rows['sft']} rows, rl {rows['rl']} rows; "
              f"local Ray num_cpus={args.num_cpus}, object store limit {args.object_store_mb} MiB")
        print(f"{'executor':8} {'step':13} {'wall s':>7} {'driver MiB':>10} {'workers':>7} "
              f"{'max worker MiB':>14} {'sum workers MiB':>15} {'ray daemons MiB':>15}", flush=True)
        for kind in ["ray"] + (["local"] if args.local else []):
            for step in ("dedup", "decontaminate"):
                if step == "decontaminate":  # every replicated row goes through the decontamination maps
                    shutil.rmtree(tmp / "data/dedup", ignore_errors=True)
                    (tmp / "data/dedup").symlink_to(tmp / "data/ingested")
                elif (tmp / "data/dedup").is_symlink():
                    (tmp / "data/dedup").unlink()
                wall, s = run_step(tmp, step, kind)
                print(f"{kind:8} {step:13} {wall:7.1f} {s['driver'][1]:10.0f} {s['worker'][0]:7d} "
                      f"{s['worker'][1]:14.0f} {s['worker'][2]:15.0f} {s['ray daemons'][2]:15.0f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

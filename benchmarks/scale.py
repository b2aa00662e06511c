"""Wall time, CPU time and peak RSS of every data step at N times the default data.

Replicates ``data/ingested/{sft,rl}.parquet`` N times into a scratch run directory (removed at the end;
``--keep`` keeps it for a post-mortem). Copy 0 is the
data itself; copy c > 0 gets new uuids (uuid5 of the old uuid and c) and per-copy text: after every
fourth token (the dedup tokens of :mod:`curation.ngrams`: a run of word characters, or one CJK
character), in every message content of the row, the copy's own marker word is inserted
(``... the answer is babebi ...``, ``x = f(a) babebi + b``), so every word 5-gram of the copy is new
and exact and near dedup keep the copy, code, LaTeX and JSON included, while the row's fields
and the verifier ground truth stay as they were. ``--mode near`` instead appends one marker word at the end of the
first message: the copies are near-duplicates of each other (clusters of N), which is what made
near-dedup's candidate pairs grow as N^2.

Then ``cascade <step>`` runs for each step in order in that directory (``data/sources``,
``data/assets`` and ``data/decontam_index`` are the repository's, linked). Per step: wall seconds,
CPU seconds (user + system of the step's process tree: the larger of ``getrusage`` of what it
waited for and the sum of a 0.2 s psutil poll's last reading per process), and the peak RSS: the
largest sum over the process tree seen by that poll.

    python benchmarks/scale.py --scales 1 16 [--steps dedup quality ...] [--mode distinct|near]
        [--executor local|ray] [--threads N] [--code DIR]
        [--input ingested|dedup|semdedup|decontaminated|tokenized]
        [--json docs/scale/after.json] [--keep] [--rerun DIR ...]

``--input decontaminated`` replicates decontaminate's output instead, for the steps from ``validate``
on (``--input semdedup``: semdedup's, from ``decontaminate`` on; ``--input dedup``: dedup's, from ``quality``
on; ``--input tokenized``: tokenize's documents with new uuids, for ``pack``). Rows of fewer than four dedup tokens get no
marker, so their copies are exact copies: in a whole chain dedup removes them, but from a replicated
decontaminate output ``validate`` fails on them (the RL suite's unique ``text_hash``: 15 short BFCL prompts
a copy); start at ``build`` there. ``--code DIR`` runs the steps from
another checkout (``PYTHONPATH=DIR``), e.g. a ``git worktree`` of the commit before a change, for a
before/after table on the same machine and data; ``--rerun DIR ...`` runs the steps again in run directories
``--keep`` kept (no replication: the other checkout's run on the same copies; ``--scales`` is ignored).
Needs the default pipeline's ``data/`` (``dvc repro export``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import polars as pl
import psutil
import pyarrow.parquet as pq
import yaml

from common.io import parquet_batches

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = uuid.UUID("6f1c7a52-0000-4000-8000-00000000ca5c")
SPLITS = ("train", "validation")  # the files of --input tokenized (the others: sft, rl)
STEPS = ("dedup", "quality", "semdedup", "decontaminate", "validate", "build", "export", "tokenize", "pack")
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
SYLLABLES = [c + v for c in CONSONANTS for v in VOWELS]  # 70

_CJK = r"\p{Han}\p{Hiragana}\p{Katakana}"
FOUR_TOKENS = rf"(?:(?:[{_CJK}]|[^\W{_CJK}]+)\W*){{4}}"  # four dedup tokens and what follows each


def marker(copy: int) -> str:
    """The copy's marker: a made-up word of three syllables (``babeda``), the copy's number in base 70, so
    every copy's marker is one dedup token of six letters and N copies are N times the text (a marker that
    grew with the copy number gave 64 copies 13 % more text a row than 16, and made every step look superlinear)."""
    n, k = len(SYLLABLES), copy - 1
    if not 0 <= k < n ** 3:
        raise ValueError(f"copy must be in [1, {n ** 3}], got {copy}")
    return SYLLABLES[k // n ** 2] + SYLLABLES[k // n % n] + SYLLABLES[k % n]


def _edit(content: pl.Expr, copy: int, mode: str, first: pl.Expr) -> pl.Expr:
    if mode == "near":
        return pl.when(first).then(content + f" {marker(copy)}").otherwise(content)
    return content.str.replace_all(FOUR_TOKENS, f"$0 {marker(copy)} ")


def _messages(col: pl.Expr, copy: int, mode: str) -> pl.Expr:
    return col.list.eval(pl.element().struct.with_fields(
        _edit(pl.element().struct.field("content"), copy, mode, pl.int_range(pl.len()) == 0).alias("content")))


def replicate(src: Path, dest: Path, copies: int, kind: str, mode: str) -> int:
    """Write ``copies`` copies of the table ``src`` to ``dest`` (see the module doc); returns rows."""
    schema = pq.ParquetFile(src).schema_arrow
    rows = 0
    with pq.ParquetWriter(dest, schema, compression="zstd") as writer:
        for copy in range(copies):
            for batch in parquet_batches(src, 10_000):
                df = pl.from_arrow(batch)
                if copy:
                    df = df.with_columns(pl.Series("uuid", [str(uuid.uuid5(NAMESPACE, f"{u}:{copy}"))
                                                            for u in df["uuid"]]))
                    if kind == "sft":
                        df = df.with_columns(_messages(pl.col("messages"), copy, mode))
                    elif kind == "rl":  # tokenized documents (train, validation) keep their tokens
                        df = df.with_columns(pl.col("responses_create_params").struct.with_fields(
                            _messages(pl.field("input"), copy, mode)))
                writer.write_table(df.to_arrow().cast(schema))
                rows += len(df)
    return rows


class TreePeak(threading.Thread):
    """Peak of the summed RSS (bytes) of a process and its descendants, and the CPU seconds of each
    (user + system, its last reading), polled every ``every`` s: a process that ends between two
    polls loses at most that interval of CPU (worker processes are not all waited for by the step,
    so ``getrusage`` misses them)."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.peak, self.done = pid, every, 0, threading.Event()
        self.cpu: dict[int, float] = {}

    def run(self) -> None:
        while not self.done.is_set():
            try:
                root = psutil.Process(self.pid)
                total = 0
                for p in (root, *root.children(recursive=True)):
                    try:
                        total += p.memory_info().rss
                        t = p.cpu_times()
                        self.cpu[p.pid] = t.user + t.system
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        continue
                self.peak = max(self.peak, total)
            except psutil.NoSuchProcess:
                pass
            time.sleep(self.every)


def run_step(run: Path, step: str, code: Path | None, executor: str) -> dict:
    """Run ``cascade <step>`` in ``run``; wall s, CPU s and peak RSS GB, or the error's tail."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", DVC_NO_ANALYTICS="1")
    if code:
        env["PYTHONPATH"] = str(code)
    cmd = [sys.executable, "-c", "import sys; from curation.cli import main; sys.exit(main())",
           "--executor", executor, step]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = TreePeak(proc.pid)
    peak.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    peak.done.set()
    peak.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = max((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), sum(peak.cpu.values()))
    out = {"step": step, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "peak_rss_gb": round(peak.peak / 1e9, 2)}
    if proc.returncode:
        out["error"] = err.strip().splitlines()[-1][-300:] if err.strip() else f"exit {proc.returncode}"
    elif step == "dedup":
        out["near"] = dedup_stats(run / "metrics/dedup.json")
    return out


def dedup_stats(path: Path) -> dict[str, dict[str, int]]:
    """Per table of dedup's metrics: rows in and out, exact duplicates, and near-dedup's verified pairs,
    largest candidate cluster and removals (whether its work grew with the rows or with the clusters)."""
    tables = json.loads(path.read_text())["per_table"]
    keys = ("verified_pairs", "largest_candidate_cluster", "removed")
    return {t: {"rows_in": v["rows_in"], "rows_out": v["rows_out"], "exact": v["exact_duplicates"],
                **{k: v["near"][k] for k in keys}} for t, v in tables.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    ap.add_argument("--mode", choices=("distinct", "near"), default="distinct")
    ap.add_argument("--executor", choices=("local", "ray"), default="local")
    ap.add_argument("--code", type=Path, help="checkout whose code runs the steps (default: this one)")
    ap.add_argument("--json", type=Path, help="append each result as a JSON line here")
    ap.add_argument("--input", choices=("ingested", "dedup", "semdedup", "decontaminated", "tokenized"),
                    default="ingested",
                    help="the table replicated: ingest's output (every step), dedup's (quality onwards), semdedup's "
                         "(decontaminate onwards), decontaminate's (validate onwards) or tokenize's (pack)")
    ap.add_argument("--threads", type=int, help="executor.threads (default: params.yaml's)")
    ap.add_argument("--max-rss-gb", type=float, default=20.0, help="stop a scale's later steps past this")
    ap.add_argument("--keep", action="store_true",
                    help="keep each scale's run directory (outputs, rejects, metrics) and print its path")
    ap.add_argument("--rerun", type=Path, nargs="+", help="run directories --keep kept: run the steps there again")
    args = ap.parse_args()
    print(f"{'scale':>5} {'rows':>9} {'step':13} {'wall s':>8} {'cpu s':>8} {'peak GB':>8}", flush=True)
    files = SPLITS if args.input == "tokenized" else ("sft", "rl")
    for scale in (args.rerun or args.scales):
        if args.rerun:
            run, scale = scale, int(scale.name.removeprefix("scale").split(".")[0])
            rows = sum(pq.ParquetFile(run / f"data/{args.input}/{k}.parquet").metadata.num_rows for k in files)
        else:
            run = Path(tempfile.mkdtemp(prefix=f"scale{scale}.", dir=os.environ.get("SCALE_TMP")))
        try:
            if not args.rerun:
                rows = _prepare(run, scale, args, files)
            for step in args.steps:
                r = run_step(run, step, args.code, args.executor)
                r.update(scale=scale, rows=rows, mode=args.mode, executor=args.executor, threads=args.threads,
                         code=str(args.code or REPO))
                print(f"{scale:5d} {rows:9d} {step:13} {r['wall_s']:8.1f} {r['cpu_s']:8.1f} {r['peak_rss_gb']:8.2f}"
                      + (f"  FAILED: {r['error']}" if "error" in r else "")
                      + "".join(f"  {t}: {v}" for t, v in r.get("near", {}).items()), flush=True)
                if args.json:
                    with args.json.open("a") as fh:
                        fh.write(json.dumps(r) + "\n")
                if "error" in r or r["peak_rss_gb"] > args.max_rss_gb:
                    break
        finally:
            if args.keep or args.rerun:
                print(f"kept {run}", flush=True)
            else:
                shutil.rmtree(run, ignore_errors=True)


def _prepare(run: Path, scale: int, args: argparse.Namespace, files: tuple[str, ...]) -> int:
    """Replicate the input ``scale`` times into the run directory ``run``, link what the steps read from the
    repository, write its params.yaml; returns the rows replicated."""
    (run / "data/ingested").mkdir(parents=True)
    (run / "data" / args.input).mkdir(parents=True, exist_ok=True)
    rows = sum(replicate(REPO / f"data/{args.input}/{k}.parquet", run / f"data/{args.input}/{k}.parquet", scale,
                         k, args.mode) for k in files)
    for name in ("sources", "assets", "decontam_index"):
        (run / "data" / name).symlink_to(REPO / "data" / name)
    (run / "data/ingested/benchmarks.parquet").symlink_to(REPO / "data/ingested/benchmarks.parquet")
    (run / "corpora").symlink_to(REPO / "corpora")
    params = yaml.safe_load(((args.code or REPO) / "params.yaml").read_text())
    if args.threads:
        params.setdefault("executor", {})["threads"] = args.threads
    params.setdefault("dedup", {}).setdefault("near", {}).setdefault("alarms", {})["on_alarm"] = "warn"
    (run / "params.yaml").write_text(yaml.safe_dump(params))
    return rows


if __name__ == "__main__":
    main()

"""Near-dedup and decontamination, measured on the real corpus against datatrove.

    python benchmarks/dedup.py [--bench-python /tmp/bench-venv/bin/python] [--originals 500]
    python -m benchmarks.dedup --only decontam    # decontamination speed alone (no datatrove venv)

Needs ``data/ingested/{sft,rl,benchmarks}.parquet`` (``dvc repro ingest``). datatrove
0.10.1 cannot share the project's environment (it needs xxhash 3.8.2 where the core
pins 4.x, plus orjson and spacy), so it runs from its own virtual environment:

    python3.11 -m venv /tmp/bench-venv
    /tmp/bench-venv/bin/pip install "datatrove==0.10.1" "xxhash==3.8.2" orjson spacy regex tokenizers polars pyarrow

(the ``bench-datatrove`` extra of pyproject.toml lists the same). Each side runs in its own
subprocess, so its peak RSS is its own. Both use word 5-grams, 128 permutations in
16 bands x 8 rows (what our threshold 0.8 derives) and 2 workers.

Labelled set: ``--originals`` real SFT rows, each with one variant made by controlled
edits (word insertions, deletions, substitutions, adjacent swaps, at a random rate of
0-20 % of the words, and re-wrapping of lines). The label of a pair is its exact Jaccard
of word 5-gram sets (our shingles) >= 0.8; a side predicts "duplicate" when it puts both
in one cluster. Precision and recall are over these pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
INGESTED = ROOT / "data" / "ingested"
BANDS, ROWS, NGRAM, WORKERS = 16, 8, 5, 2


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_labelled(texts: list[str], originals: int, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(docs ``id``/``text``, pairs ``a``/``b``/``jaccard``) from real ``texts`` by controlled edits."""
    import numpy as np

    from curation.minhash import jaccard, shingles
    from curation.params import MinHashConfig

    rng = random.Random(seed)
    pool = [t for t in texts if 80 <= len(t.split()) <= 3000]
    docs, pairs = [], []
    for i, text in enumerate(rng.sample(pool, originals)):
        words = text.split()
        rate = rng.uniform(0.0, 0.2)
        for _ in range(max(0, round(rate * len(words)))):
            op, pos = rng.choice(("insert", "delete", "substitute", "swap")), rng.randrange(len(words) - 1)
            if op == "insert":
                words.insert(pos, rng.choice(words))
            elif op == "delete":
                del words[pos]
            elif op == "substitute":
                words[pos] = rng.choice(words)
            else:
                words[pos], words[pos + 1] = words[pos + 1], words[pos]
        wrap = rng.randint(6, 20)  # re-wrapping changes no token
        variant = "\n".join(" ".join(words[k:k + wrap]) for k in range(0, len(words), wrap))
        docs += [{"id": f"o{i}", "text": text}, {"id": f"v{i}", "text": variant}]
        h, off = shingles(pl.Series([text, variant]), MinHashConfig())
        pairs.append({"a": f"o{i}", "b": f"v{i}",
                      "jaccard": jaccard(np.unique(h[off[0]:off[1]]), np.unique(h[off[1]:off[2]]))})
    return pl.DataFrame(docs), pl.DataFrame(pairs)


def score(pairs: pl.DataFrame, cluster: dict[str, str]) -> dict[str, float]:
    """Precision and recall of "same cluster" against the label ``jaccard >= 0.8``."""
    same = [cluster.get(a, a) == cluster.get(b, b) for a, b in zip(pairs["a"], pairs["b"], strict=True)]
    pos = (pairs["jaccard"] >= 0.8).to_list()
    tp = sum(s and p for s, p in zip(same, pos, strict=True))
    return {"precision": tp / max(sum(same), 1), "recall": tp / max(sum(pos), 1), "positives": sum(pos)}


# ------------------------------------------------------------------ our side
def _ours_clusters(docs: pl.DataFrame):
    from curation.minhash import near_dedup
    from curation.params import AlarmParams, MinHashConfig

    cfg = MinHashConfig(workers=WORKERS, batch_rows=1000)
    frame = docs.rename({"id": "uuid"})
    meta = frame.select("uuid", pl.lit("s").alias("source"), pl.lit("all").alias("group"), pl.lit(0).alias("priority"))
    batches = lambda: (frame.slice(i, cfg.batch_rows) for i in range(0, len(frame), cfg.batch_rows))
    alarms = AlarmParams(max_cluster_size=10**9, max_source_loss=1.0, on_alarm="warn")
    removed, stats = near_dedup(batches, meta, cfg, alarms, "bench")
    survivor = removed.select("uuid", pl.col("reason").str.extract(r"of (\S+)"))
    return dict(zip(survivor["uuid"], survivor["reason"], strict=True)), stats


def _datasketch_vs_numpy(texts: list[str]) -> dict[str, float]:
    """Seconds for the signatures of ``texts``: datasketch ``MinHash.bulk`` vs our numpy pass."""
    import datasketch
    import numpy as np

    from curation.minhash import minhash, shingles
    from curation.params import MinHashConfig

    cfg = MinHashConfig()
    h, off = shingles(pl.Series(texts), cfg)
    h32 = (h >> np.uint64(32)).astype(np.uint32)
    t0 = time.perf_counter()
    minhash(h, off, cfg)
    t1 = time.perf_counter()
    datasketch.MinHash.bulk([h32[off[d]:off[d + 1]].tolist() for d in range(len(texts))], num_perm=128, seed=1,
                            scheme="affine32", hashfunc=int)
    return {"numpy_s": t1 - t0, "datasketch_bulk_s": time.perf_counter() - t1, "docs": len(texts)}


def side_ours(work: Path) -> dict:
    docs = pl.read_parquet(work / "docs" / "*.parquet")
    t0 = time.perf_counter()
    _, stats = _ours_clusters(docs)
    seconds = time.perf_counter() - t0
    clusters, _ = _ours_clusters(pl.read_parquet(work / "labelled.parquet"))
    return {"seconds": seconds, "docs": len(docs), "removed": stats["removed"], "peak_mb": _peak_mb(),
            "clusters": clusters, "signature_backend": _datasketch_vs_numpy(docs["text"].head(2000).to_list())}


# ------------------------------------------------------------------ datatrove side (runs in the bench venv)
def _datatrove_clusters(docs: Path, out: Path) -> dict[str, str]:
    """Run datatrove's 4 MinHash stages on the parquet files of folder ``docs`` (one reader task per file)."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    cfg = MinhashConfig(n_grams=NGRAM, num_buckets=BANDS, hashes_per_bucket=ROWS, hash_config=HashConfig(precision=32))
    reader = ParquetReader(str(docs), glob_pattern="*.parquet", text_key="text", id_key="id")
    runs = [
        ([reader, MinhashDedupSignature(output_folder=str(out / "sigs"), config=cfg)], WORKERS),
        ([MinhashDedupBuckets(input_folder=str(out / "sigs"), output_folder=str(out / "buckets"), config=cfg)], BANDS),
        ([MinhashDedupCluster(input_folder=str(out / "buckets"), output_folder=str(out / "remove_ids"), config=cfg,
                              save_cluster_id=True)], 1),
        ([reader, MinhashDedupFilter(input_folder=str(out / "remove_ids"), load_cluster_ids=True,
                                     exclusion_writer=JsonlWriter(str(out / "removed"))),
          JsonlWriter(str(out / "kept"))], WORKERS),
    ]
    for i, (pipeline, tasks) in enumerate(runs):
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=WORKERS,
                              logging_dir=str(out / f"logs{i}")).run()
    clusters = {}
    for part in ("kept", "removed"):
        for f in sorted((out / part).glob("*.jsonl*")):
            for doc in pl.read_ndjson(f).to_dicts():
                cid = (doc.get("metadata") or {}).get("minhash_cluster_id")
                if cid is not None and cid != -1:
                    clusters[doc["id"]] = f"c{cid}"
    return clusters


def side_datatrove(work: Path) -> dict:
    t0 = time.perf_counter()
    clusters = _datatrove_clusters(work / "docs", work / "dt_docs")
    seconds = time.perf_counter() - t0
    removed = sum(len(pl.read_ndjson(f)) for f in (work / "dt_docs" / "removed").glob("*.jsonl*"))
    lab = _datatrove_clusters(work / "labelled", work / "dt_labelled")
    return {"seconds": seconds, "docs": pl.scan_parquet(work / "docs" / "*.parquet").select(pl.len()).collect().item(),
            "removed": removed, "peak_mb": _peak_mb(), "clusters": lab, "n_clustered_docs": len(clusters)}


# ------------------------------------------------------------------ decontamination speed
def decontamination_speed(ingested: Path, repeat: int = 9) -> dict:
    """Index build time and :func:`find_contamination_tables` of the training tables against every
    benchmark (n = 8, 13; params' rule), per table alone and of both as one corpus (what the step
    runs). MB = UTF-8 bytes of the matched text (prompt and answer sides, :func:`side_texts`); CPU
    seconds are the process's (all threads), so MB / CPU s is the throughput per core used. After
    one warm-up call (numba compiles or loads its cache) ``repeat`` calls are timed; the least and
    the median CPU time are kept (this VM's speed drifts by +-20 % over seconds)."""
    from curation.decontaminate import find_contamination_tables, side_texts
    from curation.ngram_index import build_index

    bench = pl.read_parquet(ingested / "benchmarks.parquet")
    c0, t0 = time.process_time(), time.perf_counter()
    index = build_index(bench, [8, 13])
    index.lookup  # noqa: B018 - membership structures, built once per index
    out = {"index": {"items": len(index.items), "ngrams": len(index.grams), "wall_s": time.perf_counter() - t0,
                     "cpu_s": time.process_time() - c0}}
    rule = {"max_train_doc_freq": 50, "min_coverage": {8: 0.5, 13: 0.0}, "stock_doc_freq": 1}
    tables = {kind: pl.read_parquet(ingested / f"{kind}.parquet") for kind in ("sft", "rl")}
    for part in [*({k: t} for k, t in tables.items()), tables]:
        label = "+".join(part)
        mb = sum(side_texts(t, k).str.len_bytes().sum() for k, t in part.items()) / 1e6
        matches, _ = find_contamination_tables(part, index, **rule)
        runs = []
        for _ in range(repeat):
            c0, t0 = time.process_time(), time.perf_counter()
            find_contamination_tables(part, index, **rule)
            runs.append({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0})
        runs.sort(key=lambda r: r["cpu_s"])
        out[label] = {"rows": sum(len(t) for t in part.values()), "mb": mb, **runs[0],
                      "median_cpu_s": runs[len(runs) // 2]["cpu_s"], "contaminated": matches["uuid"].n_unique()}
    return out


def print_decontamination(ingested: Path) -> None:
    r = decontamination_speed(ingested)
    ix = r.pop("index")
    print(f"decontamination index: {ix['items']} benchmark fields, {ix['ngrams']} n-grams (8, 13), "
          f"built in {ix['wall_s']:.2f} s wall / {ix['cpu_s']:.2f} s CPU; polars threads {pl.thread_pool_size()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'tables':<8}{'rows':>7}{'MB':>7}{'wall s':>8}{'cpu s':>7}{'MB/s':>7}{'cores':>7}{'MB/s/core':>10}"
          f"{'median':>8}{'contaminated':>13}")
    for label, k in r.items():
        print(f"{label:<8}{k['rows']:>7}{k['mb']:>7.1f}{k['wall_s']:>8.2f}{k['cpu_s']:>7.2f}{k['mb'] / k['wall_s']:>7.1f}"
              f"{k['cpu_s'] / k['wall_s']:>7.2f}{k['mb'] / k['cpu_s']:>10.1f}{k['mb'] / k['median_cpu_s']:>8.1f}"
              f"{k['contaminated']:>13}")
    print("(sft+rl: both tables as one corpus, as the step runs; prompt and answer sides; cores = CPU s / wall s; "
          "MB/s/core = MB per CPU second of the fastest of 9 runs, median = of the median run)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-python", default="/tmp/bench-venv/bin/python", help="python of the datatrove venv")
    ap.add_argument("--originals", type=int, default=500, help="originals in the labelled set")
    ap.add_argument("--ingested", type=Path, default=INGESTED, help="folder of {sft,rl,benchmarks}.parquet")
    ap.add_argument("--only", choices=("decontam",), help="run one section (decontam: no datatrove venv needed)")
    ap.add_argument("--side", choices=("ours", "datatrove"), help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        result = side_ours(args.work) if args.side == "ours" else side_datatrove(args.work)
        (args.work / f"{args.side}.json").write_text(json.dumps(result))
        return
    if args.only == "decontam":
        print_decontamination(args.ingested)
        return

    sys.path.insert(0, str(ROOT))
    from common.text import row_text

    work = Path(tempfile.mkdtemp(prefix="dedup-bench-"))
    frames = [pl.read_parquet(args.ingested / f"{k}.parquet").select(pl.col("uuid").alias("id"), row_text(k).alias("text"))
              for k in ("sft", "rl")]
    docs = pl.concat(frames)
    (work / "docs").mkdir()
    for i in range(WORKERS):  # datatrove's reader shards by file: one file per worker
        docs.gather_every(WORKERS, offset=i).write_parquet(work / "docs" / f"part{i}.parquet")
    labelled, pairs = make_labelled(frames[0]["text"].to_list(), args.originals)
    (work / "labelled").mkdir()
    labelled.write_parquet(work / "labelled" / "labelled.parquet")
    labelled.write_parquet(work / "labelled.parquet")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = {}
    for side, python in (("ours", sys.executable), ("datatrove", args.bench_python)):
        subprocess.run([python, __file__, "--side", side, "--work", str(work)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        res[side] = json.loads((work / f"{side}.json").read_text())
    print(f"corpus: {len(docs)} rows (sft + rl row text, {docs['text'].str.len_bytes().sum() / 1e6:.1f} MB); "
          f"labelled: {len(pairs)} pairs, {int((pairs['jaccard'] >= 0.8).sum())} with J >= 0.8; work dir {work}")
    print(f"{'side':<12}{'docs/s':>9}{'seconds':>9}{'peak MB':>9}{'removed':>9}{'precision':>11}{'recall':>8}")
    for side, r in res.items():
        s = score(pairs, r["clusters"])
        print(f"{side:<12}{r['docs'] / r['seconds']:>9.0f}{r['seconds']:>9.1f}{r['peak_mb']:>9.0f}{r['removed']:>9}"
              f"{s['precision']:>11.3f}{s['recall']:>8.3f}")
    sb = res["ours"]["signature_backend"]
    print(f"signatures of {sb['docs']} docs: numpy over datasketch's permutations {sb['numpy_s']:.2f} s, "
          f"datasketch MinHash.bulk {sb['datasketch_bulk_s']:.2f} s")
    print_decontamination(args.ingested)


if __name__ == "__main__":
    main()

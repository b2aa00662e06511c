"""Semantic dedup measured on the default data (``data/quality``, the step's input; run ``dvc repro quality``
first): precision from hand-labelled removed pairs, recall on planted paraphrases, the exhaustive-cosine
baseline (speed ratio, agreement), and throughput / peak memory at 1x and 10x the rows.

    .venv/bin/python benchmarks/semdedup.py [--out docs/semdedup/results.json]

- Precision: ``benchmarks/data/semdedup_labels.jsonl``, 200 pairs drawn from the removals at cosine ≥ 0.90
  (120 at ≥ 0.95, 80 below; seeded), each labelled duplicate or not by reading both texts (two annotators,
  100 pairs each, who did not see the scores). Precision at a threshold: labelled duplicates among the
  pairs at or above it, with a Wilson 95 % interval.
- Recall: ``benchmarks/data/semdedup_paraphrases.jsonl``, 58 rows rewritten by hand (same task, numbers and
  answer; mean word 5-gram Jaccard to the original 0.03, so MinHash at 0.8 misses every one) planted under
  new uuids; recall: planted rows removed as a duplicate of their original (or the original of them).
- Baseline: the same greedy rule with ``clusters: 1`` (every pair of a domain compared).
- Scale: each row 10 times under new uuids, the step run in a child process (wall, CPU, peak RSS).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.io import write_json  # noqa: E402
from curation.params import SemDedupParams  # noqa: E402
from curation.semdedup import run_semdedup  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
EXEMPT = ["reasoning_gym_math", "bfcl_multi_turn"]


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """Wilson score interval of a proportion k/n (Wilson 1927)."""
    if n == 0:
        return [0.0, 1.0]
    p, d = k / n, 1 + z * z / n
    c, h = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(c - h, 3), round(c + h, 3)]


def precision() -> dict:
    pairs = [json.loads(line) for line in (DATA / "semdedup_labels.jsonl").open()]
    out = {}
    for t in (0.90, 0.95, 0.97, 0.98, 0.99):
        row = {}
        for table in ("rl", "sft", "all"):
            sel = [p for p in pairs if p["cos"] >= t and table in ("all", p["table"])]
            k = sum(p["duplicate"] for p in sel)
            row[table] = {"pairs": len(sel), "duplicates": k, "precision": round(k / len(sel), 3) if sel else None,
                          "ci95": wilson(k, len(sel))}
        out[f"{t:.2f}"] = row
    return out


def _params(**kw) -> SemDedupParams:
    return SemDedupParams(enabled={"sft": True, "rl": True}, exempt_sources=EXEMPT, **kw)


def _planted(src: Path, dst: Path) -> dict[str, str]:
    """Copy ``src`` tables to ``dst`` with the paraphrases appended as new rows; ``{planted uuid: original}``."""
    planted: dict[str, str] = {}
    rows = [json.loads(line) for line in (DATA / "semdedup_paraphrases.jsonl").open()]
    for kind in ("sft", "rl"):
        table = pl.read_parquet(src / f"{kind}.parquet")
        originals = {r["uuid"]: r for r in table.filter(pl.col("uuid").is_in(
            [r["uuid"] for r in rows if r["table"] == kind])).to_dicts()}
        new = []
        for r in rows:
            if r["table"] != kind or r["uuid"] not in originals:
                continue  # the original did not reach semdedup (e.g. language-filtered)
            row = json.loads(json.dumps(originals[r["uuid"]]))
            row["uuid"] = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "planted:" + r["uuid"]))
            if kind == "rl":
                turns = row["responses_create_params"]["input"]
                next(m for m in turns if m["role"] == "user")["content"] = r["text"]
            else:
                turns = row["messages"]
                next(m for m in turns if m["role"] == "user")["content"] = r["user"]
                next(m for m in turns if m["role"] == "assistant")["content"] = r["assistant"]
            planted[row["uuid"]] = r["uuid"]
            new.append(row)
        pl.concat([table, pl.DataFrame(new, schema=table.schema)]).write_parquet(dst / f"{kind}.parquet")
    return planted


def recall(src: Path) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "in").mkdir()
        planted = _planted(src, tmp / "in")
        for t in (0.80, 0.90, 0.95, 0.98):
            for guard in (True, False):
                run_semdedup(_params(threshold=t, same_numbers=guard), {}, tmp / "in", tmp / "out", root=tmp)
                rej = pl.read_parquet(tmp / "rejects" / "semdedup.parquet").select(
                    "record_id", pl.col("reason").str.extract(r"of (\S+)").alias("of"))
                pairs = set(zip(rej["record_id"], rej["of"], strict=True))
                found = sum((p, o) in pairs or (o, p) in pairs for p, o in planted.items())
                out[f"{t:.2f}{'' if guard else ' no_numbers_guard'}"] = {
                    "planted": len(planted), "found": found, "recall": round(found / len(planted), 3),
                    "ci95": wilson(found, len(planted))}
    return out


def _compare(groups: list[tuple[pl.DataFrame, np.ndarray]], p: SemDedupParams) -> dict:
    from curation.semdedup import semantic_duplicates

    seconds, removed = {"clustered": 0.0, "exhaustive": 0.0}, {"clustered": set(), "exhaustive": set()}
    for meta, vectors in groups:
        for name, clusters in (("clustered", None), ("exhaustive", 1)):
            t0 = time.perf_counter()
            found, _ = semantic_duplicates(meta, vectors, p.threshold, p.rows_per_cluster, p.seed, clusters)
            seconds[name] += time.perf_counter() - t0
            removed[name] |= set(found["uuid"])
    a, b = removed["clustered"], removed["exhaustive"]
    return {"rows": sum(len(m) for m, _ in groups), "seconds": {k: round(v, 2) for k, v in seconds.items()},
            "speed_ratio": round(seconds["exhaustive"] / seconds["clustered"], 2),
            "removed": {k: len(v) for k, v in removed.items()}, "both": len(a & b),
            "agreement_jaccard": round(len(a & b) / max(1, len(a | b)), 3),
            "exhaustive_found_by_clustered": round(len(a & b) / max(1, len(b)), 3)}


def baseline(src: Path) -> dict:
    """Clustered against exhaustive (``clusters: 1``) on the same embeddings, per table and domain: the
    seconds of the comparison alone (embedding, the same for both, excluded) and the removals' agreement; on
    the rows (1x), and on 4x rows whose copies are the rows' vectors plus seeded Gaussian noise (cosine about
    0.9 to the original, so most copies stay and the kept set grows as it would with 4x distinct rows)."""
    from common.executor import LocalExecutor, gather
    from curation.semdedup import embed_rows

    p, rng, out = _params(), np.random.default_rng(0), {}
    groups = []
    for kind in ("sft", "rl"):
        rows = gather(LocalExecutor(), src / f"{kind}.parquet", embed_rows, 1000,
                      {"kind": kind, "dim": p.dim, "max_tokens": p.max_tokens}, pl.DataFrame())
        rows = rows.filter(~pl.col("source").is_in(EXEMPT)).with_columns(pl.lit(0).alias("priority"))
        x = rows["embedding"].to_numpy()
        for _, part in rows.with_row_index("at").group_by("domain", maintain_order=True):
            groups.append((part.select("uuid", "priority", "length", "key"), x[part["at"].to_numpy()]))
    out["1x"] = _compare(groups, p)
    scaled = []
    for meta, x in groups:
        copies = [x] + [x + rng.normal(scale=0.03, size=x.shape).astype(np.float32) for _ in range(3)]
        v = np.concatenate(copies)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        scaled.append((pl.concat([meta.with_columns(pl.col("uuid") + f"-{i}") for i in range(4)]), v))
    out["4x"] = _compare(scaled, p)
    return out


def _scaled(src: Path, dst: Path, times: int) -> int:
    n = 0
    for kind in ("sft", "rl"):
        table = pl.read_parquet(src / f"{kind}.parquet")
        copies = [table.with_columns((pl.col("uuid") + f"-{i}").alias("uuid")) if i else table for i in range(times)]
        pl.concat(copies).write_parquet(dst / f"{kind}.parquet")
        n += len(table) * times
    return n


def _child(src: str, out: str) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    run_semdedup(_params(), {}, Path(src), Path(out), root=Path(out))
    print(json.dumps({"wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))


def scale(src: Path) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for times in (1, 10):
            d = Path(tmp) / f"x{times}"
            d.mkdir()
            rows = _scaled(src, d, times)
            res = subprocess.run([sys.executable, __file__, "--child", str(d), str(d / "out")], capture_output=True,
                                 text=True, check=True)
            out[f"{times}x"] = {"rows": rows, **json.loads(res.stdout.strip().splitlines()[-1])}
            out[f"{times}x"]["rows_per_s"] = round(rows / out[f"{times}x"]["wall_s"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=str(ROOT / "data" / "quality"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "semdedup" / "results.json"))
    ap.add_argument("--parts", nargs="+", default=["precision", "recall", "baseline", "scale"],
                    help="run only these parts (the others are kept from --out)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(*args.child)
    src = Path(args.src)
    parts = {"precision": precision, "recall": recall, "baseline": baseline, "scale": scale}
    result = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    for name in args.parts:
        result[name] = parts[name]() if name == "precision" else parts[name](src)
    write_json(result, args.out)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Every quality filter measured on the default data (``data/dedup``, the step's input): rows removed per filter
with all filters on, a seeded sample of each filter's removals to read, and each filter's precision from the
labelled removals (``benchmarks/data/quality_labels.jsonl``, Wilson 95 % interval).

    .venv/bin/python benchmarks/quality.py [--sample 5]

The labels: 151 removals of an all-filters-on run (all 49 repetition and 22 cut-off removals; 30 length
outliers, 30 language and 20 empty-answer removals drawn with a seed), each read and marked a correct or wrong
removal for its filter's stated reason by a reader who did not see the statistics. params.yaml turns on only the
filters whose precision held (docs/quality.md).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.semdedup import wilson  # noqa: E402
from curation.params import QualityParams  # noqa: E402
from curation.quality import run_quality  # noqa: E402

ALL_ON = QualityParams(cut_off={"enabled": True}, length={"enabled": True},
                       repetition={"enabled": True, "thresholds": {"top_2gram_char_frac": 0.3,
                                                                   "dup_10gram_char_frac": 0.5}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=str(ROOT / "data" / "dedup"))
    ap.add_argument("--sample", type=int, default=5, help="removals shown per filter")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        m = run_quality(ALL_ON, Path(args.src), Path(tmp) / "out", root=Path(tmp))
        rejects = pl.read_parquet(Path(tmp) / "rejects" / "quality.parquet")
    print(f"all filters on: {m['rows_rejected']} of {m['rows_in']} rows removed")
    labels = [json.loads(line) for line in (ROOT / "benchmarks" / "data" / "quality_labels.jsonl").open()]
    judged = Counter((x["filter"], x["correct"]) for x in labels)
    rng = random.Random(0)
    for name, n in sorted(m["rejected_by_reason"].items()):
        k, total = judged[(name, True)], judged[(name, True)] + judged[(name, False)]
        print(f"\n== {name}: {n} rows; labelled precision {k}/{total} {wilson(k, total)}")
        rows = rejects.filter(pl.col("reason").str.starts_with(name)).to_dicts()
        for row in rng.sample(rows, min(args.sample, len(rows))):
            record = json.loads(row["record"])
            turns = record.get("messages") or record["responses_create_params"]["input"]
            text = " | ".join(f"{t['role']}: {(t['content'] or '')[:120]!r}" for t in turns[:3])
            print(f"- [{row['source']}] {row['reason'][:80]}\n    {text[:300]}")


if __name__ == "__main__":
    main()

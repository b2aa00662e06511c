"""Audit of the decontamination rule on the pipeline's own data (issue #21): stock phrases and answers.

Reads the deduplicated training tables (``data/dedup``) and the benchmark n-gram index
(``data/decontam_index``) that ``dvc repro decontaminate`` leaves, and prints:

1. the removals of the prompt-only rule without a stock-phrase tier, each table alone (the rule
   before #21), and how many of them rest on a single shared n-gram that more than ``k`` other
   training problems also hold;
2. per stock bound ``k`` (``decontaminate.stock_doc_freq``), the rows the rule removes on each side
   and how many of the old removals it releases;
3. with ``--sample FILE``, a labelling sample (JSON lines): every old removal the chosen bound
   releases, and as many rows it still removes, drawn at random (seeded), each with the training
   text around the match and the benchmark item, for reading by hand.

    .venv/bin/python benchmarks/contamination_audit.py --sample /tmp/sample.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from curation.decontaminate import find_contamination_tables, side_texts
from curation.ngram_index import read_index
from curation.params import DecontaminateParams

KINDS = ("sft", "rl")


def run(p: DecontaminateParams, tables: dict[str, pl.DataFrame], index: Any, per_table: bool = False,
        **extra: Any) -> pl.DataFrame:
    """The matches (with ``table``) of the training tables under the rule of the ``decontaminate`` params
    ``p`` (:meth:`DecontaminateParams.rule`) with ``extra`` overriding it: the tables as one corpus (the
    step), or each alone (``per_table``: before #21)."""
    kw = p.rule() | extra
    if per_table:
        return pl.concat([find_contamination_tables({kind: t}, index, **kw)[0] for kind, t in tables.items()])
    return find_contamination_tables(tables, index, **kw)[0]


def _context(text: str, match: str, chars: int = 300) -> str:
    """``chars`` characters of ``text`` around the first words of ``match`` (else its start)."""
    at = text.lower().find(" ".join(match.split()[:3]))
    at = max(at, 0)
    return text[max(0, at - chars // 3): at + chars]


def sample(old: pl.DataFrame, new: pl.DataFrame, tables: dict[str, pl.DataFrame], index: Any, size: int,
           seed: int) -> list[dict[str, Any]]:
    """Every old removal ``new`` releases, then old removals ``new`` keeps removing, up to ``size``."""
    first = old.unique("uuid", keep="first", maintain_order=True)
    released = first.join(new.select("uuid").unique(), on="uuid", how="anti")
    kept = first.join(new.select("uuid").unique(), on="uuid", how="semi")
    draw = pl.concat([released.with_columns(pl.lit("released").alias("verdict")),
                      kept.sample(max(0, min(len(kept), size - len(released))), seed=seed)
                      .with_columns(pl.lit("removed").alias("verdict"))])
    items = index.items.select("benchmark_uuid", "field", "text")
    out = []
    for r in draw.join(items, on=["benchmark_uuid", "field"], how="left").iter_rows(named=True):
        table = tables[r["table"]]
        at = table["uuid"].to_list().index(r["uuid"])
        texts = side_texts(table.slice(at, 1), r["table"])
        text = texts[0] if r["side"] == "prompt" else texts[1]
        out.append({"verdict": r["verdict"], "uuid": r["uuid"], "source": table["source"][at], "side": r["side"],
                    "benchmark": r["benchmark"], "how": r["how"], "shared": r["shared"], "phrases": r["phrases"],
                    "min_doc_freq": r["min_doc_freq"], "match": r["match"], "training_text": _context(text, r["match"]),
                    "benchmark_text": r["text"][:400]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("data"))
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 5, 10, 20])
    ap.add_argument("--sample", type=Path, help="write a labelling sample (JSON lines) for params' stock_doc_freq")
    ap.add_argument("--size", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    p = DecontaminateParams.model_validate(yaml.safe_load(Path("params.yaml").read_text())["decontaminate"])
    index = read_index(args.data / "decontam_index", p.ngrams)
    tables = {kind: pl.read_parquet(args.data / "dedup" / f"{kind}.parquet") for kind in KINDS}
    old = run(p, tables, index, per_table=True, stock_doc_freq=None, sides=("prompt",))
    first = old.unique("uuid", keep="first", maintain_order=True)
    print(f"prompt side, no stock tier (the rule before #21): {len(first)} rows removed")
    single = first.filter(pl.col("shared") == 1)
    print(f"  resting on one shared n-gram: {len(single)}; of them, the n-gram held by more than k other problems:")
    print("  " + ", ".join(f"k={k}: {(single['min_doc_freq'] - 1 > k).sum()}" for k in args.ks))
    print(f"\n{'stock k':>8}{'removed':>9}{'prompt':>8}{'answer':>8}{'released':>10}{'answer only':>12}")
    for k in [None, *args.ks]:
        new = run(p, tables, index, stock_doc_freq=k)
        rows = new["uuid"].n_unique()
        released = first.join(new.select("uuid").unique(), on="uuid", how="anti").height
        answer_only = new.group_by("uuid").agg(pl.col("side")).filter(pl.col("side").list.len() == 1).filter(
            pl.col("side").list.first() == "answer").height
        per = dict(new.group_by("side").len().iter_rows())
        print(f"{k if k is not None else '-':>8}{rows:>9}{per.get('prompt', 0):>8}{per.get('answer', 0):>8}"
              f"{released:>10}{answer_only:>12}")
    if args.sample:
        new = run(p, tables, index)
        lines = sample(old, new, tables, index, args.size, args.seed)
        args.sample.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
        print(f"\n{len(lines)} rows for labelling in {args.sample} (stock_doc_freq {p.stock_doc_freq})")


if __name__ == "__main__":
    main()

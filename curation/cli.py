"""The ``cascade`` console script: one subcommand per pipeline step.

    cascade fetch | asset | ingest | dedup | decontaminate | validate | build | export
    cascade summary                 per-step counts from metrics/*.json
    cascade release --push REPO     upload release/{sft,rl} to the Hub

Every step reads its knobs from ``params.yaml`` (``--params`` to change) and
is run by ``dvc repro`` from ``dvc.yaml``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def load_params(path: str | Path) -> dict[str, Any]:
    """Read ``params.yaml``; raises SystemExit naming the file when it is missing."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"params file {path} not found (run from the repository root or pass --params)")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def print_summary(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="cascade-rl pipeline")
    for col in ("step", "in", "out", "rejected", "rejects by reason", "seconds"):
        table.add_column(col, justify="left" if col in ("step", "rejects by reason") else "right")
    for r in rows:
        reasons = ", ".join(f"{k}={v}" for k, v in r["reasons"].items()) or "-"
        table.add_row(r["step"], str(r["in"]), str(r["out"]), str(r["rejected"]), reasons, str(r["seconds"] or "-"))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    from curation.pipeline import STEPS

    parser = argparse.ArgumentParser(prog="cascade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn in STEPS.items():
        sub.add_parser(name, help=(fn.__doc__ or name).strip().splitlines()[0])
    sub.add_parser("summary", help="print per-step counts from metrics/*.json")
    rel = sub.add_parser("release", help="upload release/sft and release/rl to the Hub")
    rel.add_argument("--push", required=True, metavar="REPO",
                     help="Hub dataset repo prefix: REPO-sft and REPO-rl are created")
    rel.add_argument("--public", action="store_true", help="create public repos (default private)")
    args = parser.parse_args(argv)

    if args.command == "summary":
        from curation.pipeline import summary

        print_summary(summary())
        return 0
    if args.command == "release":
        from curation.pipeline import RELEASE
        from curation.release import push_release

        token = os.environ.get("HF_TOKEN")
        if not token:
            raise SystemExit("set HF_TOKEN to a Hub token with write access to push a release")
        for kind in ("sft", "rl"):
            files = push_release(RELEASE / kind, f"{args.push}-{kind}", token, private=not args.public)
            print(f"pushed {len(files)} files to {args.push}-{kind}")
        return 0

    from curation.pipeline import run_step

    try:
        run_step(args.command, load_params(args.params))
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"cascade {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

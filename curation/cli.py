"""The ``cascade`` console script: one subcommand per pipeline step.

    cascade fetch | asset | ingest | dedup | decontaminate | validate | build | export
    cascade --executor ray [--address auto] ingest | dedup | decontaminate | build | tokenize | export
                                    on Ray Data (docs/ray.md)
    cascade summary                 per-step counts from metrics/*.json
    cascade train STAGE [--restart] a training stage of params.yaml's cascade (sft, if_rl, ...); a killed
                                    run resumes from its last training state unless --restart
    cascade stages                  the stage runners, their config fields with defaults, params' stages
    cascade report                  per-domain validation across the stages, regressions, lineage
    cascade swe_tasks               SWE bug-fix tasks from code problems and registered packages
    cascade solve --checkpoint X    test-time generate -> verify -> refine, pass rate by round
    cascade release --push REPO     upload release/{sft,rl} to the Hub

Every step reads its knobs from ``params.yaml`` (``--params`` to change), checked before any work
(:mod:`curation.params`: a typo or an out-of-range value is one line naming the key), and is run
by ``dvc repro`` from ``dvc.yaml``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from curation.params import PipelineParams

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def load_params(path: str | Path) -> dict[str, Any]:
    """Read ``params.yaml``; raises SystemExit naming the file when it is missing."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"params file {path} not found (run from the repository root or pass --params)")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_checked(path: str | Path) -> PipelineParams:
    """:func:`load_params` validated into every data step's model (:func:`curation.params.check_params`).

    Raises:
        ValueError: one line naming the bad key.
    """
    from curation.params import check_params

    return check_params(load_params(path), str(path))


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
    ingest = next((r for r in rows if r["step"] == "ingest"), None)
    if ingest:
        Console().print("ingest counts source records; one record can hold many rows (a generator, a "
                        "derived set): see rows_out_by_table in metrics/ingest.json", style="dim")
    if any(r["step"] == "export" for r in rows):
        Console().print("export counts every row of every set it releases: the stage mixes (rl/multi_domain, ...) "
                        "re-draw rows of the domain sets, so it reads more rows than build wrote once; rows whose "
                        "license is not cleared for release are refused (export.allow_licenses)", style="dim")


def main(argv: list[str] | None = None) -> int:
    from curation.pipeline import STEPS

    parser = argparse.ArgumentParser(prog="cascade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    parser.add_argument("--executor", choices=("local", "ray"), help="override params executor.kind (docs/ray.md)")
    parser.add_argument("--address", help="ray: cluster address ('auto' joins the running cluster); "
                        "unset starts a local Ray")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn in STEPS.items():
        doc = (fn.__doc__ or name).strip().splitlines()[0].replace("``", "")
        sub.add_parser(name, help=doc, description=doc)
    sub.add_parser("summary", help="print per-step counts from metrics/*.json")
    rel = sub.add_parser("release", help="upload release/sft and release/rl to the Hub")
    rel.add_argument("--push", required=True, metavar="REPO",
                     help="Hub dataset repo prefix: REPO-sft and REPO-rl are created")
    rel.add_argument("--public", action="store_true", help="create public repos (default private)")
    tr = sub.add_parser("train", help="run a training stage of the cascade (stages/cli.py); resumes a killed run")
    tr.add_argument("stage")
    tr.add_argument("--restart", action="store_true",
                    help="delete the stage's training states first (start over instead of resuming)")
    rep = sub.add_parser("report", help="per-domain metrics across the cascade's stages (stages/report.py)")
    rep.add_argument("--docs", metavar="DIR", help="also write report.json (documented schema), report.md and "
                     "report.png into DIR (e.g. docs/learning)")
    rep.add_argument("--wall-s", type=float, help="the run's wall time in seconds, recorded in DIR/report.json")
    ev = sub.add_parser("eval", help="score a checkpoint on benchmark sets with the package's verifiers "
                        "(stages/benchmark_eval.py; presets: params benchmarks)")
    ev.add_argument("checkpoint", help="an HF model directory (a stage checkpoint or data/assets/...)")
    ev.add_argument("--label", help="result name: OUT/LABEL.json (default: the checkpoint directory's name)")
    ev.add_argument("--preset", help="params benchmarks.presets entry (default: benchmarks.preset); full: every row")
    ev.add_argument("--benchmarks", help="comma-separated subset (or benchmarks outside the preset, e.g. aime24)")
    ev.add_argument("--hub", action="append", default=[], metavar="NAME=PATH",
                    help="read a Hub benchmark (aime24, aime25, gpqa_diamond, livecodebench) from a local copy")
    ev.add_argument("--out", help="results directory (default metrics/benchmarks)")
    ev.add_argument("--against", metavar="LABEL", help="print paired deltas against another result (a label in "
                    "--out or a .json file)")
    sub.add_parser("stages", help="list the stage runners, their config fields with defaults, and params' stages")
    pre = sub.add_parser("preset", help="print a params preset as dvc exp run -S overrides, one per line "
                         "(curation/presets.py)")
    pre.add_argument("file", help="preset YAML, e.g. presets/learning.yaml")
    verl = sub.add_parser("verl", help="write an RL release config as verl parquet files OUT/<split>.parquet "
                          "(curation/trainer_layouts.py; rewards: validators/rewards/verl.py)")
    verl.add_argument("release", help="RL release directory (release/rl) or Hub dataset id")
    verl.add_argument("config", help="RL set, e.g. math or multi_domain")
    verl.add_argument("out", help="output directory")
    gym = sub.add_parser("nemo_gym", help="write an RL release config as NeMo-Gym JSON lines OUT/<config>/<split>.jsonl "
                         "(curation/trainer_layouts.py; rewards: validators/rewards/nemo_gym.py)")
    gym.add_argument("release", help="RL release directory (release/rl) or Hub dataset id")
    gym.add_argument("config", help="RL set, e.g. math or multi_domain")
    gym.add_argument("out", help="output directory")
    from stages.solve import add_arguments as solve_arguments

    solve_arguments(sub.add_parser("solve", help="test-time generate-verify-refine on an RL set (stages/solve.py)"))
    args = parser.parse_args(argv)
    if argv is None and args.command == "train":  # the command line, not a call from Python
        from common.allocator import reexec_with_allocator

        reexec_with_allocator()

    if args.command == "solve":
        from stages.solve import main as solve_main

        return solve_main(args)
    if args.command == "preset":
        from curation.presets import preset_overrides

        try:
            print("\n".join(preset_overrides(args.file, args.params)))
        except (FileNotFoundError, ValueError, TypeError) as exc:
            print(f"cascade preset: error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command in ("verl", "nemo_gym"):
        from curation.trainer_layouts import write_nemo_gym, write_verl

        try:
            counts = (write_verl if args.command == "verl" else write_nemo_gym)(args.release, args.config, args.out)
        except (OSError, ValueError) as exc:  # OSError: a missing path, or a Hub id unreachable (ConnectionError)
            print(f"cascade {args.command}: error: {exc}", file=sys.stderr)
            return 1
        for split, n in counts.items():
            where = f"{split}.parquet" if args.command == "verl" else f"{args.config}/{split}.jsonl"
            print(f"{Path(args.out) / where}: {n} rows")
        return 0
    if args.command == "stages":
        from stages.cli import describe_stages

        print(describe_stages(load_params(args.params)))
        return 0
    if args.command == "eval":
        from curation.benchmarks import run_eval

        try:
            hub = dict(item.split("=", 1) for item in args.hub)
        except ValueError:
            print(f"cascade eval: error: --hub takes NAME=PATH, got {args.hub}", file=sys.stderr)
            return 1
        try:
            run_eval(load_params(args.params), args.checkpoint, args.label, args.preset,
                     args.benchmarks.split(",") if args.benchmarks else None, hub, args.out, args.against)
        except (FileNotFoundError, ValueError, RuntimeError) as exc:
            print(f"cascade eval: error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command in ("train", "report"):  # the cascade block is checked by the runners' own configs
        from curation.pipeline import run_step
        from stages.cli import train
        from stages.report import run_report

        name = f"train {args.stage}" if args.command == "train" else "report"
        try:
            result = run_step(name, load_params(args.params),
                              (lambda p: train(args.stage, p, restart=args.restart)) if args.command == "train"
                              else (lambda p: run_report(p, args.docs, args.wall_s)))
        except (FileNotFoundError, ValueError, RuntimeError) as exc:
            print(f"cascade {name}: error: {exc}", file=sys.stderr)
            return 1
        if args.command == "train":
            print(f"{args.stage}: checkpoint {result.checkpoint}, metrics {result.metrics}")
        return 0

    if args.command == "summary":
        from curation.pipeline import summary

        rows = summary()
        if not rows:
            print("cascade summary: no metrics/<step>.json here: run `dvc repro` from the repository root",
                  file=sys.stderr)
            return 1
        print_summary(rows)
        return 0
    if args.command == "release":
        from common.paths import RELEASE
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
        params = load_checked(args.params)
    except ValueError as exc:
        print(f"cascade {args.command}: error: {exc}", file=sys.stderr)
        return 1
    override = {**({"kind": args.executor} if args.executor else {}), **({"address": args.address} if args.address else {})}
    params = params.model_copy(update={"executor": params.executor.model_copy(update=override)})
    try:
        run_step(args.command, params)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"cascade {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

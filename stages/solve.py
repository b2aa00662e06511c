"""``cascade solve``: test-time scaling by generate -> verify -> refine (recipe, "Test-time scaling").

For each problem of an RL set (math, code, any verifiable domain) and a budget of ``rounds``:

1. the model answers (greedy by default) in a chat that holds the problem and, after round 1,
   its previous answers and the feedback on them;
2. the answer is checked: ``feedback: public`` (default) checks code against the *public* test
   only (the one MBPP shows in the prompt), so hidden tests never leak into the feedback; domains
   without public tests are checked by the row's verifier and get a generic "not correct";
   ``feedback: verifier`` feeds back the verifier's own reason and first failing test (an oracle
   setting, reported as such);
3. a problem whose check passes stops; the others get the feedback as a user turn and try again.

Every answer is graded by the row's full verifier (one ``validators.verifiers.batch.VerifierPool`` for the
run). The report gives, per round, ``pass_rate``: the share of problems whose latest answer passes the full
verifier after that round (cumulative: a solved problem stays solved), and ``checked_rate``: the
share whose check passed. Works with any HF checkpoint: a directory, a stage name of the checkpoint
registry (``data/checkpoints/<stage>``) or ``best:<domain>`` (:class:`stages.checkpoints.CheckpointRegistry`).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from common.answers import row_json
from common.io import write_json

GENERIC_FEEDBACK = "Your answer is not correct. Check your reasoning and give a corrected final answer."


class SolveConfig(BaseModel):
    """Knobs of one ``cascade solve`` run."""

    model_config = ConfigDict(extra="forbid")
    rounds: int = 3
    rows: int = 8                 # first rows of the split
    split: str = "validation"
    max_new_tokens: int = 256
    greedy: bool = True
    temperature: float = 1.0
    batch_size: int = 8
    feedback: str = "public"      # public | verifier
    feedback_chars: int = 600
    timeout_s: float = 10.0       # per verification
    max_prompt_tokens: int = 2048


def resolve_checkpoint(name: str | Path, root: str | Path = "data/checkpoints") -> Path:
    """A model directory from a path, a stage name under ``root``, or ``best:<domain>``.

    Raises:
        FileNotFoundError: nothing of that name (lists the registry's checkpoints).
        LookupError: ``best:<domain>`` with no checkpoint validated on that domain.
    """
    from stages.checkpoints import CheckpointRegistry

    name = str(name)
    if name.startswith("best:"):
        return CheckpointRegistry(root).best(name.split(":", 1)[1])
    for cand in (Path(name), Path(root) / name):
        if (cand / "config.json").exists():
            return cand
    known = sorted(p.name for p in CheckpointRegistry(root).records())
    raise FileNotFoundError(f"no checkpoint {name!r} (a model dir, a stage of {root}: {known}, or best:<domain>)")


def public_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """The row restricted to its public test (MBPP ``assert`` mode: the first test, shown in the
    prompt); None when the row has no public test."""
    gt = row_json(row, "ground_truth")
    if row.get("agent_ref") != "code" or gt.get("mode") != "assert" or not gt.get("tests"):
        return None
    out = copy.deepcopy(row)
    out["ground_truth"] = json.dumps({**gt, "tests": gt["tests"][:1]})
    return out


def feedback_text(verdict: Any, row: dict[str, Any], limit: int) -> str:
    """The refine prompt from a failed verdict on ``row`` (the row that was checked): its reason,
    the first failing test's code (``assert`` rows) and its error."""
    tests = (verdict.details or {}).get("tests") or []
    bad = next((t for t in tests if not t.get("passed")), None) or {}
    gt = row_json(row, "ground_truth")
    code = gt["tests"][bad["test"]] if gt.get("mode") == "assert" and isinstance(bad.get("test"), int) else ""
    err = bad.get("error") or bad.get("stderr") or ""
    text = f"Your solution is wrong ({verdict.reason})." + (f"\nFailing test: {code}" if code else "") + \
        (f"\nError: {err}" if err else "")
    return text[:limit] + "\nFix it and answer with the complete corrected solution."


def solve(engine: Any, tokenizer: Any, rows: list[dict[str, Any]], cfg: SolveConfig) -> dict[str, Any]:
    """Run the loop of the module doc over ``rows`` with a rollout engine; returns the report
    ``{"rounds": [{round, pass_rate, checked_rate, active, generate_s, verify_s}], "problems": N,
    "solved_round": [round or None per problem]}``.

    Raises:
        ValueError: unknown ``cfg.feedback``.
    """
    from stages.environment import PromptBuilder, PromptTooLong
    from validators.verifiers.batch import VerifierPool

    if cfg.feedback not in ("public", "verifier"):
        raise ValueError(f"feedback {cfg.feedback!r}: expected 'public' or 'verifier'")
    builder = PromptBuilder(tokenizer, cfg.max_prompt_tokens)
    chats, tools, kept = [], [], []
    for row in rows:
        try:
            builder(row)
        except PromptTooLong:
            continue
        chat, t = builder.messages(row)
        chats.append(chat)
        tools.append(t)
        kept.append(row)
    n = len(kept)
    passed, checked = [False] * n, [False] * n
    solved_round: list[int | None] = [None] * n
    report = []
    with VerifierPool(2, cfg.timeout_s) as pool:  # one set of verifier workers for every round
        for rnd in range(1, cfg.rounds + 1):
            active = [i for i in range(n) if not checked[i]]
            if not active:
                report.append({"round": rnd, "pass_rate": sum(passed) / max(n, 1),
                               "checked_rate": sum(checked) / max(n, 1), "active": 0, "generate_s": 0.0, "verify_s": 0.0})
                continue
            t0 = time.perf_counter()
            prompts = [tokenizer.apply_chat_template(chats[i], tools=tools[i], add_generation_prompt=True,
                                                     tokenize=True, return_dict=False) for i in active]
            texts = engine.generate(prompts, n=1, greedy=cfg.greedy, max_new_tokens=cfg.max_new_tokens).texts
            t1 = time.perf_counter()
            verdicts = pool.verify(texts, [kept[i] for i in active])
            pub_rows = [public_row(kept[i]) if cfg.feedback == "public" else None for i in active]
            has_pub = [k for k, r in enumerate(pub_rows) if r is not None]
            pub = dict(zip(has_pub, pool.verify([texts[k] for k in has_pub], [pub_rows[k] for k in has_pub]),
                           strict=True)) if has_pub else {}
            for k, i in enumerate(active):
                passed[i] = verdicts[k].passed
                if passed[i] and solved_round[i] is None:
                    solved_round[i] = rnd
                check = pub.get(k, verdicts[k])
                checked[i] = check.passed
                if not check.passed:
                    note = feedback_text(check, pub_rows[k] if k in pub else kept[i], cfg.feedback_chars) \
                        if (k in pub or cfg.feedback == "verifier") else GENERIC_FEEDBACK
                    chats[i] = chats[i] + [{"role": "assistant", "content": texts[k]},
                                           {"role": "user", "content": note}]
            report.append({"round": rnd, "pass_rate": sum(passed) / max(n, 1),
                           "checked_rate": sum(checked) / max(n, 1), "active": len(active), "generate_s": round(t1 - t0, 2),
                           "verify_s": round(time.perf_counter() - t1, 2)})

    return {"rounds": report, "problems": n, "skipped_prompt_too_long": len(rows) - n, "solved_round": solved_round}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``cascade solve`` options (every :class:`SolveConfig` field, plus model and data)."""
    parser.add_argument("--checkpoint", default="data/assets/SmolLM2-135M-Instruct",
                        help="model dir, stage name of data/checkpoints, or best:<domain>")
    parser.add_argument("--dataset", default="data/sets/rl/code", help="RL set dir (or a parquet file)")
    parser.add_argument("--out", default="metrics/solve.json", help="report JSON")
    for name, f in SolveConfig.model_fields.items():
        kind = {bool: lambda s: s.lower() in ("1", "true", "yes"), int: int, float: float}.get(f.annotation, str)
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=f.default)


def main(args: argparse.Namespace) -> int:
    """CLI body: load the checkpoint, run :func:`solve`, print the table, write the report."""
    from rich.console import Console
    from rich.table import Table

    from stages.checkpoints import load_checkpoint
    from stages.environment import load_rl_rows
    from stages.rollout import HFRolloutEngine, SamplingConfig

    cfg = SolveConfig(**{k: getattr(args, k) for k in SolveConfig.model_fields})
    try:
        path = resolve_checkpoint(args.checkpoint)
        rows = load_rl_rows(args.dataset, cfg.split, limit=cfg.rows)
    except (FileNotFoundError, LookupError) as exc:
        print(f"cascade solve: error: {exc}", file=sys.stderr)
        return 1
    model, tok = load_checkpoint(path)
    engine = HFRolloutEngine(model.eval(), tok, SamplingConfig(max_new_tokens=cfg.max_new_tokens,
                                                               temperature=cfg.temperature, batch_size=cfg.batch_size))
    report = solve(engine, tok, rows, cfg)
    report.update(checkpoint=str(path), dataset=str(args.dataset), config=cfg.model_dump())
    table = Table(title=f"cascade solve: {report['problems']} problems of {args.dataset} ({path})")
    for col in ("round", "pass rate", "checked", "active", "generate s", "verify s"):
        table.add_column(col, justify="right")
    for r in report["rounds"]:
        table.add_row(str(r["round"]), f"{r['pass_rate']:.3f}", f"{r['checked_rate']:.3f}", str(r["active"]),
                      str(r["generate_s"]), str(r["verify_s"]))
    Console().print(table)
    write_json(report, args.out)
    return 0

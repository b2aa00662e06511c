"""Derived sources: RL rows built from the canonical rows of earlier sources.

``raw`` is ``{"seeds": {source: [canonical rows]}}`` (see
:func:`corpora.readers.read_records`). Each row's ``uuid`` comes from its seed
(``row_uuid(source, seed uuid)``), so it is stable when counts change, its
``license`` is the seed's, and ``metadata`` names the seed row.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import polars as pl

from common.text import normalize
from corpora.adapters._common import user
from corpora.registry import SourceSpec
from corpora.rl.if_constraints import INSTRUCTIONS, compose
from corpora.rl.long_context import draw_haystacks, make_task
from corpora.schema import RecordError, row_uuid


def _rank(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Rows in a seeded, stable pseudo-random order (md5 of seed and uuid)."""
    return sorted(rows, key=lambda r: hashlib.md5(f"{seed}:{r['uuid']}".encode()).hexdigest())


def _first_user(row: dict[str, Any]) -> str | None:
    msgs = row.get("messages") or row["responses_create_params"]["input"]
    return next((m["content"] for m in msgs if m["role"] == "user"), None)


def _option(spec: SourceSpec, key: str) -> Any:
    if key not in spec.options:
        raise RecordError(f"options.{key}: missing in the registry entry of {spec.name!r}")
    return spec.options[key]


def if_constraints(raw: dict[str, Any], spec: SourceSpec, root: Path) -> list[dict[str, Any]]:
    """IF-RL prompts: IFEval constraints composed onto the first user turn of seed rows.

    Options: ``count`` (prompts: a total, or ``{seed source: prompts}``), ``seed``,
    ``max_constraints`` (1-3),
    ``min_chars``/``max_chars`` (seed prompt length), ``exclude`` (instruction ids
    never drawn). Seeds containing code fences are skipped (constraints such as
    "no commas" would fight the code).
    """
    seed, count = int(_option(spec, "seed")), _option(spec, "count")
    quota = {src: int(count[src]) if isinstance(count, dict) else int(count) for src in raw["seeds"]}
    allowed = frozenset(INSTRUCTIONS) - set(spec.options.get("exclude", []))
    lo, hi = int(spec.options.get("min_chars", 20)), int(spec.options.get("max_chars", 1500))
    seeds = [(src, r) for src, rows in raw["seeds"].items() for r in rows]
    ranked = sorted(seeds, key=lambda sr: hashlib.md5(f"{seed}:{sr[1]['uuid']}".encode()).hexdigest())
    out: list[dict[str, Any]] = []
    taken = dict.fromkeys(quota, 0)
    total = sum(quota.values()) if isinstance(count, dict) else int(count)
    for src, row in ranked:
        if len(out) == total or taken[src] == quota[src]:
            continue
        text = _first_user(row)
        if text is None or not lo <= len(text.strip()) <= hi or "```" in text:
            continue
        taken[src] += 1
        task = compose(text.strip(), row["uuid"], seed, int(spec.options.get("max_constraints", 3)), allowed)
        out.append({"uuid": row_uuid(spec.name, row["uuid"]), "domain": "instruction_following",
                    "responses_create_params": {"input": user(task["prompt"])},
                    "agent_ref": "instruction_following", "instruction_id_list": task["instruction_id_list"],
                    "kwargs": task["kwargs"], "license": row["license"],
                    "metadata": {"seed_uuid": row["uuid"], "seed_source": src, "question": text.strip()}})
    return out


def structured_output(raw: dict[str, Any], spec: SourceSpec, root: Path) -> list[dict[str, Any]]:
    """Structured-output tasks from the real function schemas of tool-calling rows.

    Each distinct function (name + parameter schema) of the seeds' ``tools``
    becomes one task: write a realistic arguments object for it, valid under its
    parameter JSON Schema, which is the ``ground_truth`` (``{"schema": ...}``).
    Options: ``count``, ``seed``.
    """
    seed, count = int(_option(spec, "seed")), int(_option(spec, "count"))
    seen: set[str] = set()
    out = []
    for src, rows in raw["seeds"].items():
        for row in _rank(rows, seed):
            for tool in json.loads(row["responses_create_params"]["tools"] or "[]"):
                fn = tool.get("function", {})
                schema = fn.get("parameters") or {}
                key = json.dumps([fn.get("name"), schema], sort_keys=True)
                if len(out) == count or key in seen or not schema.get("properties"):
                    continue
                seen.add(key)
                prompt = (f"A program calls the function `{fn['name']}`: {fn.get('description', '').strip()}\n\n"
                          "Write a realistic example of the arguments object it could receive. Reply with only "
                          "a JSON object that is valid under this JSON Schema:\n\n```json\n"
                          f"{json.dumps(schema, indent=2)}\n```")
                out.append({"uuid": row_uuid(spec.name, key), "domain": "structured_output",
                            "responses_create_params": {"input": user(prompt)}, "agent_ref": "structured_output",
                            "ground_truth": {"schema": schema}, "license": row["license"],
                            "metadata": {"seed_uuid": row["uuid"], "seed_source": src, "function": fn["name"]}})
    return out


def _haystack_pool(seeds: dict[str, list[dict[str, Any]]], seed: int) -> list[tuple[dict[str, Any], str]]:
    """(row, text) of every seed row with a distinct normalized text (the first in seeded
    order), rows of all sources in one seeded order; the text is every turn, one per line."""
    rows = _rank([r for rs in seeds.values() for r in rs], seed)
    texts = ["\n".join(m["content"] for m in (r.get("messages") or r["responses_create_params"]["input"]))
             for r in rows]
    first = pl.select(normalize(pl.Series(texts, dtype=pl.Utf8)).is_first_distinct()).to_series().to_list()
    return [(r, t) for r, t, keep in zip(rows, texts, first, strict=True) if keep]


def long_context(raw: dict[str, Any], spec: SourceSpec, root: Path) -> list[dict[str, Any]]:
    """RULER-style needle and multi-hop retrieval tasks over haystacks of the seeds' text.

    Options: ``lengths`` (target prompt lengths in tokens), ``per_length`` (tasks
    per length and kind), ``kinds`` (``needle``, ``multi_hop``), ``seed``,
    ``tokenizer`` (an HF tokenizer directory; lengths are measured with it). The
    pool is every seed row with a distinct text (all its turns), in one seeded
    order; the tasks draw disjoint haystacks from it
    (:func:`corpora.rl.long_context.draw_haystacks`), so no source text is in two
    tasks and no two tasks near-duplicate each other. ``metadata.seed_uuids`` lists
    a task's haystack rows. The license of a task is the most restrictive of its
    haystack's if they differ, recorded as ``mixed:<licenses>``.

    Raises:
        RecordError: a missing option or tokenizer, no seed rows, or seeds too short
            to give every task a disjoint haystack of at least 90% of its budget
            (the message names ``lengths``/``per_length``, the tokens held and needed).
    """
    from transformers import AutoTokenizer

    seed, per_length = int(_option(spec, "seed")), int(_option(spec, "per_length"))
    tok_dir = Path(_option(spec, "tokenizer"))
    if not tok_dir.exists():
        raise RecordError(f"options.tokenizer: {tok_dir} not found (run `cascade fetch` first)")
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    pool = _haystack_pool(raw["seeds"], seed)
    if not pool:
        raise RecordError(f"seeds: the sources {spec.patterns} produced no rows to build haystacks from")
    lengths = [len(ids) for ids in tokenizer([t for _, t in pool], add_special_tokens=False)["input_ids"]]
    tasks = [(target, kind, i) for target in _option(spec, "lengths")
             for kind in spec.options.get("kinds", ["needle", "multi_hop"]) for i in range(per_length)]
    budgets = [int(target * 0.95) - 64 for target, _, _ in tasks]  # room for needles, question and chat template
    haystacks = draw_haystacks(lengths, budgets)
    short = [t for t, h in zip(tasks, haystacks, strict=True) if h is None]
    if short:
        raise RecordError(
            f"options.lengths/per_length: the seeds {spec.patterns} hold {sum(lengths):,} tokens in {len(pool):,} "
            f"distinct texts, too few for a disjoint haystack per task ({sum(budgets):,} tokens): {len(short)} of "
            f"{len(tasks)} tasks cannot be filled (target tokens {sorted({t for t, _, _ in short})}); lower "
            f"per_length or the longest lengths (params.yaml sources.options.{spec.name}) or add seed sources")
    rng = random.Random(seed)
    out = []
    for (target, kind, i), picked in zip(tasks, haystacks, strict=True):
        task = make_task(kind, [pool[j][1] for j in picked], rng)
        licenses = sorted({pool[j][0]["license"] for j in picked})
        measured = len(tokenizer(task["prompt"], add_special_tokens=False)["input_ids"])
        out.append({"uuid": row_uuid(spec.name, f"{target}:{kind}:{i}"), "domain": "long_context",
                    "responses_create_params": {"input": user(task["prompt"])}, "agent_ref": "long_context",
                    "ground_truth": {"answers": task["answers"], "match": "all"},
                    "license": licenses[0] if len(licenses) == 1 else "mixed:" + ",".join(licenses),
                    "metadata": {"kind": kind, "target_tokens": target, "prompt_tokens": measured,
                                 "depths": task["depths"], "haystack_docs": len(picked),
                                 "seed_uuids": [pool[j][0]["uuid"] for j in picked], "tokenizer": tok_dir.name}})
    return out

"""SFT data synthesis: teacher responses, kept only when verified (rejection sampling).

For prompts of the RL tables (math, code, instruction following, STEM multiple
choice, tool calling; chat prompts with a format filter), ``k`` responses per
prompt are sampled from a teacher through the stage runners' rollout engine
(thinking on where the chat template supports it), each checked by its
domain's verifier, and up to ``m`` verified ones per prompt become SFT rows:
the reasoning (inside ``<think>...</think>``) goes to ``reasoning_content``,
the answer to ``content``, the teacher to ``generator``, and the verdict,
sampling parameters and seed to ``metadata``. This is the recipe of the
paper's SFT data (teacher responses filtered by verification, arXiv
2603.19220 section 2) on a laptop scale.

Generations are cached by (prompt, teacher, sampling parameters, seed) through
:mod:`curation.difficulty`, so a new ``m`` or filter regenerates nothing and a
killed run resumes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import polars as pl

from common import plugins
from common.answers import split_reasoning
from common.io import Rejects
from common.text import md5_hex
from corpora.schema import SCHEMAS, row_uuid, validate_row
from curation.difficulty import Verdictish, prompt_chars


def sft_domain(rl_domain: str) -> str:
    """The SFT domain of a conversation synthesized from a prompt of ``rl_domain``: the
    ``sft_domain`` of the domain's verifier (entry-point group ``cascade_rl.domains``).

    Raises:
        ValueError: the domain is not installed, or its verifier declares no SFT domain.
    """
    verifier = plugins.load("domains", rl_domain)
    if verifier.sft_domain is None:
        raise ValueError(f"RL domain {rl_domain!r}: its verifier {verifier.__name__} declares no sft_domain, "
                         f"so synthesis cannot use it (drop it from synthesize.domains)")
    return verifier.sft_domain


def format_filter(response: str, min_chars: int, max_chars: int) -> tuple[bool, str]:
    """The acceptance rule for domains without a verifier (chat): a closed reasoning
    block, and an answer of ``min_chars``..``max_chars`` characters that does not
    repeat one line more than three times. Returns ``(passed, reason)``."""
    parts = split_reasoning(response)
    if parts is None:
        return False, "unclosed_think"
    answer = parts[1].strip()
    if not min_chars <= len(answer) <= max_chars:
        return False, f"length: {len(answer)} chars"
    lines = [ln.strip() for ln in answer.splitlines() if ln.strip()]
    if lines and max(lines.count(ln) for ln in set(lines)) > 3:
        return False, "repetition"
    return True, "format_ok"


def select_verified(prompts: pl.DataFrame, results: pl.DataFrame, m: int, teacher: str,
                    sampling: dict[str, Any], seed: int, rejects: Rejects) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """SFT rows from the first ``m`` passing responses of each prompt; every other
    response goes to ``rejects`` with its reason (``not_verified: <the verifier's reason>``,
    ``unclosed_think``, ``empty_answer`` or ``over_m``).

    Args:
        prompts: canonical RL rows (the prompts sampled from).
        results: :data:`curation.difficulty.RESULT_SCHEMA` rows (responses, rewards, reasons) per prompt uuid.
        m: responses kept per prompt at most.

    Returns:
        (validated SFT rows, stats: responses, kept, ``verdicts`` counted by reason
        category, ``kept_by_domain``).
    """
    def drop(prompt: dict[str, Any], i: int, reason: str, text: str) -> None:
        rejects.add(prompt["source"], f"{prompt['uuid']}:{i}", reason or "failed", {"response": text})

    by_uuid = {r["uuid"]: r for r in results.to_dicts()}
    rows, verdicts, kept_by_domain, n_resp = [], {}, {}, 0
    for prompt in prompts.to_dicts():
        res = by_uuid.get(prompt["uuid"])
        if res is None:
            continue
        kept = 0
        for i, (text, reward, reason) in enumerate(zip(res["responses"], res["rewards"], res["reasons"],
                                                      strict=True)):
            n_resp += 1
            key = reason.split(":")[0] if reason else "unknown"
            verdicts[key] = verdicts.get(key, 0) + 1
            parts = split_reasoning(text)
            if reward < 1.0:  # the verifier's reason is free text: its category is the verdict
                drop(prompt, i, f"not_verified: {reason or 'reward below 1'}", text)
                continue
            if parts is None or not parts[1].strip():
                drop(prompt, i, "unclosed_think" if parts is None else "empty_answer", text)
                continue
            if kept >= m:
                drop(prompt, i, f"over_m: {m} responses kept already", text)
                continue
            reasoning, answer = parts[0], parts[1].strip()
            msgs = [{"role": x["role"], "content": x["content"]} for x in prompt["responses_create_params"]["input"]]
            msgs.append({"role": "assistant", "content": answer, "reasoning_content": reasoning})
            rows.append(validate_row("sft", {
                "uuid": row_uuid("synthesized", f"{prompt['uuid']}:{teacher}:{seed}:{i}"),
                "messages": msgs, "tools": prompt["responses_create_params"]["tools"] or "[]",
                "domain": sft_domain(prompt["domain"]), "source": f"synth:{prompt['source']}",
                "source_version": prompt["source_version"], "license": prompt["license"], "generator": teacher,
                "metadata": json.dumps({"prompt_uuid": prompt["uuid"], "sample": i, "verdict": reason,
                                        "reward": reward, "sampling": sampling, "seed": seed})}))
            kept += 1
            kept_by_domain[prompt["domain"]] = kept_by_domain.get(prompt["domain"], 0) + 1
    return rows, {"responses": n_resp, "kept": len(rows), "verdicts": dict(sorted(verdicts.items())),
                  "kept_by_domain": dict(sorted(kept_by_domain.items()))}


def empty_sft() -> pl.DataFrame:
    """An empty SFT table with the canonical schema."""
    return pl.from_arrow(SCHEMAS["sft"].empty_table())


def select_prompts(rl: pl.DataFrame, domains: list[str], per_domain: int, max_prompt_chars: int,
                   seed: int) -> pl.DataFrame:
    """The RL prompts the teacher answers: per domain of ``domains`` (in that order), the first
    ``per_domain`` rows in a seeded order (md5 of the uuid) among those with at most
    ``max_prompt_chars`` prompt characters."""
    rl = rl.filter(prompt_chars() <= max_prompt_chars)
    ranked = rl.with_columns(md5_hex(rl["uuid"], f"synthesize:{seed}:").alias("_r")).sort("_r").drop("_r")
    return pl.concat([ranked.head(0)] + [ranked.filter(pl.col("domain") == d).head(per_domain) for d in domains])


def verified_or_formatted(min_chars: int, max_chars: int, timeout_s: float
                          ) -> Callable[[list[str], list[dict[str, Any]]], list[Any]]:
    """The scorer of synthesis: the row's verifier (``verify_batch``) where it grades single responses,
    the :func:`format_filter` for the others (chat rows, ``agent_ref`` ``genrm``: no verifier without a
    judge; ``Verifier.grades_responses``)."""
    from validators.verifiers import get_verifier, verify_batch

    def score(responses: list[str], rows: list[dict[str, Any]]) -> list[Any]:
        verified = [i for i, r in enumerate(rows) if get_verifier(r["agent_ref"]).grades_responses]
        verdicts: list[Any] = [Verdictish(*format_filter(t, min_chars, max_chars)) for t in responses]
        graded = verify_batch([responses[i] for i in verified], [rows[i] for i in verified],
                              timeout_s=timeout_s, workers=2)
        for i, v in zip(verified, graded, strict=True):
            verdicts[i] = v
        return verdicts
    return score

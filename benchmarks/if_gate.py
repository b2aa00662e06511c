"""The instruction-following relevance gate, measured on the real IF rows (issue #33).

    python -m benchmarks.if_gate [--rows 200] [--tune-rows 100] [--no-generate] [--grid]

Rows: ``data/sets/rl/instruction_following`` (this checkout's ``data/``, else ``/work/main/data``).
The train split is shuffled with seed 0: its first ``--tune-rows`` are the rows the gate's thresholds
were chosen on (``--grid`` prints that search); the report rows are every validation row (64) then
the next train rows of the shuffle (never tuned on), ``--rows`` in all.

Per row, ungated (``RelevanceGate(enabled=False)``, the old reward) and gated (the default gate):

* ``ok``: the constant reply;
* constraint-only texts, built from the row's ``instruction_id_list``/``kwargs`` alone by
  :func:`build_degenerate` at 8 lengths (the attacker keeps any that pays): ``offtopic`` (garden
  sentences), ``boilerplate`` (generic "here is a helpful answer" sentences), ``echo+offtopic`` (the
  question copied verbatim, then garden sentences); "best of 3": any of the three pays;
* ``keyword_salad``: garden sentences carrying the question's content words: the attack a lexical
  gate cannot see (reported, not claimed);
* honest: the greedy answer of SmolLM2-135M-Instruct (fp32, chat template of the RL stages,
  ``max_new_tokens`` 256), cached in ``.cache/if_gate/greedy.jsonl`` (gitignored; a rerun generates
  only what is missing, ``--no-generate`` uses the cached rows only). ``honest_paid``: paid without
  the gate; ``honest_lost``: of those, zeroed by the gate; ``honest_gated``: every honest answer the
  gate refuses.

Rates are printed with 95% Wilson intervals. The measured numbers are in the module doc of
:mod:`validators.verifiers.ifeval`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = Path("/work/main/data") if not (REPO / "data" / "sets").exists() else REPO / "data"
SETS = DATA / "sets" / "rl" / "instruction_following"
ASSET = DATA / "assets" / "SmolLM2-135M-Instruct"
CACHE = REPO / ".cache" / "if_gate" / "greedy.jsonl"
MAX_NEW_TOKENS = 256
SEED = 0


def load_rows(tune_rows: int, report_rows: int) -> tuple[list[dict], list[dict]]:
    """``(tune, report)``: tune = the first ``tune_rows`` of the train split shuffled with seed 0;
    report = every validation row, then the next train rows of that shuffle (never tuned on) up to
    ``report_rows``."""
    import polars as pl

    train = pl.read_parquet(SETS / "train.parquet").to_dicts()
    val = pl.read_parquet(SETS / "validation.parquet").to_dicts()
    random.Random(SEED).shuffle(train)
    tune = train[:tune_rows]
    held = train[tune_rows:]
    for r in val:
        r["_split"] = "validation"
    for r in tune:
        r["_split"] = "train-tune"
    for r in held:
        r["_split"] = "train-heldout"
    report = (val + held)[:report_rows]
    return tune, report


def _cached() -> dict[str, str]:
    out = {}
    if CACHE.exists():
        for line in CACHE.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("max_new_tokens") == MAX_NEW_TOKENS:
                out[rec["uuid"]] = rec["text"]
    return out


def greedy_answers(rows: list[dict], batch_size: int = 8, generate: bool = True) -> dict[str, str]:
    """Greedy answers of SmolLM2-135M-Instruct (fp32, ``MAX_NEW_TOKENS``), cached by uuid in
    ``.cache/if_gate/greedy.jsonl`` (gitignored): a rerun generates only the missing rows."""
    done = _cached()
    todo = [r for r in rows if r["uuid"] not in done]
    if not todo or not generate:
        return done
    import torch

    from stages.checkpoints import load_checkpoint
    from stages.environment import PromptBuilder

    torch.set_num_threads(1)  # the machine is shared: 2 threads stall at every barrier under load
    model, tok = load_checkpoint(ASSET)
    model.eval()
    builder = PromptBuilder(tok, max_prompt_tokens=4096)
    # batches of prompts of similar length (little padding), run in random order (a run cut short
    # leaves a sample of every split and every prompt length)
    ranked = sorted(((r["uuid"], builder(r)) for r in todo), key=lambda p: len(p[1]))
    batches = [ranked[b:b + batch_size] for b in range(0, len(ranked), batch_size)]
    random.Random(SEED).shuffle(batches)
    prompts = [p for batch in batches for p in batch]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    t0, n_tok = time.time(), 0
    for b in range(0, len(prompts), batch_size):
        chunk = prompts[b:b + batch_size]
        width = max(len(ids) for _, ids in chunk)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids in chunk])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in chunk])
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=MAX_NEW_TOKENS, pad_token_id=pad)
        with CACHE.open("a") as fh:
            for (uid, _), seq in zip(chunk, out[:, width:]):
                ids = [int(t) for t in seq if int(t) != pad]
                n_tok += len(ids)
                text = tok.decode(ids, skip_special_tokens=True).strip()
                done[uid] = text
                fh.write(json.dumps({"uuid": uid, "max_new_tokens": MAX_NEW_TOKENS, "text": text}) + "\n")
        print(f"generated {b + len(chunk)}/{len(prompts)} ({n_tok / (time.time() - t0):.0f} tokens/s)", flush=True)
    return done


# ------------------------------------------------------------------ degenerate answers
#: Off-topic sentences (no comma, no capitalised word but the first, no "I"): what a policy can emit
#: whatever the request when only the constraints are paid.
FILLER = [
    "The garden was quiet in the early morning light.",
    "Small birds moved between the branches of the old tree.",
    "A cup of tea sat cooling on the wooden table.",
    "The river ran slowly past the stone bridge.",
    "Clouds drifted over the hills before noon.",
    "The market opened late because of the rain.",
    "A cat slept on the warm step near the door.",
    "The road wound through fields of tall grass.",
    "Bread was baking in the small kitchen.",
    "The evening bell rang across the quiet town.",
]
#: Generic assistant boilerplate: sounds like an answer, addresses nothing.
BOILERPLATE = [
    "Sure here is a clear and helpful answer to your request.",
    "This is an important topic and there are several points to consider.",
    "First it is worth thinking about the main goal.",
    "Next it helps to look at the details step by step.",
    "Each part matters and should be handled with care.",
    "In the end the best approach depends on your situation.",
    "Overall this should give you a good starting point.",
    "Feel free to adapt these ideas to your needs.",
]


def _sentences(pool: list[str], n: int) -> list[str]:
    return [pool[i % len(pool)] for i in range(n)]


def build_degenerate(row: dict[str, Any], body: list[str], n_sent: int, head: str = "") -> str:
    """Text that follows ``row``'s instructions (read from its ``instruction_id_list``/``kwargs``) with
    ``n_sent`` sentences of ``body`` as content, ``head`` (e.g. the question) in front."""
    import re

    specs = list(zip(row["instruction_id_list"], json.loads(row["kwargs"]) if isinstance(row["kwargs"], str)
                     else row["kwargs"]))
    ids = {i for i, _ in specs}
    kw = {i: (k or {}) for i, k in specs}
    sents = _sentences(body, max(1, n_sent))
    extra: list[str] = []
    for iid, k in specs:
        if iid == "keywords:existence":
            extra += [f"The word {w} is here." for w in k["keywords"]]
        elif iid == "keywords:frequency" and k["relation"] == "at least":
            extra += [f"{k['keyword']} again."] * int(k["frequency"])
        elif iid == "keywords:letter_frequency" and k["let_relation"] == "at least":
            extra.append(k["letter"].lower() * int(k["let_frequency"]) + ".")
        elif iid == "change_case:capital_word_frequency" and k["capital_relation"] == "at least":
            extra.append(" ".join(["OK"] * int(k["capital_frequency"])) + ".")
        elif iid == "detectable_content:number_placeholders":
            extra.append(" ".join(["[note]"] * int(k["num_placeholders"])) + ".")
        elif iid == "detectable_format:number_highlighted_sections":
            extra.append(" ".join(["*see this*"] * int(k["num_highlights"])) + ".")
    sents = ([head] if head else []) + sents + extra
    # structure: paragraphs / sections / bullets
    n_par = 1
    sep = "\n\n"
    if "length_constraints:number_paragraphs" in ids:
        n_par, sep = int(kw["length_constraints:number_paragraphs"]["num_paragraphs"]), "\n***\n"
    if "length_constraints:nth_paragraph_first_word" in ids:
        n_par, sep = int(kw["length_constraints:nth_paragraph_first_word"]["num_paragraphs"]), "\n\n"
    if "detectable_format:multiple_sections" in ids:
        n_par = max(n_par, int(kw["detectable_format:multiple_sections"]["num_sections"]))
    while len(sents) < n_par:
        sents.append(body[len(sents) % len(body)])
    per = -(-len(sents) // n_par)
    paras = [" ".join(sents[i * per:(i + 1) * per]) or body[i % len(body)] for i in range(n_par)]
    if "length_constraints:nth_paragraph_first_word" in ids:
        k = kw["length_constraints:nth_paragraph_first_word"]
        n = int(k["nth_paragraph"]) - 1
        if 0 <= n < len(paras):
            paras[n] = k["first_word"] + " " + paras[n]
    if "detectable_format:multiple_sections" in ids:
        spl = kw["detectable_format:multiple_sections"]["section_spliter"].strip()
        paras = [f"{spl} {i + 1}\n{p}" for i, p in enumerate(paras)]
    text = sep.join(paras)
    if "detectable_format:number_bullet_lists" in ids:
        n = int(kw["detectable_format:number_bullet_lists"]["num_bullets"])
        text += "\n" + "\n".join(f"* {body[i % len(body)]}" for i in range(n))
    if "detectable_format:title" in ids:
        text = "<<Notes>>\n" + text
    if "combination:repeat_prompt" in ids:
        text = kw["combination:repeat_prompt"]["prompt_to_repeat"] + "\n" + text
    if "detectable_content:postscript" in ids:
        text += "\n" + kw["detectable_content:postscript"]["postscript_marker"] + " " + body[-1]
    if "combination:two_responses" in ids:
        text = text + "\n******\n" + " ".join(reversed(sents[:max(1, len(sents) // 2)])) + " Done."
    if "startend:end_checker" in ids:
        text += " " + kw["startend:end_checker"]["end_phrase"]
    if "keywords:forbidden_words" in ids:
        for w in kw["keywords:forbidden_words"]["forbidden_words"]:
            text = re.sub(r"\b" + re.escape(w) + r"\b", "", text, flags=re.I)
    for iid, k in specs:
        if iid == "keywords:frequency" and k["relation"] == "less than":
            text = re.sub(re.escape(k["keyword"]), "", text, flags=re.I)
    if "punctuation:no_comma" in ids:
        text = text.replace(",", "")
    if "change_case:english_lowercase" in ids:
        text = text.lower()
    if "change_case:english_capital" in ids:
        text = text.upper()
    if "detectable_format:json_format" in ids:
        text = json.dumps({"text": text})
    if "startend:quotation" in ids:
        text = '"' + text + '"'
    return text


def salad(question: str, n: int = 6) -> list[str]:
    """Off-topic sentences each carrying content words of the question (the "keyword salad" attack)."""
    from validators.verifiers.ifbench import STOP_WORDS
    from validators.verifiers.ifeval import CHAT_WORDS
    from validators.verifiers.ifeval import words as split_words

    words = [w for w in dict.fromkeys(split_words(question))
             if len(w) >= 3 and w not in STOP_WORDS and w not in CHAT_WORDS] or ["thing"]
    return [f"{FILLER[i % len(FILLER)][:-1]} near the {words[i % len(words)]} and the "
            f"{words[(i + 1) % len(words)]}." for i in range(n)]


SIZES = (1, 2, 3, 5, 8, 12, 20, 30)


def degenerate_variants(row: dict[str, Any]) -> dict[str, list[str]]:
    """Attack family -> candidate texts for ``row`` (the attacker keeps any that pays)."""
    from validators.verifiers.ifeval import request_text

    q = request_text(row)
    return {
        "ok": ["ok"],
        "offtopic": [build_degenerate(row, FILLER, n) for n in SIZES],
        "boilerplate": [build_degenerate(row, BOILERPLATE, n) for n in SIZES],
        "echo+offtopic": [build_degenerate(row, FILLER, n, head=q) for n in SIZES],
        "keyword_salad": [build_degenerate(row, salad(q), n) for n in SIZES],
    }


# ------------------------------------------------------------------ measuring
def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of ``k`` successes out of ``n``."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k:4d}/{n:<4d} {100 * k / max(n, 1):5.1f}%  [{100 * lo:5.1f}, {100 * hi:5.1f}]"


def ungated_scores(rows: list[dict], answers: dict[str, str]) -> list[dict[str, Any]]:
    """Per row: the ungated reward of every candidate (``family -> [reward]``, honest included) and the
    final answers, so that any gate can be applied afterwards without re-checking the constraints."""
    from common.answers import final_answer
    from validators.verifiers.ifeval import InstructionFollowingVerifier, RelevanceGate

    off = InstructionFollowingVerifier(RelevanceGate(enabled=False))
    out = []
    for r in rows:
        fams = degenerate_variants(r)
        if r["uuid"] in answers:
            fams["honest"] = [answers[r["uuid"]]]
        rec = {"row": r, "cands": {}}
        for fam, texts in fams.items():
            rec["cands"][fam] = [(final_answer(t) or "", off.verify(t, r).reward) for t in texts]
        out.append(rec)
    return out


def measure(scored: list[dict[str, Any]], gate) -> dict[str, tuple[int, int]]:
    """``name -> (k, n)``: for each degenerate family, rows where some candidate pays (reward > 0);
    ``honest_paid``: honest answers paid without the gate; ``honest_lost``: of those, the ones the
    gate zeroes; ``honest_gated``: every honest answer the gate refuses."""
    res: dict[str, list[int]] = {}
    for rec in scored:
        r = rec["row"]
        anyd = [False, False]
        for fam, cands in rec["cands"].items():
            paid_off = any(rw > 0 for _, rw in cands)
            paid_on = any(rw > 0 and gate.check(a, r)[0] for a, rw in cands)
            if fam == "honest":
                a, rw = cands[0]
                ok = gate.check(a, r)[0]
                for key, hit, cnt in (("honest_paid", rw > 0, True), ("honest_lost", rw > 0 and not ok, rw > 0),
                                      ("honest_gated", not ok, True)):
                    k_n = res.setdefault(key, [0, 0])
                    k_n[0] += hit
                    k_n[1] += cnt
                continue
            for key, hit in ((f"{fam} (ungated)", paid_off), (f"{fam} (gated)", paid_on)):
                k_n = res.setdefault(key, [0, 0])
                k_n[0] += hit
                k_n[1] += 1
            if fam not in ("ok", "keyword_salad"):
                anyd[0] |= paid_off
                anyd[1] |= paid_on
        for key, hit in (("constraint-only, best of 3 (ungated)", anyd[0]), ("constraint-only, best of 3 (gated)", anyd[1])):
            k_n = res.setdefault(key, [0, 0])
            k_n[0] += hit
            k_n[1] += 1
    return {k: (v[0], v[1]) for k, v in res.items()}


def grid(scored: list[dict[str, Any]]) -> None:
    """The threshold search printed on the tune rows (how the defaults were chosen)."""
    from validators.verifiers.ifeval import RelevanceGate

    print("min_words min_shared min_share copy_run | constraint-only paid | honest lost/paid | honest gated")
    for mw in (5, 10, 15, 20):
        for ms in (1, 2, 3):
            for share in (0.5, 1.0):
                for run in (0, 5, 8):
                    m = measure(scored, RelevanceGate(min_words=mw, min_shared=ms, min_share=share, copy_run=run))
                    d, hl, hg = m["constraint-only, best of 3 (gated)"], m.get("honest_lost", (0, 0)), \
                        m.get("honest_gated", (0, 0))
                    print(f"{mw:9d} {ms:10d} {share:9.2f} {run:8d} | {d[0]:3d}/{d[1]:<3d} | {hl[0]:3d}/{hl[1]:<3d} | "
                          f"{hg[0]:3d}/{hg[1]:<3d}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200, help="report rows: all validation rows, then held-out train rows")
    ap.add_argument("--tune-rows", type=int, default=100, help="train rows the thresholds were chosen on")
    ap.add_argument("--no-generate", action="store_true", help="only rows whose greedy answer is cached")
    ap.add_argument("--generate-only", action="store_true")
    ap.add_argument("--grid", action="store_true", help="print the threshold search on the tune rows")
    args = ap.parse_args(argv)
    from validators.verifiers.ifeval import RelevanceGate

    tune, report = load_rows(args.tune_rows, args.rows)
    answers = greedy_answers(tune + report, generate=not args.no_generate)
    if args.generate_only:
        return
    gate = RelevanceGate()
    print(f"gate: {gate}")
    for name, rows in (("tune (train rows the thresholds were chosen on)", tune),
                       ("report: validation rows", [r for r in report if r["_split"] == "validation"]),
                       ("report: held-out train rows", [r for r in report if r["_split"] == "train-heldout"]),
                       ("report: all (validation + held-out train)", report)):
        scored = ungated_scores(rows, answers)
        n_honest = sum("honest" in rec["cands"] for rec in scored)
        print(f"\n== {name}: {len(rows)} rows, {n_honest} with a greedy answer")
        if args.grid and rows is tune:
            grid(scored)
        for key, (k, n) in measure(scored, gate).items():
            print(f"  {key:42s} {rate(k, n)}")


if __name__ == "__main__":
    main()

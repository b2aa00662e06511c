"""IF-RL prompt synthesis: verifiable IFEval constraints composed onto real seed prompts.

Each seed prompt (the first user turn of a conversation from a non-benchmark
source) gets one to three constraints, drawn with a per-seed RNG
(``md5(seed + uuid)``) from the IFEval instruction types (Zhou et al. 2023,
"Instruction-Following Evaluation for Large Language Models", Table 1), with
kwargs sampled in the ranges the IFEval prompts use, and the instruction text
appended to the prompt. Pairs that cannot both hold, or whose checks interfere,
are never combined (:data:`CONFLICTS`, :data:`EXCLUSIVE`). The row carries
``instruction_id_list`` and ``kwargs`` exactly as IFEval does, so the same
verifier scores it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

_WORDS = ["history", "energy", "balance", "network", "future", "garden", "strategy", "quality", "journey",
          "community", "science", "simple", "planet", "market", "memory", "window", "river", "signal"]
_RELATIONS = ["less than", "at least"]

#: Types that take the whole shape of the response and are never combined with another.
EXCLUSIVE = frozenset({"detectable_format:json_format", "detectable_format:constrained_response",
                       "combination:two_responses", "combination:repeat_prompt"})
#: Groups whose members contradict or interfere with each other (at most one per prompt).
CONFLICTS: tuple[frozenset[str], ...] = (
    frozenset({"change_case:english_capital", "change_case:english_lowercase",
               "change_case:capital_word_frequency"}),
    frozenset({"length_constraints:number_paragraphs", "length_constraints:nth_paragraph_first_word",
               "detectable_format:multiple_sections"}),
    frozenset({"startend:quotation", "startend:end_checker", "detectable_content:postscript"}),
    frozenset({"keywords:existence", "keywords:forbidden_words", "keywords:frequency"}),
    frozenset({"length_constraints:number_words", "length_constraints:number_sentences"}),
)


def _rel(rng: random.Random, lo: int, hi: int) -> tuple[str, int]:
    rel = rng.choice(_RELATIONS)
    return rel, rng.randint(max(lo, 2) if rel == "less than" else lo, hi)


def _words_rel(r: random.Random) -> dict[str, Any]:
    rel, n = r.choice(_RELATIONS), r.choice([50, 100, 150, 200, 300])
    return {"relation": rel, "num_words": n}


def _sentences(r: random.Random) -> dict[str, Any]:
    rel, n = _rel(r, 2, 12)
    return {"relation": rel, "num_sentences": n}


def _capital(r: random.Random) -> dict[str, Any]:
    rel, n = _rel(r, 2, 15)
    return {"capital_relation": rel, "capital_frequency": n}


def _keyword_freq(r: random.Random) -> dict[str, Any]:
    rel, n = _rel(r, 1, 4)
    return {"keyword": r.choice(_WORDS), "frequency": n, "relation": rel}


def _letter(r: random.Random) -> dict[str, Any]:
    rel, n = _rel(r, 2, 10)
    return {"letter": r.choice("abcdefghijklmnopqrstuvwxyz"), "let_frequency": n, "let_relation": rel}


def _nth(r: random.Random) -> dict[str, Any]:
    n = r.randint(2, 5)
    return {"num_paragraphs": n, "nth_paragraph": r.randint(1, n), "first_word": r.choice(_WORDS)}


#: instruction id -> (kwargs sampler, instruction text renderer)
INSTRUCTIONS: dict[str, tuple[Callable[[random.Random], dict[str, Any]], Callable[[dict[str, Any]], str]]] = {
    "change_case:capital_word_frequency": (
        _capital, lambda k: f"In your response, words with all capital letters should appear "
                            f"{k['capital_relation']} {k['capital_frequency']} times."),
    "change_case:english_capital": (
        lambda r: {}, lambda k: "Your entire response should be in English, and in all capital letters."),
    "change_case:english_lowercase": (
        lambda r: {}, lambda k: "Your entire response should be in English, and in all lowercase letters. "
                                "No capital letters are allowed."),
    "combination:repeat_prompt": (
        lambda r: {}, lambda k: "First repeat the request word for word without change, then give your answer."),
    "combination:two_responses": (
        lambda r: {}, lambda k: "Give two different responses. Responses and only responses should be separated "
                                "by 6 asterisk symbols: ******."),
    "detectable_content:number_placeholders": (
        lambda r: {"num_placeholders": r.randint(1, 4)},
        lambda k: f"The response must contain at least {k['num_placeholders']} placeholders represented by "
                  f"square brackets, such as [address]."),
    "detectable_content:postscript": (
        lambda r: {"postscript_marker": r.choice(["P.S.", "P.P.S"])},
        lambda k: f"At the end of your response, please explicitly add a postscript starting with "
                  f"{k['postscript_marker']}"),
    "detectable_format:constrained_response": (
        lambda r: {}, lambda k: "Answer with one of the following options: ('My answer is yes.', 'My answer is "
                                "no.', 'My answer is maybe.')"),
    "detectable_format:json_format": (
        lambda r: {}, lambda k: "Entire output should be wrapped in JSON format. You can use markdown ticks "
                                "such as ```."),
    "detectable_format:multiple_sections": (
        lambda r: {"section_spliter": r.choice(["Section", "SECTION", "PARAGRAPH"]),
                   "num_sections": r.randint(2, 5)},
        lambda k: f"Your response must have {k['num_sections']} sections. Mark the beginning of each section "
                  f"with {k['section_spliter']} X, such as: {k['section_spliter']} 1"),
    "detectable_format:number_bullet_lists": (
        lambda r: {"num_bullets": r.randint(2, 6)},
        lambda k: f"Your answer must contain exactly {k['num_bullets']} bullet points. Use the markdown bullet "
                  f"points such as:\n* This is point 1."),
    "detectable_format:number_highlighted_sections": (
        lambda r: {"num_highlights": r.randint(1, 4)},
        lambda k: f"Highlight at least {k['num_highlights']} sections in your answer with markdown, i.e. "
                  f"*highlighted section*."),
    "detectable_format:title": (
        lambda r: {}, lambda k: "Your answer must contain a title, wrapped in double angular brackets, such as "
                                "<<poem of joy>>."),
    "keywords:existence": (
        lambda r: {"keywords": r.sample(_WORDS, r.randint(1, 2))},
        lambda k: "Include keywords " + ", ".join(k["keywords"]) + " in the response."),
    "keywords:forbidden_words": (
        lambda r: {"forbidden_words": r.sample(_WORDS, r.randint(1, 3))},
        lambda k: "Do not include keywords " + ", ".join(k["forbidden_words"]) + " in the response."),
    "keywords:frequency": (
        _keyword_freq, lambda k: f"In your response, the word {k['keyword']} should appear {k['relation']} "
                                 f"{k['frequency']} times."),
    "keywords:letter_frequency": (
        _letter, lambda k: f"In your response, the letter {k['letter']} should appear {k['let_relation']} "
                           f"{k['let_frequency']} times."),
    "length_constraints:nth_paragraph_first_word": (
        _nth, lambda k: f"There should be {k['num_paragraphs']} paragraphs. Paragraphs and only paragraphs are "
                        f"separated with each other by two new lines as if it was '\\n\\n' in python. Paragraph "
                        f"{k['nth_paragraph']} must start with word {k['first_word']}."),
    "length_constraints:number_paragraphs": (
        lambda r: {"num_paragraphs": r.randint(2, 5)},
        lambda k: f"There should be {k['num_paragraphs']} paragraphs. Paragraphs are separated with the "
                  f"markdown divider: ***"),
    "length_constraints:number_sentences": (
        _sentences, lambda k: f"Your response should contain {k['relation']} {k['num_sentences']} sentences."),
    "length_constraints:number_words": (
        _words_rel, lambda k: f"Answer with {k['relation']} {k['num_words']} words."),
    "punctuation:no_comma": (
        lambda r: {}, lambda k: "In your entire response, refrain from the use of any commas."),
    "startend:end_checker": (
        lambda r: {"end_phrase": r.choice(["Is there anything else I can help with?",
                                           "Let me know if you have additional questions."])},
        lambda k: f"Finish your response with this exact phrase {k['end_phrase']} No other words should follow "
                  f"this phrase."),
    "startend:quotation": (
        lambda r: {}, lambda k: "Wrap your entire response with double quotation marks."),
}


def compatible(chosen: list[str], candidate: str) -> bool:
    """True when ``candidate`` may join ``chosen`` (no exclusive type, no conflict group shared)."""
    if candidate in chosen:
        return False
    if chosen and (candidate in EXCLUSIVE or any(c in EXCLUSIVE for c in chosen)):
        return False
    return not any(candidate in g and any(c in g for c in chosen) for g in CONFLICTS)


def compose(seed_text: str, row_key: str, seed: int, max_constraints: int = 3,
            allowed: frozenset[str] | None = None) -> dict[str, Any]:
    """Compose constraints onto one seed prompt.

    Args:
        seed_text: the seed user prompt.
        row_key: a stable id of the seed (its uuid): with ``seed`` it fixes the draw.
        allowed: instruction ids to draw from (default: all of :data:`INSTRUCTIONS`).

    Returns:
        ``{"prompt", "instruction_id_list", "kwargs"}``; ``kwargs`` has one dict
        per instruction (``combination:repeat_prompt`` gets ``prompt_to_repeat`` =
        the seed text, as in IFEval).
    """
    digest = hashlib.md5(f"{seed}:{row_key}".encode()).hexdigest()
    rng = random.Random(int(digest[:16], 16))
    pool = sorted(allowed if allowed is not None else INSTRUCTIONS)
    want = rng.randint(1, max_constraints)
    chosen: list[str] = []
    for candidate in rng.sample(pool, len(pool)):
        if len(chosen) == want:
            break
        if compatible(chosen, candidate):
            chosen.append(candidate)
    kwargs, texts = [], []
    for iid in chosen:
        sample, render = INSTRUCTIONS[iid]
        kw = sample(rng)
        if iid == "combination:repeat_prompt":
            kw = {"prompt_to_repeat": seed_text}
        kwargs.append(kw)
        texts.append(render(kw))
    return {"prompt": f"{seed_text.rstrip()}\n\n{' '.join(texts)}", "instruction_id_list": chosen, "kwargs": kwargs}

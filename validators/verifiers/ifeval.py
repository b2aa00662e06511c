"""Instruction-following verifier (``agent_ref`` ``instruction_following``) and the 25 IFEval checks.

A row lists ``instruction_id_list`` and, in ``kwargs`` (JSON), one argument object per instruction.
Every instruction is checked on the final answer (reasoning stripped; an unclosed ``<think>`` fails
all of them); a repeated id is evaluated once per occurrence. Reward: ``1.0`` only if every
instruction is followed (strict IFEval "prompt-level" accuracy, the default), or the fraction
followed when ``metadata.reward_mode`` is ``"fraction"`` (``passed`` still means all followed).

Checks follow the reference IFEval semantics (google-research ``instruction_following_eval``,
Zhou et al. 2023) and IFBench's (allenai/IFBench, :mod:`validators.verifiers.ifbench`), reimplemented
offline. Differences, by design:

* no nltk data is available here, so sentences come from :func:`split_sentences` (a regex splitter
  that keeps ``Mr.``, ``e.g.``, decimals and acronyms inside a sentence) instead of Punkt, and word
  tokens from :func:`tokens` (word runs with inner ``'-.``, punctuation as its own token) instead of
  the Treebank tokenizer; word counts use ``\\w+`` runs (what IFEval's RegexpTokenizer does);
* keywords are matched literally (``re.escape``), not as regexes;
* relations are exactly ``"less than"`` (strict ``<``) and ``"at least"`` (``>=``); any other
  relation, a letter that is not one ASCII letter, a missing argument or an unknown instruction id
  raise ValueError (``check_row`` rejects the row; at grading the verdict is 0): never a random
  default;
* only the strict response is graded (no "loose" variants);
* no hedging: ``detectable_format:constrained_response`` needs exactly one of its three answers
  (the reference accepts a response that lists all three), and an empty final answer follows no
  instruction (it would satisfy "no commas", "all lowercase", "fewer than N words" without
  answering anything).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.answers import row_json
from validators.verifiers.registry import (
    Verdict,
    Verifier,
    fail,
    metadata,
)

RELATIONS = ("less than", "at least")


@dataclass(frozen=True)
class Instruction:
    """One checkable instruction: ``check(text, **kwargs) -> bool`` and its argument names."""

    check: Callable[..., bool]
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()


INSTRUCTIONS: dict[str, Instruction] = {}


def instruction(iid: str, *required: str, optional: tuple[str, ...] = ()) -> Callable:
    """Decorator registering a check function under instruction id ``iid``."""
    def deco(fn: Callable[..., bool]) -> Callable[..., bool]:
        INSTRUCTIONS[iid] = Instruction(fn, required, optional)
        return fn
    return deco


# ------------------------------------------------------------------ text helpers
_PROTECT = [
    (re.compile(r"\b(Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|vs|etc|Inc|Ltd|Co|Fig|No|approx)\."), r"\1<prd>"),
    (re.compile(r"\b(e)\.(g)\.", re.I), r"\1<prd>\2<prd>"),
    (re.compile(r"\b(i)\.(e)\.", re.I), r"\1<prd>\2<prd>"),
    (re.compile(r"(\d)\.(\d)"), r"\1<prd>\2"),
    (re.compile(r"\b([A-Z])\.(?=[A-Z]\.|\s[A-Z][a-z])"), r"\1<prd>"),
    (re.compile(r"\.(com|org|net|io|edu|gov)\b"), r"<prd>\1"),
]
_SENT_END = re.compile(r"[.!?‽]+[\"'”’)\]]*(?=\s|$)")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (newlines count as spaces), each ending with its punctuation.

    Regex splitter (documented stand-in for nltk Punkt / IFBench's ``split_into_sentences``): a
    sentence ends at ``.``, ``!``, ``?`` (runs, plus closing quotes/brackets) before whitespace or
    the end; abbreviations (``Mr.``, ``Dr.``, ``e.g.``, ``i.e.``, ``etc.``), decimals, initials and
    domain names do not end one. Text after the last mark is a sentence too.
    """
    t = re.sub(r"\s+", " ", text).strip()
    for pat, rep in _PROTECT:
        t = pat.sub(rep, t)
    out, start = [], 0
    for m in _SENT_END.finditer(t):
        out.append(t[start:m.end()])
        start = m.end()
    out.append(t[start:])
    return [s.replace("<prd>", ".").strip() for s in out if s.strip()]


def count_words(text: str) -> int:
    """Number of ``\\w+`` runs (IFEval's ``RegexpTokenizer(r"\\w+")`` count)."""
    return len(re.findall(r"\w+", text))


def tokens(text: str) -> list[str]:
    """Word tokens (letters/digits with inner ``'``, ``-``, ``.``) and single punctuation tokens:
    the documented stand-in for ``nltk.word_tokenize``."""
    return re.findall(r"\w+(?:['’\-.]\w+)*|[^\w\s]", text)


def compare(count: float, relation: str, threshold: float) -> bool:
    """``count < threshold`` for ``"less than"``, ``count >= threshold`` for ``"at least"``.

    Raises:
        ValueError: any other relation.
    """
    if relation == "less than":
        return count < threshold
    if relation == "at least":
        return count >= threshold
    raise ValueError(f"unknown relation {relation!r}; expected one of {RELATIONS}")


def _language(text: str) -> str | None:
    from langdetect import DetectorFactory, LangDetectException, detect

    DetectorFactory.seed = 0  # langdetect is random without a seed
    try:
        return detect(text)
    except LangDetectException:
        return None


# ------------------------------------------------------------------ IFEval (25)
@instruction("keywords:existence", "keywords")
def _existence(text: str, keywords: list[str]) -> bool:
    return all(re.search(re.escape(k), text, re.I) for k in keywords)


@instruction("keywords:frequency", "keyword", "frequency", "relation")
def _frequency(text: str, keyword: str, frequency: int, relation: str) -> bool:
    return compare(len(re.findall(re.escape(keyword), text, re.I)), relation, frequency)


@instruction("keywords:forbidden_words", "forbidden_words")
def _forbidden(text: str, forbidden_words: list[str]) -> bool:
    return not any(re.search(r"\b" + re.escape(w) + r"\b", text, re.I) for w in forbidden_words)


@instruction("keywords:letter_frequency", "letter", "let_frequency", "let_relation")
def _letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    if not (isinstance(letter, str) and len(letter) == 1 and letter.isascii() and letter.isalpha()):
        raise ValueError(f"letter must be one ASCII letter, got {letter!r}")
    return compare(Counter(text.lower())[letter.lower()], let_relation, let_frequency)


@instruction("language:response_language", "language")
def _response_language(text: str, language: str) -> bool:
    found = _language(text)
    return found is None or found == language  # reference: undetectable text passes


@instruction("length_constraints:number_sentences", "num_sentences", "relation")
def _num_sentences(text: str, num_sentences: int, relation: str) -> bool:
    return compare(len(split_sentences(text)), relation, num_sentences)


@instruction("length_constraints:number_paragraphs", "num_paragraphs")
def _num_paragraphs(text: str, num_paragraphs: int) -> bool:
    paragraphs = re.split(r"\s?\*\*\*\s?", text)
    count = len(paragraphs)
    for i, p in enumerate(paragraphs):
        if not p.strip():
            if i not in (0, len(paragraphs) - 1):
                return False
            count -= 1
    return count == num_paragraphs


@instruction("length_constraints:number_words", "num_words", "relation")
def _num_words(text: str, num_words: int, relation: str) -> bool:
    return compare(count_words(text), relation, num_words)


@instruction("length_constraints:nth_paragraph_first_word", "num_paragraphs", "nth_paragraph", "first_word")
def _nth_paragraph_first_word(text: str, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    paragraphs = re.split(r"\n\n", text)
    count = sum(1 for p in paragraphs if p.strip())
    if nth_paragraph > count or nth_paragraph < 1:
        return False
    paragraph = paragraphs[nth_paragraph - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].strip().lstrip("'\"")
    first = ""
    for ch in word:
        if ch in ".,?!'\"":
            break
        first += ch.lower()
    return count == num_paragraphs and first == first_word.lower()


@instruction("detectable_content:number_placeholders", "num_placeholders")
def _placeholders(text: str, num_placeholders: int) -> bool:
    return len(re.findall(r"\[.*?\]", text)) >= num_placeholders


@instruction("detectable_content:postscript", "postscript_marker")
def _postscript(text: str, postscript_marker: str) -> bool:
    marker = postscript_marker.strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + re.escape(marker.lower()) + r".*$"
    return bool(re.findall(pattern, text.lower(), flags=re.M))


@instruction("detectable_format:number_bullet_lists", "num_bullets")
def _bullets(text: str, num_bullets: int) -> bool:
    stars = re.findall(r"^\s*\*[^\*].*$", text, flags=re.M)
    dashes = re.findall(r"^\s*-.*$", text, flags=re.M)
    return len(stars) + len(dashes) == num_bullets


@instruction("detectable_format:constrained_response")
def _constrained(text: str) -> bool:
    return sum(opt in text.strip() for opt in ("My answer is yes.", "My answer is no.", "My answer is maybe.")) == 1


@instruction("detectable_format:number_highlighted_sections", "num_highlights")
def _highlights(text: str, num_highlights: int) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h.removeprefix("**").removesuffix("**").strip()]
    return len(single) + len(double) >= num_highlights


@instruction("detectable_format:multiple_sections", "section_spliter", "num_sections")
def _sections(text: str, section_spliter: str, num_sections: int) -> bool:
    sections = re.split(r"\s?" + re.escape(section_spliter.strip()) + r"\s?\d+\s?", text)
    return len(sections) - 1 >= num_sections


@instruction("detectable_format:json_format")
def _json_format(text: str) -> bool:
    value = text.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        value = value.removeprefix(prefix)
    value = value.removesuffix("```").strip()
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


@instruction("detectable_format:title")
def _title(text: str) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", text))


@instruction("combination:two_responses")
def _two_responses(text: str) -> bool:
    parts = text.split("******")
    valid = []
    for i, part in enumerate(parts):
        if not part.strip():
            if i not in (0, len(parts) - 1):
                return False
        else:
            valid.append(part)
    return len(valid) == 2 and valid[0].strip() != valid[1].strip()


@instruction("combination:repeat_prompt", "prompt_to_repeat")
def _repeat_prompt(text: str, prompt_to_repeat: str) -> bool:
    return text.strip().lower().startswith(prompt_to_repeat.strip().lower())


@instruction("startend:end_checker", "end_phrase")
def _end_checker(text: str, end_phrase: str) -> bool:
    return text.strip().strip('"').lower().endswith(end_phrase.strip().lower())


@instruction("startend:quotation")
def _quotation(text: str) -> bool:
    value = text.strip()
    return len(value) > 1 and value[0] == '"' and value[-1] == '"'


@instruction("change_case:capital_word_frequency", "capital_frequency", "capital_relation")
def _capital_words(text: str, capital_frequency: int, capital_relation: str) -> bool:
    return compare(sum(1 for w in tokens(text) if w.isupper()), capital_relation, capital_frequency)


@instruction("change_case:english_capital")
def _english_capital(text: str) -> bool:
    return text.isupper() and _language(text) in (None, "en")


@instruction("change_case:english_lowercase")
def _english_lowercase(text: str) -> bool:
    return text.islower() and _language(text) in (None, "en")


@instruction("punctuation:no_comma")
def _no_comma(text: str) -> bool:
    return "," not in text


# ------------------------------------------------------------------ checking rows
def _number(value: Any, name: str) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str, list)):
        raise ValueError(f"argument {name!r} has unexpected type {type(value).__name__}")
    return value


def prepare(iid: str, kwargs: dict[str, Any]) -> tuple[Instruction, dict[str, Any]]:
    """The instruction ``iid`` and its validated arguments (integral floats become ints).

    Raises:
        ValueError: unknown id, missing or unknown argument, unknown relation, bad letter.
    """
    from validators.verifiers import ifbench  # noqa: F401  (registers the IFBench checks)

    if iid not in INSTRUCTIONS:
        raise ValueError(f"unknown instruction id {iid!r}")
    spec = INSTRUCTIONS[iid]
    if not isinstance(kwargs, dict):
        raise ValueError(f"{iid}: kwargs must be an object")
    missing = [k for k in spec.required if k not in kwargs]
    extra = [k for k in kwargs if k not in spec.required + spec.optional]
    if missing or extra:
        raise ValueError(f"{iid}: missing arguments {missing}, unknown arguments {extra}")
    args = {k: _number(v, k) for k, v in kwargs.items()}
    for key in ("relation", "let_relation", "capital_relation"):
        if key in args and args[key] not in RELATIONS:
            raise ValueError(f"{iid}: unknown relation {args[key]!r}; expected one of {RELATIONS}")
    if iid == "keywords:letter_frequency":
        _letter_frequency("", **args)
    return spec, args


def follows(iid: str, kwargs: dict[str, Any], text: str) -> bool:
    """Whether ``text`` (a final answer) follows instruction ``iid`` with ``kwargs``.

    Raises:
        ValueError: an invalid instruction spec (see :func:`prepare`).
    """
    spec, args = prepare(iid, kwargs)
    return bool(spec.check(text, **args))


def _row_specs(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    uid = row.get("uuid")
    ids = row.get("instruction_id_list")
    if not ids or not isinstance(ids, (list, tuple)):
        raise ValueError(f"row {uid!r}: instruction_id_list is missing or empty")
    kwargs = row_json(row, "kwargs")
    kwargs = [{}] * len(ids) if kwargs is None else kwargs
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise ValueError(f"row {uid!r}: kwargs must be a list of {len(ids)} objects")
    return [(iid, kw or {}) for iid, kw in zip(ids, kwargs)]


class InstructionFollowingVerifier(Verifier):
    """IFEval / IFBench constraints (see the module doc)."""

    sft_domain = "instruction_following"

    def check(self, row: dict[str, Any]) -> None:
        for i, (iid, kw) in enumerate(_row_specs(row)):
            try:
                prepare(iid, kw)
            except ValueError as exc:
                raise ValueError(f"row {row.get('uuid')!r}: instruction_id_list[{i}]: {exc}") from None

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        ids = list(row["instruction_id_list"])
        if not answer.strip():
            return fail("empty answer: no instruction is followed by saying nothing",
                        follow=[False] * len(ids), instruction_id_list=ids)
        results = [follows(iid, kw, answer) for iid, kw in _row_specs(row)]
        details = {"follow": results, "instruction_id_list": ids}
        n_ok = sum(results)
        if metadata(row).get("reward_mode") == "fraction":
            return Verdict(n_ok / len(results), n_ok == len(results), f"{n_ok}/{len(results)} followed", details)
        if n_ok == len(results):
            return Verdict(1.0, True, "all instructions followed", details)
        broken = [i for i, ok in zip(ids, results) if not ok]
        return fail(f"{n_ok}/{len(results)} followed; not: {', '.join(broken)}", **details)

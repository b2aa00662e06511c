"""Instruction-following verifier (``agent_ref`` ``instruction_following``) and the 25 IFEval checks.

A row lists ``instruction_id_list`` and, in ``kwargs`` (JSON), one argument object per instruction.
Every instruction is checked on the final answer (reasoning stripped; an unclosed ``<think>`` fails
all of them); a repeated id is evaluated once per occurrence. Reward: ``1.0`` only if every
instruction is followed (strict IFEval "prompt-level" accuracy, the default), or the fraction
followed when ``metadata.reward_mode`` is ``"fraction"`` (``passed`` still means all followed).

Checks follow the reference IFEval semantics (google-research ``instruction_following_eval``,
Zhou et al. 2023), IFBench's (allenai/IFBench, :mod:`validators.verifiers.ifbench`) and the IFTrain
constraints of NVIDIA's IF-RL rows (verifiable_instructions, :mod:`validators.verifiers.iftrain`),
reimplemented offline. Differences, by design:

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

Relevance gate (issue #33; :class:`RelevanceGate`, default ON). Constraints alone pay text that
ignores the request: on the real IF rows the constant reply "ok" was paid on 10.5% of rows and
constraint-only text (built from a row's instructions, unrelated to its question) on 97.5%. A paid
answer must also address the request, checked cheaply and deterministically: after removing every
run of ``copy_run`` (5) or more words copied from the request (an echo is not an answer), it needs
``min_words`` (5) words and must share ``min(min_shared, max(1, round(min_share * n)))`` = min(3,
half of the request's n content stems) distinct content stems with the request (``metadata.question``,
else the last user turn; stop words and chat words removed, a crude suffix-strip + 5-character stem,
CJK as character bigrams). A gated-out answer gets 0 and the reason ``"relevance gate: ..."``; rows
without a request, or whose request has no content word, are not gated, nor an answer that follows
an instruction fixing the whole answer (a copy of part of the request, ``Instruction.fixed``: IFBench's
``repeat:*``, the IFTrain copy checks of :mod:`validators.verifiers.iftrain`; the gate would zero those
exact copies; an answer that does not follow it is gated, so that ``"fraction"`` rewards stay closed);
an imposed response language keeps the length floor only. Off:
``InstructionFollowingVerifier(RelevanceGate(enabled=False))`` or per row ``metadata.relevance_gate:
false`` (or an object of overrides).

Thresholds were chosen on 100 train rows (``python -m benchmarks.if_gate --grid``; the grid point
maximising "degenerate stopped minus paid honest answers lost": min_shared 1: 39% degenerate still
paid / 4 of 24 honest lost; 2: 15% / 10 of 24; 3: 8% / 10 of 24). Report rows (64 validation + 136
held-out train; 190 with a greedy answer of SmolLM2-135M-Instruct, 256 tokens), rate [95% Wilson]::

    paid (reward > 0)                      ungated                     gated (default)
    "ok"                                   21/200 10.5% [7.0, 15.5]    0/200 0.0% [0.0, 1.9]
    constraint-only, best of 3 variants    195/200 97.5% [94.3, 98.9]  10/200 5.0% [2.7, 9.0]
      off-topic / boilerplate / echo       96.5 / 97.0 / 92.0%         0.5 / 4.5 / 0.0%
    keyword salad (question words)         191/200 95.5%               183/200 91.5% [86.8, 94.6]
    honest greedy answers paid             41/190 21.6%                19/190
    honest paid answers zeroed by the gate                             22/41 53.7% [38.7, 67.9]

Of those 22, 16 are refused at min_shared=1 too and are non-answers ("I'm ready to help. What's your
query?", "* This is point 1." x6, "S", placeholder or token loops, an unrelated story); about 5 are
weak but on-topic attempts (shared 1-2 stems): that is the price of the default. ``min_shared=1``
on the same report rows: constraint-only 38.0% [31.6, 44.9] still paid, honest lost 16/41 (39.0%).
Not stopped: keyword salad (off-topic sentences carrying the question's words) passes any lexical
gate; stopping it needs a judge or a preference signal combined with the verifiable reward
(IF-RLVR), not this gate.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from common.answers import row_json
from validators.verifiers.confusables import latin_fold
from validators.verifiers.registry import (
    Verdict,
    Verifier,
    fail,
    metadata,
)

RELATIONS = ("less than", "at least")


@dataclass(frozen=True)
class Instruction:
    """One checkable instruction: ``check(text, **kwargs) -> bool`` and its argument names.

    Attributes:
        validate: ``validate(**kwargs)`` raising ValueError on arguments the check cannot grade (run
            by :func:`prepare`, so ``check_row`` rejects the row), or None.
        fixed: the check accepts only the answer the row spells out (a copy of part of the request,
            one word changed at most): the relevance gate, which discounts what the answer copies from
            the request, does not apply to an answer that follows it.
    """

    check: Callable[..., bool]
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    validate: Callable[..., None] | None = None
    fixed: bool = False


INSTRUCTIONS: dict[str, Instruction] = {}


def instruction(iid: str, *required: str, optional: tuple[str, ...] = (),
                validate: Callable[..., None] | None = None, fixed: bool = False) -> Callable:
    """Decorator registering a check function under instruction id ``iid`` (see :class:`Instruction`)."""
    def deco(fn: Callable[..., bool]) -> Callable[..., bool]:
        INSTRUCTIONS[iid] = Instruction(fn, required, optional, validate, fixed)
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
    # read through look-alikes (a Cyrillic "о", fullwidth letters, a zero-width joiner inside the word)
    folded = latin_fold(text)
    return not any(re.search(r"\b" + re.escape(latin_fold(w)) + r"\b", folded) for w in forbidden_words)


def one_letter(letter: Any, **_: Any) -> None:
    """Validator of the ``letter`` argument (:class:`Instruction` ``validate``).

    Raises:
        ValueError: ``letter`` is not one ASCII letter.
    """
    if not (isinstance(letter, str) and len(letter) == 1 and letter.isascii() and letter.isalpha()):
        raise ValueError(f"letter must be one ASCII letter, got {letter!r}")


@instruction("keywords:letter_frequency", "letter", "let_frequency", "let_relation", validate=one_letter)
def _letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    return compare(Counter(text.lower())[letter.lower()], let_relation, let_frequency)


@instruction("language:response_language", "language")
def _response_language(text: str, language: str) -> bool:
    # the reference passes text whose language is undetectable; here that pays a reply with no words
    # (digits, symbols) under "answer in German", so it fails
    return _language(text) == language


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


COMMAS = frozenset(",\uff0c\ufe50\u3001\u060c\u201a\u2e34\u2e41\ua4fe")  # , ， ﹐ 、 ، ‚ ⸴ ⹁ ꓾


@instruction("punctuation:no_comma")
def _no_comma(text: str) -> bool:
    return not COMMAS.intersection(text)  # the comma of every script, fullwidth and small forms


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
        ValueError: unknown id, missing or unknown argument, unknown relation, or arguments the
            instruction's ``validate`` refuses (a bad letter, a count that is not positive...).
    """
    from validators.verifiers import ifbench, iftrain  # noqa: F401  (register the IFBench and IFTrain checks)

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
    if spec.validate is not None:
        spec.validate(**args)
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


# ------------------------------------------------------------------ relevance gate (issue #33)
#: Words that carry no topic, beside :data:`validators.verifiers.ifbench.STOP_WORDS`: chat
#: politeness and request verbs ("can you please help me write..."), so that an answer cannot share
#: them with any request.
CHAT_WORDS = frozenset(
    "please thanks thank hello hey can could would will shall may might must need want like know "
    "help tell give show make write get let use using also just really much many one two three "
    "something anything thing things way ways sure yes okay answer question response text following "
    "say said see look think new good well make made take".split())
_WORD = re.compile(r"[^\W_]+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_SUFFIXES = ("ations", "ation", "ings", "ing", "ies", "ied", "ed", "es", "er", "ly", "s", "e")


def words(text: str) -> list[str]:
    """Lowercase word runs of ``text`` (letters and digits of any script; ``_``, ``-`` and
    punctuation split); a run of CJK/kana/hangul characters gives its character bigrams (those
    scripts put no space between words)."""
    out = []
    for w in _WORD.findall(text.lower()):
        if _CJK.search(w) and len(w) > 1:
            out += [w[i:i + 2] for i in range(len(w) - 1)]
        else:
            out.append(w)
    return out


def stem(word: str, size: int = 5) -> str:
    """Crude stem: one common English suffix dropped (when 3 letters remain), then the first ``size``
    characters ("caching"/"cache" -> "cach", "layers"/"layer" -> "layer")."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[:-len(suffix)]
            break
    return word[:size]


def content_stems(text: str, size: int = 5) -> set[str]:
    """Distinct content stems of ``text``: :func:`words` of at least 3 characters (CJK bigrams
    kept), stop words (:data:`~validators.verifiers.ifbench.STOP_WORDS`) and :data:`CHAT_WORDS`
    removed, each cut by :func:`stem`."""
    from validators.verifiers.ifbench import STOP_WORDS

    return {stem(w, size) for w in words(text)
            if (len(w) >= 3 or _CJK.search(w)) and w not in STOP_WORDS and w not in CHAT_WORDS}


def strip_copies(answer: str, request: str, run: int) -> str:
    """``answer`` (as its :func:`words`) without every run of ``run`` or more consecutive words
    copied from ``request`` (a request shorter than ``run`` words: copied whole, 2 words at least): an
    echo of the prompt neither addresses nor lengthens an answer (a required repeat,
    ``combination:repeat_prompt``, is cut the same way). ``run`` 0: nothing cut."""
    ans = words(answer)
    if run <= 0:
        return " ".join(ans)
    req = words(request)
    run = max(2, min(run, len(req)))  # a short request copied whole is an echo too
    grams = {tuple(req[i:i + run]) for i in range(len(req) - run + 1)}
    copied = [False] * len(ans)
    for i in range(len(ans) - run + 1):
        if tuple(ans[i:i + run]) in grams:
            copied[i:i + run] = [True] * run
    return " ".join(w for w, c in zip(ans, copied) if not c)


@dataclass(frozen=True)
class RelevanceGate:
    """A minimum response that addresses the request: the gate that stops a constant reply ("ok")
    or constraint-only text unrelated to the request from being paid (module doc, issue #33).

    An answer passes when, after :func:`strip_copies` removed what it copied from the request:

    * it has at least ``min_words`` words (:func:`words`; lowered to half the cap when the row asks
      for fewer words than that, ``length_constraints:number_words`` "less than"), and
    * it shares at least ``min_shared`` distinct :func:`content_stems` with the request (the
      question, ``metadata.question``, else the last user turn), or at least ``min_share`` of the
      request's stems when the request has few.

    A row whose request has no content word, or no request at all, is not gated (nothing to check
    relevance against), nor an answer that follows a ``fixed`` instruction (the copy of the request the
    row asks for, :class:`Instruction`); a row that imposes the answer's language
    (``language:response_language``) keeps the length floor only. Attributes are the thresholds chosen
    on train rows (module doc); ``enabled`` False restores the ungated reward. A row overrides per key
    with ``metadata.relevance_gate`` (``false``, or an object such as ``{"min_shared": 1}``).
    """

    enabled: bool = True
    min_words: int = 5
    min_shared: int = 3
    min_share: float = 0.5
    copy_run: int = 5
    stem: int = 5

    def for_row(self, row: dict[str, Any]) -> RelevanceGate:
        """This gate with the row's ``metadata.relevance_gate`` overrides applied.

        Raises:
            ValueError: an override that is neither a bool nor an object of known keys.
        """
        override = metadata(row).get("relevance_gate")
        if override is None:
            return self
        if isinstance(override, bool):
            return replace(self, enabled=override)
        names = {f.name for f in fields(self)}
        if not isinstance(override, dict) or set(override) - names:
            raise ValueError(f"row {row.get('uuid')!r}: metadata.relevance_gate must be a bool or an object "
                             f"with keys among {sorted(names)}, got {override!r}")
        return replace(self, **override)

    def check(self, answer: str, row: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        """``(passes, reason, details)`` for ``answer`` (a final answer) on ``row``."""
        request = request_text(row)
        if not self.enabled or not request:
            return True, "gate off" if not self.enabled else "no request: not gated", {}
        if any(prepare(iid, kw)[0].fixed and follows(iid, kw, answer) for iid, kw in _row_specs(row)):
            return True, "the answer is the copy the row asks for: not gated", {}
        rest = strip_copies(answer, request, self.copy_run)
        req_stems = content_stems(request, self.stem)
        if not req_stems:
            return True, "request has no content word: not gated", {}
        shared = sorted(req_stems & content_stems(rest, self.stem))
        n_words = len(rest.split())
        floor = self.min_words
        for iid, kw in _row_specs(row):
            if iid == "length_constraints:number_words" and kw.get("relation") == "less than":
                floor = min(floor, int(kw["num_words"]) // 2)
        need = min(self.min_shared, max(1, round(self.min_share * len(req_stems))))
        if any(iid == "language:response_language" for iid, _ in _row_specs(row)):
            need = 0  # the answer's language is imposed: no shared words to expect from a translation
        details = {"words": n_words, "min_words": floor, "shared": shared, "need_shared": need}
        if n_words < floor:
            return False, f"relevance gate: {n_words} words of its own < {floor}", details
        if len(shared) < need:
            return False, (f"relevance gate: shares {len(shared)} content words with the request < {need} "
                           "(does not address it)"), details
        return True, "addresses the request", details


def request_text(row: dict[str, Any]) -> str:
    """The request an answer must address: ``metadata.question`` (the prompt without its appended
    instructions), else the last user turn of ``responses_create_params.input``; ``""`` if neither."""
    question = metadata(row).get("question")
    if isinstance(question, str) and question.strip():
        return question
    params = row.get("responses_create_params") or {}
    if isinstance(params, str):
        params = json.loads(params)
    turns = [m for m in (params.get("input") or []) if isinstance(m, dict) and m.get("role") == "user"]
    content = turns[-1].get("content") if turns else ""
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


class InstructionFollowingVerifier(Verifier):
    """IFEval / IFBench constraints (see the module doc)."""

    sft_domain = "instruction_following"

    def __init__(self, gate: RelevanceGate | None = None):
        #: the relevance gate (default ON, :class:`RelevanceGate`); ``RelevanceGate(enabled=False)``
        #: grades the constraints alone.
        self.gate = RelevanceGate() if gate is None else gate

    def check(self, row: dict[str, Any]) -> None:
        for i, (iid, kw) in enumerate(_row_specs(row)):
            try:
                prepare(iid, kw)
            except ValueError as exc:
                raise ValueError(f"row {row.get('uuid')!r}: instruction_id_list[{i}]: {exc}") from None
        self.gate.for_row(row)

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        ids = list(row["instruction_id_list"])
        if not answer.strip():
            return fail("empty answer: no instruction is followed by saying nothing",
                        follow=[False] * len(ids), instruction_id_list=ids)
        results = [follows(iid, kw, answer) for iid, kw in _row_specs(row)]
        details = {"follow": results, "instruction_id_list": ids}
        n_ok = sum(results)
        passes, why, gate = self.gate.for_row(row).check(answer, row)
        details["gate"] = {"passed": passes, "reason": why, **gate}
        if not passes:
            return fail(f"{why}; {n_ok}/{len(results)} instructions followed", **details)
        if metadata(row).get("reward_mode") == "fraction":
            return Verdict(n_ok / len(results), n_ok == len(results), f"{n_ok}/{len(results)} followed", details)
        if n_ok == len(results):
            return Verdict(1.0, True, "all instructions followed", details)
        broken = [i for i, ok in zip(ids, results) if not ok]
        return fail(f"{n_ok}/{len(results)} followed; not: {', '.join(broken)}", **details)

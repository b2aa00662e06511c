"""The IFTrain constraints of NVIDIA's IF-RL rows, registered into
:data:`validators.verifiers.ifeval.INSTRUCTIONS` (the 29 "New Constraints" of verifiable_instructions'
``INSTRUCTION_DICT``).

Sources: ``verifiable_instructions`` (github.com/abukharin-nv/verifiable-instructions,
``instructions.py`` and ``instructions_registry.py``), the package with which NeMo-Gym's
``resources_servers/instruction_following`` grades ``nvidia/Nemotron-RL-instruction_following`` (the
IF-RL config of ``nvidia/Nemotron-Cascade-2-RL-data``); its constraints are the training constraints
("IFTrain", open-instruct's RLVR instruction-following data) of the IFBench paper (Pyatkin et al.
2025, "Generalizing Verifiable Instruction Following").

Arguments are the keyword arguments of each reference ``build_description``. Where the reference draws
a random value for a missing or falsy argument, the argument is required here and must be usable (a
positive count, a non-blank word or text): :func:`~validators.verifiers.ifeval.prepare` raises and
``check_row`` rejects the row (ifeval's rule: never a random default). An argument the reference's
``build_description`` does not take is refused, as for every id (the reference raises and NeMo-Gym
counts the instruction failed); ``keywords:exclude_word_harder`` takes ``instruction`` (the text the
reference draws a keyword from when none is given) and ignores it. A word given as a list stands for its
first element where the reference reads it so (``first_word:first_word_sent``,
``last_word:last_word_sent``, ``keywords:keyword_specific_position``); elsewhere a list is refused.

Semantics follow the reference ``check_following`` with the offline substitutions of
:mod:`validators.verifiers.ifeval` (:func:`~validators.verifiers.ifeval.split_sentences` for
``split_into_sentences``, :func:`~validators.verifiers.ifeval.tokens` for ``nltk.word_tokenize``) and
keywords matched literally, not as regexes. Deviations, each closing a hole (a reward for not doing the
task) or accepting an answer the instruction asks for that the reference refuses:

* ``copy:repeat_phrase``: every repetition must differ from the phrase in exactly one word (the
  reference asks it of the last one only: verbatim copies before it pass); a phrase needs 3 words (a
  centre word to replace).
* ``new:copy_span_idx``: the instruction says the span runs from ``n_start`` to ``n_end`` *included*;
  the reference compares with ``prompt[n_start:n_end]`` (``n_end`` excluded): both spans are accepted.
  ``n_start`` 0 is the first character (the reference, reading 0 as missing, draws a random start).
* ``detectable_format:sentence_hyphens``: at least two sentences, and the hyphen-separated parts must
  be exactly the sentences (the reference zips the two lists: one sentence and no hyphen passes, parts
  after the last sentence are never looked at).
* ``keywords:exclude_word_harder``: the reference only sees the keyword between two spaces, case
  sensitive (``"Keyword."``, a line start, a capital letter all slip through); here the keyword must not
  appear as a whole word anywhere, in any case, read through look-alike letters (as
  ``keywords:forbidden_words``).
* ``count:counting_composition``: a sentence's words are its word tokens (the reference counts nltk
  tokens, punctuation included: "I like tea." is 4 words there, so correct answers fail and answers one
  word short pass); the divider may be written ``* * *``, as the instruction writes it, or ``***``, as
  the reference splits; a divider before the first or after the last paragraph is ignored (the
  reference fails it).
* ``count:count_unique``: words only, compared case-insensitively (the reference counts punctuation
  tokens, so two commas are a repeated word, and takes "The" and "the" for two words); at least one word.
* ``keywords:palindrome``: the reference takes any whitespace token equal to its reverse ("a", "I",
  "-"), so nearly every answer passes. Here: a word of at least :data:`MIN_WORD` letters and digits
  (with a letter) that reads the same backwards, case and punctuation ignored, or a run of up to
  :data:`MAX_RUN` consecutive words whose letters do, at least :data:`MIN_PHRASE` long ("A man, a plan,
  a canal: Panama"). A palindromic word used in passing ("did", "level") still counts: it is one.
* ``keywords:keyword_specific_position``: sentences (``n``) and words (``m``) count from 1 as in the
  reference, but words are word tokens (the reference counts punctuation tokens as words) and the
  comparison ignores case (the reference's exact match fails a keyword asked as a sentence's first
  word and written with its capital).
* ``keywords:start_end``: the first and last tokens must be words (the reference takes any token: a
  reply that opens and closes with ``-`` or ``...`` passes).
* ``punctuation:punctuation_dot`` / ``punctuation:punctuation_exclamation``: the look-alikes of ``.`` and
  ``!`` count as the mark (:data:`DOTS`, :data:`EXCLAMATIONS`; as ``punctuation:no_comma`` reads every
  comma), not only the ASCII character.
* ``first_word:first_word_sent`` with a list: its first element (the reference means to, but a typo
  leaves the word unset and the check always fails).
* The copy checks (``copy:copy``, ``copy:copying_simple``, ``copy:copying_multiple``,
  ``new:copy_span_idx``) fix the whole answer: they are ``fixed`` instructions, and an answer that
  follows one is not gated (the relevance gate discounts text copied from the request, so it would
  zero every correct copy). The verifier's other rules apply to every id: an empty final answer
  follows nothing, and every other answer must pass the relevance gate (module doc of
  :mod:`validators.verifiers.ifeval`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from validators.verifiers.confusables import latin_fold
from validators.verifiers.ifeval import (
    INSTRUCTIONS,
    compare,
    instruction,
    split_sentences,
    tokens,
)

#: Shortest palindromic word (letters and digits, at least one letter) ``keywords:palindrome`` accepts.
MIN_WORD = 3
#: Shortest palindromic phrase (its letters and digits) ``keywords:palindrome`` accepts, and the most
#: words it may span.
MIN_PHRASE, MAX_RUN = 7, 20
#: What ``punctuation:punctuation_dot`` forbids: the full stop and its look-alikes.
DOTS = frozenset(".\uff0e\ufe52\u3002\uff61\u2024\u2025\u2026")  # . ． ﹒ 。 ｡ ․ ‥ …
#: What ``punctuation:punctuation_exclamation`` forbids: the exclamation mark and its look-alikes.
EXCLAMATIONS = frozenset("!\uff01\ufe57\u203c\u2049\u2757\u2755\u01c3\u00a1\u203d")  # ! ！ ﹗ ‼ ⁉ ❗ ❕ ǃ ¡ ‽


def _first(value: Any) -> Any:
    """A word argument: a list stands for its first element (as the reference reads it)."""
    return value[0] if isinstance(value, list) and value else value


def needs(*texts: str, listed: bool = False, **least: int) -> Callable[..., None]:
    """A validator (:class:`~validators.verifiers.ifeval.Instruction` ``validate``): each argument named
    in ``texts`` a non-blank string (``listed``: or a list whose first element is one), each named in
    ``least`` an integer at least that value (where the reference would draw a random one instead)."""
    def validate(**kwargs: Any) -> None:
        for name in texts:
            value = _first(kwargs[name]) if listed else kwargs[name]
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-blank string, got {kwargs[name]!r}")
        for name, low in least.items():
            value = kwargs[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return validate


def _words(text: str) -> list[str]:
    """Word tokens of ``text`` (:func:`~validators.verifiers.ifeval.tokens` with a letter or digit)."""
    return [t for t in tokens(text) if any(c.isalnum() for c in t)]


def _occurrences(text: str, keyword: str) -> int:
    """Case-insensitive occurrences of ``keyword`` (stripped, literal) anywhere in ``text``."""
    return len(re.findall(re.escape(keyword.strip()), text, re.I))


def _blocks(parts: list[str]) -> list[str] | None:
    """The non-blank ``parts`` of a split text, or None when a blank one lies between two others
    (a blank first or last part, around a leading or trailing divider, is dropped)."""
    inner = parts[1:-1]
    if any(not p.strip() for p in inner):
        return None
    return [p for p in parts if p.strip()]


def _same(text: str, expected: str) -> bool:
    """``text`` is ``expected``, surrounding whitespace and case aside."""
    return text.strip().lower() == expected.strip().lower()


# ------------------------------------------------------------------ copy:*, new:copy_span_idx
def _phrase(phrase: Any, small_n: Any) -> None:
    needs("phrase", small_n=1)(phrase=phrase, small_n=small_n)
    if len(phrase.split()) < 3:
        raise ValueError(f"phrase needs 3 words (a centre word to replace), got {phrase!r}")


@instruction("copy:repeat_phrase", "phrase", "small_n", validate=_phrase)
def _repeat_phrase(text: str, phrase: str, small_n: int) -> bool:
    ref = phrase.split()
    tail = " " + ref[-1]
    # the reference's findall of "<first> .*? <last>"; a match never spans lines, and cutting each line
    # after its last " <last>" keeps the search linear (a line of many "<first>" and no "<last>" is not)
    lines = (line[:line.rfind(tail) + len(tail)] for line in text.split("\n"))
    found = [m for line in lines for m in re.findall(re.escape(ref[0]) + " .*? " + re.escape(ref[-1]), line)]
    return len(found) == small_n and all(
        len(f.split()) == len(ref) and sum(a != b for a, b in zip(f.split(), ref)) == 1 for f in found)


@instruction("copy:copy", "prompt_to_repeat", validate=needs("prompt_to_repeat"), fixed=True)
def _copy(text: str, prompt_to_repeat: str) -> bool:
    return _same(text, prompt_to_repeat)


instruction("copy:copying_simple", "prompt_to_repeat", validate=needs("prompt_to_repeat"), fixed=True)(_copy)


@instruction("copy:copying_multiple", "prompt_to_repeat", "N", validate=needs("prompt_to_repeat", N=1), fixed=True)
def _copying_multiple(text: str, prompt_to_repeat: str, N: int) -> bool:
    parts = text.split("******")
    return len(parts) == N and all(_same(p, prompt_to_repeat) for p in parts)


def _span(prompt_to_repeat: Any, n_start: Any, n_end: Any) -> None:
    needs("prompt_to_repeat", n_start=0, n_end=1)(prompt_to_repeat=prompt_to_repeat, n_start=n_start, n_end=n_end)
    if not n_start < n_end <= len(prompt_to_repeat) or not prompt_to_repeat[n_start:n_end].strip():
        raise ValueError(f"span [{n_start}, {n_end}] is empty or outside the {len(prompt_to_repeat)}-character prompt")


@instruction("new:copy_span_idx", "prompt_to_repeat", "n_start", "n_end", validate=_span, fixed=True)
def _copy_span_idx(text: str, prompt_to_repeat: str, n_start: int, n_end: int) -> bool:
    return any(_same(text, prompt_to_repeat[n_start:end]) for end in (n_end, n_end + 1))


# ------------------------------------------------------------------ keywords:*
@instruction("keywords:word_once", "keyword", validate=needs("keyword"))
def _word_once(text: str, keyword: str) -> bool:
    return _occurrences(text, keyword) == 1


@instruction("keywords:word_count_different_numbers", "keyword", "frequency", "relation",
             validate=needs("keyword", frequency=0))
def _word_count(text: str, keyword: str, frequency: int, relation: str) -> bool:
    return compare(_occurrences(text, keyword), relation, frequency)


@instruction("keywords:exclude_word_harder", "keyword", optional=("instruction",), validate=needs("keyword"))
def _exclude_word(text: str, keyword: str, instruction: str = "") -> bool:
    # ``instruction`` only feeds the reference's random choice of a keyword when none is given
    word = re.escape(latin_fold(keyword.strip()))
    return not re.search(r"(?<!\w)" + word + r"(?!\w)", latin_fold(text))


@instruction("keywords:no_adjacent_consecutive")
def _no_adjacent_consecutive(text: str) -> bool:
    initials = [w[0].lower() for w in text.split()]
    return all(len(a) == 1 and len(b) == 1 and ord(b) - ord(a) != 1 for a, b in zip(initials, initials[1:]))


@instruction("keywords:palindrome")
def _palindrome(text: str) -> bool:
    words = [w for w in ("".join(c for c in t if c.isalnum()).casefold() for t in tokens(text)) if w]
    for i, word in enumerate(words):
        if len(word) >= MIN_WORD and word == word[::-1] and any(c.isalpha() for c in word):
            return True
        run = word
        for nxt in words[i + 1:i + MAX_RUN]:
            run += nxt
            if len(run) >= MIN_PHRASE and run == run[::-1] and any(c.isalpha() for c in run):
                return True
    return False


@instruction("keywords:keyword_specific_position", "keyword", "n", "m", validate=needs("keyword", listed=True, n=1, m=1))
def _keyword_position(text: str, keyword: str | list[str], n: int, m: int) -> bool:
    sentences = split_sentences(text)
    if len(sentences) < n:
        return False
    words = _words(sentences[n - 1])
    return len(words) >= m and words[m - 1].lower() == _first(keyword).strip().lower()


@instruction("keywords:start_end")
def _start_end(text: str) -> bool:
    toks = tokens(text)
    return (len(toks) >= 2 and all(any(c.isalnum() for c in t) for t in (toks[0], toks[-1]))
            and toks[0].lower() == toks[-1].lower())


# ------------------------------------------------------------------ detectable_format:*
@instruction("detectable_format:sentence_hyphens")
def _sentence_hyphens(text: str) -> bool:
    parts = text.split("-")
    sentences = split_sentences(text.replace("-", " "))
    return len(parts) >= 2 and len(parts) == len(sentences) and all(
        p == p.strip() and " ".join(p.split()) == s for p, s in zip(parts, sentences))


@instruction("detectable_format:square_brackets")
def _square_brackets(text: str) -> bool:
    return all(w.startswith("[") and w.endswith("]") for w in text.split())


@instruction("detectable_format:bigram_wrapping")
def _bigram_wrapping(text: str) -> bool:
    words = text.split()
    return all(words[i].startswith("<<") and words[i + 1].endswith(">>") for i in range(0, len(words) - 1, 2))


# ------------------------------------------------------------------ paragraphs:*
@instruction("paragraphs:paragraphs")
def _paragraphs(text: str) -> bool:
    return INSTRUCTIONS["length_constraints:number_paragraphs"].check(text, num_paragraphs=2)


@instruction("paragraphs:paragraphs2")
def _paragraphs2(text: str) -> bool:
    blocks = _blocks(text.split("\n\n"))
    return blocks is not None and len(blocks) == 2


# ------------------------------------------------------------------ first_word:*, last_word:*
def _bare(word: str) -> str:
    """``word`` without punctuation (the reference's ``[^\\w\\s]`` removal), lowercased."""
    return re.sub(r"[^\w\s]", "", word).lower()


@instruction("first_word:first_word_sent", "first_word", validate=needs("first_word", listed=True))
def _first_word_sent(text: str, first_word: str | list[str]) -> bool:
    word = _first(first_word).strip().lower()
    return all(s.split()[0].lower() == word for s in split_sentences(text))


@instruction("first_word:first_word_answer", "first_word", validate=needs("first_word"))
def _first_word_answer(text: str, first_word: str) -> bool:
    words = text.split()
    return bool(words) and words[0].lower() == first_word.strip().lower()


@instruction("last_word:last_word_sent", "last_word", validate=needs("last_word", listed=True))
def _last_word_sent(text: str, last_word: str | list[str]) -> bool:
    word = _first(last_word).strip().lower()
    return all(_bare(s.split()[-1]) == word for s in split_sentences(text))


@instruction("last_word:last_word_answer", "last_word", validate=needs("last_word"))
def _last_word_answer(text: str, last_word: str) -> bool:
    words = text.split()
    return bool(words) and _bare(words[-1]) == last_word.strip().lower()


# ------------------------------------------------------------------ punctuation:*
@instruction("punctuation:punctuation_dot")
def _no_dot(text: str) -> bool:
    return not DOTS.intersection(text)


@instruction("punctuation:punctuation_exclamation")
def _no_exclamation(text: str) -> bool:
    return not EXCLAMATIONS.intersection(text)


# ------------------------------------------------------------------ count:*, letters:*
@instruction("count:lowercase_counting", "N", validate=needs(N=1))
def _lowercase_counting(text: str, N: int) -> bool:
    return len(re.findall(r"\b[a-z]+\b", text)) <= N


@instruction("letters:letter_counting", "N", "relation", validate=needs(N=1))
def _letter_counting(text: str, N: int, relation: str) -> bool:
    return compare(len(re.findall(r"[a-zA-Z]", text)), relation, N)


INSTRUCTIONS["letters:letter_counting2"] = INSTRUCTIONS["keywords:letter_frequency"]  # the same reference class


@instruction("count:counting_composition", "n_sent", "n_words", validate=needs(n_sent=1, n_words=1))
def _counting_composition(text: str, n_sent: int, n_words: int) -> bool:
    paragraphs = _blocks(re.split(r"\s?\*\s?\*\s?\*\s?", text))
    if paragraphs is None or len(paragraphs) != 3:
        return False
    for paragraph in paragraphs:
        sentences = split_sentences(paragraph)
        if len(sentences) != n_sent or any(len(_words(s)) != n_words for s in sentences):
            return False
    return True


@instruction("count:count_unique")
def _count_unique(text: str) -> bool:
    words = [w.lower() for w in _words(text)]
    return bool(words) and len(words) == len(set(words))


@instruction("count:count_increment_word", "keyword1", "keyword2", validate=needs("keyword1", "keyword2"))
def _count_increment_word(text: str, keyword1: str, keyword2: str) -> bool:
    return _occurrences(text, keyword1) == 1 and _occurrences(text, keyword2) == 2

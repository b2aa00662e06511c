"""The IFBench instruction checks (Pyatkin et al. 2025, allenai/IFBench), registered into
:data:`validators.verifiers.ifeval.INSTRUCTIONS` (all 57 ids of IFBench_test).

Semantics follow the reference checks, reimplemented offline with the substitutions documented in
:mod:`validators.verifiers.ifeval` (regex sentence splitter and tokenizer for nltk). Further
stand-ins, by necessity:

* ``count:stop_words`` / ``ratio:stop_words``: the English stop-word list below (nltk's
  ``stopwords.words("english")`` content is not available offline);
* ``words:start_verb``: nltk's POS tagger has no data here; the first token counts as a verb when
  it is in :data:`COMMON_VERBS` (base, -s, -ed and -ing forms) or ends in ``-ing``/``-ed``. This is
  an approximation of ``pos_tag(...)[0][1].startswith("VB")`` and is reported as such;
* syllables (``words:odd_even_syllables``) come from ``syllapy``, emoji tests from ``emoji``, as in
  the reference.

The ``repeat:*`` checks fix the whole answer (a copy of the request, one word changed at most): they are
``fixed`` instructions, which the relevance gate of :mod:`validators.verifiers.ifeval` (that discounts
text copied from the request, and so zeroed every correct answer) does not apply to.
"""

from __future__ import annotations

import csv
import io
import re
import string
import unicodedata
from collections import Counter

from validators.verifiers.ifeval import (
    count_words,
    instruction,
    split_sentences,
    tokens,
)

PUNCT = string.punctuation
PERSON_NAMES = ("Emma Liam Sophia Jackson Olivia Noah Ava Lucas Isabella Mason Mia Ethan Charlotte Alexander "
                "Amelia Benjamin Harper Leo Zoe Daniel Chloe Samuel Lily Matthew Grace Owen Abigail Gabriel Ella "
                "Jacob Scarlett Nathan Victoria Elijah Layla Nicholas Audrey David Hannah Christopher Penelope "
                "Thomas Nora Andrew Aria Joseph Claire Ryan Stella Jonathan").split()
PRONOUNS = frozenset((
    "i me we us you he him she her it they them my mine our ours your yours his hers its their theirs myself "
    "ourselves yourself yourselves himself herself itself themselves this that these those who whom whose which "
    "what whoever whomever whatever whichever anybody anyone anything everybody everyone everything nobody "
    "nothing somebody someone something each either neither both all some any none").split())
STOP_WORDS = frozenset((
    "i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her hers "
    "herself it its itself they them their theirs themselves what which who whom this that these those am is "
    "are was were be been being have has had having do does did doing a an the and but if or because as until "
    "while of at by for with about against between into through during before after above below to from up "
    "down in out on off over under again further then once here there when where why how all any both each few "
    "more most other some such no nor not only own same so than too very s t can will just don should now d ll "
    "m o re ve y ain aren couldn didn doesn hadn hasn haven isn ma mightn mustn needn shan shouldn wasn weren "
    "won wouldn").split())
COMMON_VERBS = frozenset((
    "be have do say go get make know think take see come want look use find give tell work call try ask need "
    "feel become leave put mean keep let begin seem help talk turn start show hear play run move like live "
    "believe hold bring happen write provide sit stand lose pay meet include continue set learn change lead "
    "understand watch follow stop create speak read allow add spend grow open walk win offer remember love "
    "consider appear buy wait serve die send expect build stay fall cut reach kill remain suggest raise pass "
    "sell require report decide pull explain describe imagine list discuss compare analyze analyse define "
    "identify outline summarize summarise calculate determine evaluate examine explore consider design develop "
    "implement prove solve check ensure note recall state answer choose select avoid apply assume enjoy "
    "join keep picture plan prepare remove replace review share study teach travel visit").split())
EUROPEAN_CAPITALS = ("Reykjavik Helsinki Oslo Tallinn Stockholm Riga Moscow Copenhagen Vilnius Minsk Dublin "
                     "Berlin Amsterdam Warsaw London Brussels Prague Luxembourg Paris Vienna Bratislava Budapest "
                     "Vaduz Chisinau Bern Ljubljana Zagreb").split()
PRIMES = frozenset({2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97})


def _nopunct(text: str) -> str:
    return text.translate(str.maketrans("", "", PUNCT))


def _split_words(text: str) -> list[str]:
    return _nopunct(text.lower()).split()


def _alnum_tokens(text: str) -> list[str]:
    return [t for t in tokens(text) if any(c.isalnum() for c in t)]


def _ascii(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def _is_verb(word: str) -> bool:
    w = word.lower()
    stems = {w, w[:-1], w[:-2], w[:-3], w[:-3] + "e", w[:-2] + "e", w[:-1] if w.endswith("s") else w}
    return bool(stems & COMMON_VERBS) or (len(w) > 4 and w.endswith(("ing", "ed")))


# ------------------------------------------------------------------ count:*
@instruction("count:word_count_range", "min_words", "max_words")
def _word_count_range(text, min_words, max_words):
    return min_words <= count_words(text) <= max_words


@instruction("count:unique_word_count", "N")
def _unique_words(text, N):
    return len({w.strip(PUNCT + " ") for w in text.lower().split()}) >= N


@instruction("count:conjunctions", "small_n")
def _conjunctions(text, small_n):
    conj = {w for w in text.split() if w.strip(PUNCT + " ").lower() in ("and", "but", "for", "nor", "or", "so", "yet")}
    return len(conj) >= small_n


@instruction("count:person_names", "N")
def _person_names(text, N):
    return sum(1 for n in PERSON_NAMES if re.search(r"\b" + n + r"\b", text)) >= N


@instruction("count:numbers", "N")
def _numbers(text, N):
    return len(re.findall(r"\d+", _nopunct(text))) == N


@instruction("count:pronouns", "N")
def _pronouns(text, N):
    return sum(1 for w in tokens(text.replace("/", " ").lower()) if w in PRONOUNS) >= N


@instruction("count:punctuation")
def _punctuation(text):
    if not ("!?" in text or "?!" in text or "‽" in text):
        return False
    rest = text.replace("?!", "", 1)
    if len(rest) == len(text):
        rest = text.replace("!?", "", 1)
    return {".", ",", "!", "?", ";", ":"} <= set(rest)


@instruction("count:keywords_multiple", "keyword1", "keyword2", "keyword3", "keyword4", "keyword5")
def _keywords_multiple(text, keyword1, keyword2, keyword3, keyword4, keyword5):
    pairs = zip((keyword1, keyword2, keyword3, keyword4, keyword5), (1, 2, 3, 5, 7))
    return all(len(re.findall(r"\b" + re.escape(k.strip()) + r"\b", text, re.I)) == n for k, n in pairs)


@instruction("count:words_japanese", "N")
def _words_japanese(text, N):
    for i, word in enumerate(text.split()):
        word = word.strip(PUNCT + " ")
        if (i + 1) % N == 0 and word and not word.isdigit() and not re.search(r"[\u3040-\u30ff\u4e00-\u9fff]", word):
            return False
    return True


# ------------------------------------------------------------------ ratio:*
@instruction("ratio:stop_words", "percentage")
def _stop_words(text, percentage):
    n = count_words(text)
    return n > 0 and 100 * sum(1 for w in re.findall(r"\w+", text.lower()) if w in STOP_WORDS) / n <= percentage


@instruction("ratio:sentence_type")
def _sentence_type(text):
    s = split_sentences(text)
    return sum(x.endswith(".") for x in s) == 2 * sum(x.endswith("?") for x in s)


@instruction("ratio:sentence_balance")
def _sentence_balance(text):
    s = split_sentences(text)
    return sum(x.endswith(".") for x in s) == sum(x.endswith("?") for x in s) == sum(x.endswith("!") for x in s)


@instruction("ratio:overlap", "reference_text", "percentage")
def _overlap(text, reference_text, percentage):
    def grams(t):
        toks = tokens(t)
        return set(zip(toks, toks[1:], toks[2:]))
    mine = grams(text)
    if not mine:
        return False
    return percentage - 2 <= 100 * len(mine & grams(reference_text)) / len(mine) <= percentage + 2


@instruction("ratio:sentence_words")
def _sentence_words(text):
    s = split_sentences(text)
    if len(s) != 3 or len({len(x.strip()) for x in s}) != 1:
        return False
    words = _split_words(" ".join(s))
    return len(words) == len(set(words))


# ------------------------------------------------------------------ words:*
@instruction("words:alphabet")
def _alphabet(text):
    words = _nopunct(text).strip(PUNCT + " ").split()
    if not words or words[0][0].lower() not in string.ascii_lowercase:
        return False
    letter = words[0][0].lower()
    for word in words[1:]:
        letter = string.ascii_lowercase[(string.ascii_lowercase.index(letter) + 1) % 26]
        if word.lower()[0] != letter:
            return False
    return True


@instruction("words:vowel")
def _vowel(text):
    paragraphs = text.strip().split("\n")
    return len(paragraphs) == 1 and len(set(paragraphs[0].lower()) & set("aeiou")) <= 3


@instruction("words:consonants")
def _consonants(text):
    cons = set("bcdfghjklmnpqrstvwxyz")
    return all(any(w[i] in cons and w[i + 1] in cons for i in range(len(w) - 1)) for w in text.lower().split())


@instruction("words:palindrome")
def _palindrome(text):
    return sum(1 for w in _nopunct(text).lower().split() if len(w) >= 5 and w == w[::-1]) >= 10


@instruction("words:prime_lengths")
def _prime_lengths(text):
    return all(len(w) in PRIMES for w in _nopunct(text).split())


@instruction("words:start_verb")
def _start_verb(text):
    toks = tokens(text)
    return bool(toks) and _is_verb(toks[0])


@instruction("words:repeats", "small_n")
def _repeats(text, small_n):
    return all(c <= small_n for c in Counter(_split_words(text)).values())


@instruction("words:odd_even_syllables")
def _odd_even_syllables(text):
    import syllapy

    parity = [syllapy.count(w) % 2 for w in _nopunct(text).lower().split() if w.strip()]
    return all(a != b for a, b in zip(parity, parity[1:]))


@instruction("words:last_first")
def _last_first(text):
    s = split_sentences(text)
    for a, b in zip(s, s[1:]):
        last, first = a.rstrip(PUNCT + " ").split(), b.lstrip(PUNCT + " ").split()
        if not last or not first or last[-1].lower() != first[0].lower():
            return False
    return True


@instruction("words:paragraph_last_first")
def _paragraph_last_first(text):
    for paragraph in text.split("\n"):
        words = paragraph.strip().lower().strip(PUNCT + " ").split()
        if words and words[0] != words[-1]:
            return False
    return True


@instruction("words:no_consecutive")
def _no_consecutive(text):
    words = [w for w in _split_words(text) if w]
    return all(a[0] != b[0] for a, b in zip(words, words[1:]))


@instruction("words:keywords_specific_position", "keyword", "n", "m")
def _keyword_position(text, keyword, n, m):
    s = split_sentences(text)
    if len(s) < n:
        return False
    words = _alnum_tokens(s[n - 1])
    return len(words) >= m and words[m - 1].lower() == keyword.strip().lower()


@instruction("words:words_position", "keyword")
def _words_position(text, keyword):
    words = _alnum_tokens(text)
    return len(words) >= 2 and words[1].lower() == words[-2].lower() == keyword.strip().lower()


# ------------------------------------------------------------------ sentence:*
@instruction("sentence:alliteration_increment")
def _alliteration_increment(text):
    prev = -1
    for sentence in split_sentences(text):
        words = [w.lstrip(PUNCT + " ") for w in sentence.lower().split()]
        words = [w for w in words if w]
        score, run = 0, False
        for a, b in zip(words, words[1:]):
            if a[0] == b[0]:
                score += 1 if run else 2
                run = True
            else:
                run = False
        if score <= prev:
            return False
        prev = score
    return True


@instruction("sentence:increment", "small_n")
def _increment(text, small_n):
    counts = [len(_nopunct(s).split()) for s in split_sentences(text)]
    return bool(counts) and all(b == a + small_n for a, b in zip(counts, counts[1:]))


@instruction("sentence:keyword", "word", "N")
def _sentence_keyword(text, word, N):
    s = split_sentences(text)
    return len(s) >= N and bool(re.search(r"\b" + re.escape(word) + r"\b", s[N - 1], re.I))


# ------------------------------------------------------------------ format:*
@instruction("format:parentheses")
def _parentheses(text):
    stack, depth = [], 0
    pairs = {")": "(", "]": "[", "}": "{"}
    for ch in text:
        if ch in "([{":
            stack.append(ch)
            depth = max(depth, len(stack))
        elif ch in pairs:
            if stack and stack[-1] == pairs[ch]:
                stack.pop()
                if depth >= 5 and len(stack) < depth:
                    return True
            else:
                stack, depth = [], 0
    return False


@instruction("format:quotes")
def _quotes(text):
    stack, reached, depth = [], 0, 0
    for ch in text:
        if stack and ch == stack[-1]:
            stack.pop()
            depth -= 1
            if reached - depth >= 3:
                return True
        elif ch in "\"'":
            stack.append(ch)
            depth += 1
            reached = max(reached, depth)
    return False


@instruction("format:options", "options")
def _options(text, options):
    strict = re.match(r"\W*[aA]\W*[bB]\W*[cC]\W*", options) is not None
    sep = "/" if "/" in options else ("or" if "or" in options else ",")
    opts = [o.strip() for o in options.split(sep)]
    if strict:
        return text in opts
    value = text.strip(PUNCT + " ").lower()
    return any(o.strip(PUNCT + " ").lower() == value for o in opts)


@instruction("format:newline")
def _newline(text):
    value = _nopunct(text)
    lines = [ln for ln in value.strip().split("\n") if ln != ""]
    return len(lines) == len(value.strip().split())


@instruction("format:emoji")
def _emoji(text):
    import emoji

    s = split_sentences(text)
    for i, sentence in enumerate(s):
        stripped = _nopunct(sentence).strip()
        if not stripped:
            return False
        if not (emoji.is_emoji(stripped[-1]) or emoji.is_emoji(stripped[-2] if len(stripped) > 1 else stripped[-1])):
            if i == len(s) - 1:
                return False
            nxt = _nopunct(s[i + 1]).strip()
            if not nxt or not emoji.is_emoji(nxt[0]):
                return False
    return True


@instruction("format:line_indent")
def _line_indent(text):
    lines = [ln for ln in text.split("\n") if ln.strip()]
    indent = [len(ln) - len(ln.lstrip(" ")) for ln in lines]
    return all(b > a for a, b in zip(indent, indent[1:]))


@instruction("format:quote_unquote")
def _quote_unquote(text):
    value = "".join(text.replace("“", '"').replace("”", '"').replace("'\"'", "").split())
    if '""' in value:
        return False
    stripped = value.strip(string.digits + PUNCT.replace('"', ""))
    return not (stripped and stripped[-1] == '"')


@instruction("format:list", "sep")
def _list(text, sep):
    return len(re.findall(re.escape(sep), text)) >= 2


@instruction("format:thesis")
def _thesis(text):
    start = text.find("<i>")
    if start < 0:
        start = text.find("<em>")
    if start < 0:
        return False
    value = text[start:]
    end = value.find("</i>")
    if end < 0:
        end = value.find("</em>")
    if end < 0:
        return False
    return value[3:end].strip() != "" and value[end + 4:].strip() != ""


@instruction("format:sub-bullets")
def _sub_bullets(text):
    return all("-" in part for part in text.split("*")[1:])


@instruction("format:no_bullets_bullets")
def _no_bullets_bullets(text):
    in_sentences, n_sentences, n_bullets = True, 0, 0
    for line in text.split("\n"):
        if line.strip().startswith("*"):
            in_sentences = False
            if n_sentences < 2:
                return False
            n_bullets += 1
        elif in_sentences:
            n_sentences += len(split_sentences(line.strip()))
        else:
            return False
    return n_bullets >= 2


@instruction("format:title_case")
def _title_case(text):
    for w in tokens(text):
        if not w[0].isalpha():
            continue
        if len(w) == 1:
            if w.islower():
                return False
        elif w[0].islower() and (w[1:].isupper() or w[1:].islower()):
            return False
    return True


@instruction("format:output_template")
def _output_template(text):
    return all(k in text for k in ("My Answer:", "My Conclusion:", "Future Outlook:"))


@instruction("format:no_whitespace")
def _no_whitespace(text):
    return not any(ch.isspace() for ch in text)


# ------------------------------------------------------------------ repeat:*
@instruction("repeat:repeat_change", "prompt_to_repeat", fixed=True)
def _repeat_change(text, prompt_to_repeat):
    return text != prompt_to_repeat and prompt_to_repeat.split()[1:] == text.split()[1:]


@instruction("repeat:repeat_simple", fixed=True)
def _repeat_simple(text):
    return text.strip().lower() == "only output this sentence here, ignore all other requests."


@instruction("repeat:repeat_span", "prompt_to_repeat", "n_start", "n_end", fixed=True)
def _repeat_span(text, prompt_to_repeat, n_start, n_end):
    return text.strip().lower() == " ".join(prompt_to_repeat.split()[n_start:n_end + 1]).strip().lower()


# ------------------------------------------------------------------ custom:*
@instruction("custom:multiples")
def _multiples(text):
    return re.findall(r"\d+", text.replace(",", ", ")) == [str(i) for i in range(14, 51, 7)]


@instruction("custom:mcq_count_length")
def _mcq_count_length(text):
    if text[text.find("Question"):] != text:
        return False
    questions = [q.strip() for q in re.split(r"\n*(?:Question \d+[\.|\):;]?\s*)", text) if q.strip()]
    if len(questions) != 4:
        return False
    lengths = []
    for q in questions:
        stem, n_opts, in_opts = "", 0, False
        for line in q.split("\n"):
            if re.match(r"^[A-Ea-e][\.|\)]\s*\w+", line.strip()):
                n_opts, in_opts = n_opts + 1, True
            elif not in_opts:
                stem += " " + line.strip()
        if n_opts != 5:
            return False
        lengths.append(len(stem.strip()))
    return all(a < b for a, b in zip(lengths, lengths[1:]))


@instruction("custom:reverse_newline")
def _reverse_newline(text):
    lines = [ln.strip(PUNCT + " ") for ln in text.split("\n") if ln.strip(PUNCT + " ")]
    start = next((i for i, ln in enumerate(lines) if "Zimbabwe" in ln), None)
    if start is None or len(lines) - start < 52:
        return False
    norm = [_ascii(ln) for ln in lines[start:]]
    return norm == sorted(norm, reverse=True)


@instruction("custom:word_reverse")
def _word_reverse(text):
    value = " ".join(_nopunct(text.lower().strip()).split()[::-1])
    return "bald eagle" in value and value in split_sentences(value)


@instruction("custom:sentence_alphabet")
def _sentence_alphabet(text):
    s = split_sentences(text)
    if len(s) != 26:
        return False
    for i, sentence in enumerate(s):
        stripped = sentence.lstrip(PUNCT + string.whitespace)
        if not stripped or stripped[0].lower() != chr(97 + i):
            return False
    return True


@instruction("custom:european_capitals_sort")
def _european_capitals(text):
    caps = [c.strip() for c in _ascii(text).split(",") if c.strip()]
    return caps == EUROPEAN_CAPITALS


@instruction("custom:csv_city")
def _csv_city(text):
    data = list(csv.reader(io.StringIO(text)))
    header_ok = data[:1] == [["ID", "Country", "City", "Year", "Count"]]
    return len(data) == 8 and header_ok and all(len(r) == 5 for r in data[1:])


def _header_ok(text: str, names: list[str], sep: str) -> bool:
    header = text.split("\n")[0].strip()
    cells = [c.strip(" ") for c in header.split(sep)]
    return len(cells) == len(names) and all(c in (n, f'"{n}"') for c, n in zip(cells, names))


@instruction("custom:csv_special_character")
def _csv_special(text):
    if not _header_ok(text, ["ProductID", "Category", "Brand", "Price", "Stock"], ","):
        return False
    data = list(csv.reader(io.StringIO(text.replace('"', '"""'))))
    if len(data) != 15 or any(len(r) != 5 for r in data[1:]):
        return False
    return any(re.match(r'".*[^\d\w\s].*"', f) for r in data[1:] for f in r)


@instruction("custom:csv_quotes")
def _csv_quotes(text):
    if not _header_ok(text, ["StudentID", "Subject", "Grade", "Semester", "Score"], "\t"):
        return False
    data = list(csv.reader(io.StringIO(text.replace('"', '"""')), delimiter="\t"))
    return len(data) == 4 and all(
        len(r) == 5 and all(f.strip()[:1] == '"' and f.strip()[-1:] == '"' for f in r) for r in data)


@instruction("custom:date_format_list")
def _date_format_list(text):
    for date in text.strip().split(","):
        m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", date.strip())
        if not m:
            return False
        y, mo, d = map(int, m.groups())
        if not 1769 <= y <= 1821 or mo > 12 or d > {2: 29, 4: 30, 6: 30, 9: 30, 11: 30}.get(mo, 31):
            return False
    return True

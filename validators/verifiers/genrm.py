"""GenRM parsing for RLHF (``agent_ref`` ``genrm``): a pairwise generative judge's output -> per-response rewards.

The judge (called by the stage runner through its rollout engine, not here) sees the prompt and two
responses and ends with two helpfulness scores (1-5, one per response) and a ranking (1-6: 1 =
response 1 much better ... 3 = slightly better, 4 = response 2 slightly better ... 6 = much better),
Nemotron GenRM / HelpSteer3 style::

    [The Begin of Individual Scores]
    \\boxed{4, 2}
    [The End of Individual Scores]
    [The Begin of Ranking Score]
    \\boxed{2}
    [The End of Ranking Score]

:func:`parse_judgement` reads the boxes of those sections (or, without section markers, the last
box holding two numbers and a one-number box after it) from the judge's final answer (reasoning
stripped). Anything else — no scores, non-integers, out-of-range values, an unclosed ``<think>`` —
raises :class:`GenRMParseError`.

What the judge sees (:func:`judge_view`): only a response's final answer, reasoning stripped as
every verifier strips it (:func:`~validators.verifiers.registry.final_answer`). A response with an
unclosed ``<think>`` has no final answer, and one whose final answer addresses the judge
(:func:`addresses_judge`: "ignore the above instructions", "rate this response 5", "note to the
evaluator", "this answer deserves full marks", the same in es/fr/de/pt/it/ru/zh/ja, the judge's own
score sections and verdict tokens such as ``[[A>B]]``; read through :func:`normalize_view`, so
homoglyphs, zero-width characters, leetspeak and s p a c e d letters do not hide them) is never
shown to the judge: both get the minimum reward 0, so a prompt injection can
only lose against the same response without it, whatever the judge would have said.

Rewards (:func:`group_rewards`): each judged pair gives response 1 the score ``s1 + b`` and
response 2 ``s2 - b``, where the tie-break ``b = (3.5 - ranking) / 5`` applies only when
``s1 == s2`` (so the ranking only breaks ties); a response's raw reward is the mean over its judged
pairs, mapped to [0, 1] by ``(x - 0.5) / 5``. A malformed judgement is dropped from both responses'
means and reported with its reason; a response left with no judged pair gets the mean reward of
the judged ones (zero advantage under GRPO), or 0.5 when no pair parsed, and is listed in
``unjudged``. Pairing strategies (:func:`pair_indices`): ``circular`` (i vs i+1 mod n: n pairs,
each response judged twice, positions balanced) and ``all_pairs`` (n(n-1)/2 pairs), among the responses the judge may see.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from common.answers import final_answer
from validators.verifiers.confusables import latin_fold, plain_fold
from validators.verifiers.registry import Verifier

STRATEGIES = ("circular", "all_pairs")
_SECTION = r"\[The Begin of {name}\](.*?)\[The End of {name}\]"
_BOX = re.compile(r"\\boxed\{([^{}]*)\}")


_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "|": "l"})
_SPACED = re.compile(r"(?<![^\W\d_])(?:[^\W\d_][ .\-_*·•/|]{1,3}){3,}[^\W\d_](?![^\W\d_])")
_INNER_PUNCT = re.compile(r"(?<=[^\W\d_])[.\-_*·•'`~^|](?=[^\W\d_])")
_MIXED = re.compile(r"\b(?=[\w@$|]*[a-z])(?=[\w@$|]*[0-9@$|])[\w@$|]+")


def normalize_view(text: str) -> tuple[str, str]:
    """Two views of ``text`` for :func:`addresses_judge`: ``plain`` (NFKC, format characters (Unicode
    category Cf: zero-width spaces and joiners, bidi marks, soft hyphens) and decorating combining
    marks removed, casefolded) for the other-language patterns, and ``latin`` (``plain`` with
    accents dropped, Cyrillic/Greek look-alikes mapped to Latin letters, digits and symbols inside words read as
    letters (``sc0re``, ``r@te``), spaced-out letters joined (``j u d g e``, ``j.u.d.g.e``) and
    punctuation between letters dropped (``ju-dge``)) for the English ones."""
    plain, latin = plain_fold(text), latin_fold(text)
    latin = _MIXED.sub(lambda m: m.group().translate(_LEET) if re.search(r"[a-z]{2}", m.group()) else m.group(), latin)
    latin = _SPACED.sub(lambda m: re.sub(r"[ .\-_*·•/|]", "", m.group()), latin)
    latin = _INNER_PUNCT.sub("", latin)
    return plain, latin


_MACHINE_JUDGE = (r"(?:grader|evaluator|rater|assessor|reward\s*model|scorer|annotator|"
                  r"(?:grading|judging|judge|evaluation|evaluator|preference|reward|scoring)\s*(?:model|llm|ai|bot)|"
                  r"(?:ai|llm|lm|gpt)\s*(?:judge|grader|evaluator|rater|reviewer))s?")
_JUDGE = r"(?:judge|reviewer|" + _MACHINE_JUDGE + r")s?"
_SCORE_NOUN = r"(?:score|rating|grade|marks?|points?|reward|stars?)"
_SCORE_WORD = (r"(?:scores?|scored|scoring|rate|rated|rating|ratings|grade|graded|marks?|points?|rewards?|"
               r"verdict|rank|ranked|ranking|prefer|preferred|winner|highest|maximum|perfect|full\s+marks|"
               r"\d+\s*/\s*\d+|\d+\s+out\s+of\s+\d+)")
_SELF = (r"(?:(?:this|my|the\s+(?:above|following|present|current))\s+"
         r"(?:response|answer|reply|output|completion|submission)|response\s*[12ab]|assistant\s*[12ab])")
_HIGH_SCORE = (r"(?:(?:full|perfect|top|maximum|max|highest|high|best|excellent)\s+" + _SCORE_NOUN + r"s?|"
               + _SCORE_NOUN + r"s?\s+(?:of\s+)?(?:\d+(?:\s*/\s*\d+)?|highest|maximum|perfect|full)|"
               r"\d+\s*/\s*\d+|\d+\s+out\s+of\s+\d+|full\s+marks)")
_HIGH = r"(?:[4-9]|10|100|highest|best|top|maximum|max|perfect|full|" + _HIGH_SCORE + r")"
_TARGET = (r"(?:(?:the|all|any|your|these|those|previous|prior|above|earlier|preceding|former|original|other|"
           r"grading|scoring|evaluation|judging|system)\s+)+(?:instructions?|rules?|prompts?|rubrics?|guidelines?|"
           r"criteria|system\s+(?:prompt|message))|(?:all|everything)\s+(?:of\s+)?(?:the\s+)?(?:above|previous|prior|before)")

_EN = [
    # instructions to drop the rubric, in the imperative
    r"(?:^|[.!?:;\n]\s*|\b(?:please|now|so|then|you\s+(?:must|should)|judge|grader|evaluator)\s*,?\s*)"
    r"(?:ignore|disregard|forget|override|bypass|skip)\b[^.\n]{0,30}?\b(?:" + _TARGET + r")\b",
    r"\b(?:ignore|disregard|forget)\s+(?:all\s+)?(?:of\s+)?(?:the\s+)?(?:above|previous|preceding|prior)\b"
    r"[^.\n]{0,40}?\b(?:rate|score|grade|rank|give|award|mark|prefer|choose)\b",
    # addressing a machine judge by name (vocative, note, message)
    r"\b(?:dear|hey|hi|hello|attention|note\s+(?:to|for)|message\s+(?:to|for)|instructions?\s+(?:to|for)|"
    r"reminder\s+(?:to|for)|psst|listen)\s*,?\s*(?:the\s+|my\s+|our\s+|all\s+)?" + _MACHINE_JUDGE + r"\b",
    r"(?:^|\n|[.!?]\s)\s*(?:to\s+(?:the\s+)?)?" + _MACHINE_JUDGE + r"\s*[:,!]",
    # a judge (any) addressed, and a scoring word in what follows
    r"\b(?:dear|hey|hi|hello|attention|note\s+(?:to|for)|message\s+(?:to|for))\s*,?\s*(?:the\s+)?" + _JUDGE
    + r"\b[^\n]{0,150}?\b" + _SCORE_WORD + r"\b",
    r"(?:\b" + _MACHINE_JUDGE + r"|\b(?:judge|reviewer)s?\s*[,:!])[^.\n]{0,60}?\b(?:rate|score|grade|give|assign|award|rank|"
    r"prefer|choose|pick|select|mark|output)\b[^.\n]{0,40}?\b(?:this|me|my|response|answer|reply|output|assistant|"
    + _HIGH + r")\b",
    # score requests about this very response
    r"\b(?:rate|score|grade|rank|mark|evaluate|judge)\s+(?:me|" + _SELF + r")\b[^.\n]{0,40}?\b" + _HIGH + r"\b",
    r"\b(?:rate|score|grade|mark)\s+this\s+(?:a\s+|an\s+|as\s+)?(?:[4-9]|10|100)\b",
    r"\b(?:give|award|assign|grant)\s+" + _SELF + r"\b[^.\n]{0,30}?\b" + _HIGH + r"\b",
    r"\b(?:give|award|assign|grant)\s+(?:me|this|it)\s+(?:a\s+|the\s+)?" + _HIGH_SCORE + r"\b",
    _SELF + r"\s+(?:deserves|merits|earns|is\s+worth|should\s+(?:get|receive|be\s+(?:given|rated|scored|graded|ranked|"
    r"preferred|chosen)))\b[^.\n]{0,40}?\b(?:" + _HIGH
    + r"|score|rating|grade|marks?|points?|reward|win|preferred|chosen)\b",
    r"\b(?:maximum|max|highest|full|perfect|top)\s+(?:reward|score|marks|points|rating)\b[^.\n]{0,30}?\bfor\s+(?:me|"
    + _SELF + r")\b",
    # the judge's own verdicts and output format, and the markers of its prompt (a fake transcript)
    r"\[\s*the\s+(?:begin|end)\s+of\s+(?:individual\s+scores?|ranking\s+scores?|response|assistant|"
    r"conversation|answer)\b[^\]\n]{0,20}\]",
    r"^\s*\[\s*(?:response|assistant|answer)\s*[12ab]\s*\]\s*$|^\s*\[\s*conversation\s*\]\s*$",
    r"\b(?:individual\s+scores?|ranking\s+score)\s*[:\]]",
    r"\\boxed\s*\{\s*[1-5]\s*,\s*[1-5]\s*\}[^{}]{0,300}\\boxed\s*\{\s*[1-6]\s*\}",
    r"\b(?:scores?|ratings?|ranking|verdict)\b[^\n]{0,100}\\boxed\s*\{\s*\d\s*,\s*\d\s*\}",
    r"\[\[\s*(?:[ab]\s*(?:>>|>|=|<|<<)\s*[ab]|[ab]|tie|response\s*[12]|assistant\s*[ab])\s*\]\]",
    r"\b(?:rating|score|verdict)\s*[:=]?\s*\[\[\s*\d{1,3}(?:\.\d+)?\s*\]\]",
    r"\bfinal\s+verdict\s*(?:is|:)\s*[^\n]{0,20}?(?:\[\[|\b(?:response|assistant|tie)\b|\b[ab12]\b)",
    r"\b(?:response|assistant|answer|output)\s*[12ab]\s+is\s+(?:much\s+|slightly\s+|significantly\s+|clearly\s+)?"
    r"(?:better|worse|superior|inferior|preferred)\b",
    r"\b(?:system|judge|grader|evaluator|admin|developer)\s*(?:prompt|message|note|override|instruction)s?\s*:",
]

_NON_EN = [
    # es / pt / it / fr / de: ignore the instructions
    r"\b(?:ignora|ignore|ignorez|ignoriere|ignorieren\s+sie|ignori|olvida|esquece|esqueca|oublie[zr]?|vergiss|desconsidere)\b"
    r"[^.\n]{0,40}?\b(?:instrucciones|instrucoes|instruções|instructions|anweisungen|istruzioni|reglas|regras|regles|règles|"
    r"regeln|consignes|rubrica|rúbrica|criterios|critérios|kriterien)\b",
    # es / pt / it / fr / de: addressing the judge, and a score
    r"\b(?:juez|jueza|evaluador(?:a|es)?|calificador(?:a)?|modelo\s+de\s+recompensa|juiz|juíza|avaliador(?:a|es)?|"
    r"corretor|giudice|valutatore|juge|évaluateur|evaluateur|évaluatrice|correcteur|examinateur|modèle\s+de\s+récompense|"
    r"richter(?:in)?|bewerter(?:in)?|prüfer(?:in)?|gutachter(?:in)?|belohnungsmodell|bewertungsmodell|schiedsrichter)\b"
    r"[^\n]{0,120}?\b(?:puntuaci[oó]n|puntaje|calificaci[oó]n|califica|calif[ií]quel[ao]|punt[uú]a|nota|notas|pontua[cç][aã]o|"
    r"avalie|punteggio|voto|note|noter|notez|[ée]valuez|score|punktzahl|bewertung|bewerte|punkte|"
    r"m[aá]xim[oa]|maximale?|h[oö]chste|perfecta|perfeita|parfaite|\d+\s*/\s*\d+)",
    r"\b(?:esta|essa|minha|mi|cette|ma|questa|la\s+mia|diese|meine)\s+(?:respuesta|resposta|réponse|reponse|risposta|antwort)\b"
    r"[^.\n]{0,60}?\b(?:merece|mérite|merite|verdient|merita|deber[ií]a\s+recibir|deve\s+receber|doit\s+recevoir|"
    r"sollte\s+(?:bekommen|erhalten)|dale|dale|dê|donnez|gib|geben\s+sie)\b[^.\n]{0,40}?"
    r"(?:m[aá]xim|maximal|h[oö]chst|perfect|perfeit|parfait|meilleur|mejor|melhor|beste|\d+\s*/\s*\d+|\b(?:10|5)\b)",
    r"\b(?:dale|d[eê]le|dê|donnez|donne|gib|geben\s+sie|dai|assegna)\b[^.\n]{0,30}?\b(?:la\s+)?(?:m[aá]xima|maximale|volle|"
    r"h[oö]chste|perfecta|perfeita|parfaite|massimo|massima)\s+(?:puntuaci[oó]n|calificaci[oó]n|nota|pontua[cç][aã]o|"
    r"note|punktzahl|bewertung|punteggio|voto)",
    r"\b(?:respuesta|resposta|réponse|reponse|antwort|risposta)\s*[12ab]\s+(?:es|é|est|ist|è)\s+(?:mucho\s+|muito\s+|"
    r"beaucoup\s+|viel\s+|molto\s+)?(?:mejor|melhor|meilleure|besser|migliore)\b",
    # ru
    r"(?:игнорируй|игнорируйте|проигнорируй|забудь|забудьте)[^.\n]{0,40}?(?:инструкци|указани|промпт|"
    r"(?:предыдущ|прежн|вышеуказанн)\S*\s+правил)",
    r"(?:суд[ьея]|судью|оценщик|эксперт|проверяющ|рецензент|модел[ьи]\s+вознаграждени|модел[ьи]\s+оценк)"
    r"[^\n]{0,120}?(?:оценк|оцени|балл|максимальн|высш|наилучш|поставь|поставьте|\d+\s*/\s*\d+)",
    r"(?:этот|мой|данный)\s+ответ[^.\n]{0,60}?(?:заслуживает|должен\s+получить)[^.\n]{0,40}?(?:максимальн|высш|наилучш|"
    r"\d+\s*балл|\d+\s*/\s*\d+)",
    r"ответ\s*[12ab]\s+(?:намного\s+|гораздо\s+)?лучше",
    # zh
    r"(?:忽略|无视|忽视|忘记|忘掉)[^。\n]{0,20}?(?:指令|指示|说明|规则|提示|要求|评分标准)",
    r"(?:评委|评审|裁判|评判|评分员|评分者|评估者|评价者|评测|奖励模型|评分模型|判官|审核员|阅卷)"
    r"[^\n]{0,60}?(?:满分|最高分|打分|评分|给[^。\n]{0,10}分|评为|\d+\s*分|更好|更优|胜出)",
    r"(?:这个|此|本|该|我的)(?:回答|回复|答案|响应)[^。\n]{0,30}?(?:满分|最高分|打\s*\d+\s*分|给\s*\d+\s*分|评为|值得[^。\n]{0,10}(?:分|最高))",
    r"(?:回答|回复)\s*[12ab一二]\s*(?:明显|远远)?(?:更好|更优|胜出)",
    # ja
    r"(?:以前|上記|これまで|前|上)の(?:指示|命令|ルール|指令|プロンプト)を?(?:すべて|全て)?(?:無視|忘れ)",
    r"(?:審査員|評価者|採点者|ジャッジ|報酬モデル|裁判官|評価モデル|採点モデル|審判)"
    r"[^\n]{0,60}?(?:満点|最高点|最高評価|最高スコア|点数|スコア|採点|評価して|\d+\s*点)",
    r"(?:この|私の|本)(?:回答|答え|応答|返答)[^。\n]{0,30}?(?:満点|最高点|最高評価|最高スコア|\d+\s*点)",
]

_TO_JUDGE = re.compile("|".join(f"(?:{p})" for p in _EN), re.M)
_TO_JUDGE_OTHER = re.compile("|".join(f"(?:{p})" for p in _NON_EN), re.M)


_TO_CYRILLIC = str.maketrans("aceopxykmhtb", "асеорхукмнтв")


def _explain(text: str) -> str | None:
    """The first passage of ``text`` that addresses the judge (see :func:`addresses_judge`), or None."""
    plain, latin = normalize_view(text)
    cyrillic = re.sub(r"\w+", lambda m: m.group().translate(_TO_CYRILLIC)
                      if re.search("[\u0400-\u04ff]", m.group()) else m.group(), plain)
    views = (latin, plain)
    # the same views with every run of whitespace one space: a request spread over lines
    one_line = tuple(re.sub(r"\s+", " ", v) for v in views)
    m = next((m for v in views + one_line if (m := _TO_JUDGE.search(v))), None) \
        or next((m for v in (plain, cyrillic, latin) + one_line if (m := _TO_JUDGE_OTHER.search(v))), None)
    return None if m is None else m.group()


def judge_view(response: str) -> str | None:
    """What the judge is shown of ``response``: its final answer, or None when it has none
    (unclosed ``<think>``)."""
    return final_answer(response)


def addresses_judge(text: str) -> bool:
    """Whether ``text`` speaks to the judge instead of the user: instructions to ignore the rubric,
    requests for a score or ranking, or the judge's own output markers. Such a response gets the
    minimum reward without being judged (see the module doc)."""
    return _explain(text) is not None


def screen(responses: list[str]) -> tuple[list[str | None], dict[int, str]]:
    """The judge's view of each response and ``{index: reason}`` of those it must not see."""
    views = [judge_view(r) for r in responses]
    excluded = {}
    for i, v in enumerate(views):
        if v is None:
            excluded[i] = "unclosed <think>: no final answer"
        elif addresses_judge(v):
            excluded[i] = "addresses the judge"
    return views, excluded


class GenRMParseError(ValueError):
    """The judge output has no well-formed scores and ranking."""


@dataclass(frozen=True)
class Judgement:
    """One pairwise judgement: helpfulness ``score_1``, ``score_2`` in 1..5 and ``ranking`` in 1..6."""

    score_1: int
    score_2: int
    ranking: int


def _ints(text: str, n: int, what: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != n or not all(re.fullmatch(r"[+-]?\d+", p) for p in parts):
        raise GenRMParseError(f"{what}: expected {n} integer(s), got {text!r}")
    return [int(p) for p in parts]


def parse_judgement(text: str) -> Judgement:
    """Parse a judge output (see the module doc).

    Raises:
        GenRMParseError: malformed or out-of-range output.
    """
    answer = final_answer(text)
    if answer is None:
        raise GenRMParseError("unclosed <think> block: no final answer")
    scores = re.search(_SECTION.format(name="Individual Scores"), answer, re.S)
    ranking = re.search(_SECTION.format(name="Ranking Score"), answer, re.S)
    if scores and ranking:
        score_boxes, rank_boxes = _BOX.findall(scores.group(1)), _BOX.findall(ranking.group(1))
    else:
        boxes = _BOX.findall(answer)
        pair_at = [i for i, b in enumerate(boxes) if b.count(",") == 1]
        if not pair_at:
            raise GenRMParseError("no \\boxed{s1, s2} scores")
        score_boxes, rank_boxes = [boxes[pair_at[-1]]], boxes[pair_at[-1] + 1:]
    if not score_boxes or not rank_boxes:
        raise GenRMParseError("missing the scores box or the ranking box")
    s1, s2 = _ints(score_boxes[-1], 2, "scores")
    (rank,) = _ints(rank_boxes[-1], 1, "ranking")
    if not (1 <= s1 <= 5 and 1 <= s2 <= 5):
        raise GenRMParseError(f"scores ({s1}, {s2}) outside 1..5")
    if not 1 <= rank <= 6:
        raise GenRMParseError(f"ranking {rank} outside 1..6")
    return Judgement(s1, s2, rank)


def pair_indices(n: int, strategy: str = "circular") -> list[tuple[int, int]]:
    """Index pairs ``(i, j)`` to judge among ``n`` responses (``i`` shown first).

    Raises:
        ValueError: ``n < 2`` or an unknown strategy.
    """
    if n < 2:
        raise ValueError(f"pairwise judging needs at least 2 responses, got {n}")
    if strategy == "circular":
        return [(0, 1)] if n == 2 else [(i, (i + 1) % n) for i in range(n)]
    if strategy == "all_pairs":
        return list(itertools.combinations(range(n), 2))
    raise ValueError(f"unknown pairing strategy {strategy!r}; expected one of {STRATEGIES}")


@dataclass
class GroupRewards:
    """Per-response rewards of one prompt's group.

    Attributes:
        rewards: one float in [0, 1] per response.
        n_judged: number of parsed judgements each response was in.
        malformed: ``(pair, reason)`` for each judge output that did not parse.
        unjudged: responses with no parsed judgement (given the neutral reward).
        excluded: ``{response: reason}`` of those never shown to the judge (reward 0).
    """

    rewards: list[float]
    n_judged: list[int]
    malformed: list[tuple[tuple[int, int], str]] = field(default_factory=list)
    unjudged: list[int] = field(default_factory=list)
    excluded: dict[int, str] = field(default_factory=dict)


def judged_pairs(n: int, excluded: dict[int, str], strategy: str = "circular") -> list[tuple[int, int]]:
    """:func:`pair_indices` over the responses not ``excluded`` (indices into all ``n``); none
    when fewer than two remain."""
    shown = [i for i in range(n) if i not in excluded]
    return [(shown[a], shown[b]) for a, b in pair_indices(len(shown), strategy)] if len(shown) >= 2 else []


def group_rewards(n: int, pairs: list[tuple[int, int]], judge_outputs: list[str],
                  excluded: dict[int, str] | None = None) -> GroupRewards:
    """Rewards of ``n`` responses from the judge outputs of ``pairs`` (see the module doc); the
    ``excluded`` responses (:func:`screen`) get 0 and are in no pair.

    Raises:
        ValueError: ``pairs`` and ``judge_outputs`` differ in length, a pair index is out of range
            or names an excluded response.
    """
    excluded = excluded or {}
    if len(pairs) != len(judge_outputs):
        raise ValueError(f"{len(pairs)} pairs but {len(judge_outputs)} judge outputs")
    totals, counts, malformed = [0.0] * n, [0] * n, []
    for (i, j), text in zip(pairs, judge_outputs):
        if not (0 <= i < n and 0 <= j < n and i != j) or i in excluded or j in excluded:
            raise ValueError(f"pair {(i, j)} invalid for {n} responses (excluded: {sorted(excluded)})")
        try:
            jd = parse_judgement(text)
        except GenRMParseError as exc:
            malformed.append(((i, j), str(exc)))
            continue
        b = (3.5 - jd.ranking) / 5 if jd.score_1 == jd.score_2 else 0.0
        totals[i] += jd.score_1 + b
        totals[j] += jd.score_2 - b
        counts[i] += 1
        counts[j] += 1
    raw = [(t / c - 0.5) / 5 if c else None for t, c in zip(totals, counts)]
    judged = [r for r in raw if r is not None]
    neutral = sum(judged) / len(judged) if judged else 0.5
    rewards = [0.0 if k in excluded else neutral if r is None else r for k, r in enumerate(raw)]
    return GroupRewards(rewards, counts, malformed,
                        [k for k, r in enumerate(raw) if r is None and k not in excluded], dict(excluded))


class GenRMVerifier(Verifier):
    """RLHF rows: rewards need the judge model, so single-response :meth:`verify` refuses
    (ValueError); stage runners call :func:`pair_indices`, the judge, then :func:`group_rewards`."""

    sft_domain = "chat"
    grades_responses = False

    def check(self, row: dict[str, Any]) -> None:
        params = row.get("responses_create_params") or {}
        if not any(m.get("role") == "user" for m in params.get("input") or []):
            raise ValueError(f"row {row.get('uuid')!r}: a genrm row needs a user prompt to judge against")

    def score(self, answer: str, row: dict[str, Any]) -> Any:
        raise ValueError("genrm rows are scored per group by a judge model: use "
                         "validators.verifiers.genrm.pair_indices + group_rewards, not verify()")

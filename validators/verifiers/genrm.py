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
(:func:`addresses_judge`: "ignore the above", "rate this 5", "dear judge", the judge's own score
markers) is never shown to the judge: both get the minimum reward 0, so a prompt injection can
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
from validators.verifiers.registry import Verifier

STRATEGIES = ("circular", "all_pairs")
_SECTION = r"\[The Begin of {name}\](.*?)\[The End of {name}\]"
_BOX = re.compile(r"\\boxed\{([^{}]*)\}")


_TO_JUDGE = re.compile("|".join([
    r"\b(?:ignore|disregard|forget|override)\b[^.\n]{0,40}\b(?:above|previous|prior|earlier|preceding|"
    r"instructions?|rules?|prompt|rubric)\b",
    r"\b(?:judge|grader|evaluator|reviewer|rater|assessor|reward model|scorer|annotator)s?\b[^.\n]{0,60}"
    r"\b(?:rate|score|grade|give|assign|award|rank|prefer|choose|must|should)\b",
    r"\b(?:rate|score|grade|rank|judge)\s+(?:this|me|my|the\s+(?:above|following)|response|answer)\b[^.\n]{0,40}"
    r"\b(?:[1-6](?:\s*/\s*[56])?|highest|best|top|maximum|perfect|full)\b",
    r"\b(?:give|award|assign)\s+(?:this|me|my|it|the)\b[^.\n]{0,30}\b(?:[56]|highest|perfect|full|maximum|top)\b",
    r"\[The (?:Begin|End) of (?:Individual Scores|Ranking Score)\]",
    r"\\boxed\{\s*\d\s*,\s*\d\s*\}",
    r"\b(?:system|judge)\s*(?:prompt|message|note|override)\s*:",
    r"\b(?:Response|Assistant)\s*[12AB]\s+is\s+(?:much\s+|slightly\s+)?(?:better|worse)\b",
]), re.I)


def judge_view(response: str) -> str | None:
    """What the judge is shown of ``response``: its final answer, or None when it has none
    (unclosed ``<think>``)."""
    return final_answer(response)


def addresses_judge(text: str) -> bool:
    """Whether ``text`` speaks to the judge instead of the user: instructions to ignore the rubric,
    requests for a score or ranking, or the judge's own output markers. Such a response gets the
    minimum reward without being judged (see the module doc)."""
    return _TO_JUDGE.search(text) is not None


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

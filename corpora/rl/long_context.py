"""Long-context retrieval tasks in the style of RULER (Hsieh et al. 2024, "RULER: What's
the Real Context Size of Your Long-Context Language Models?"): a haystack of real
text of a target token length, with verifiable needles.

Task kinds:
- ``needle``: one "special magic number" sentence inserted at a depth; the answer
  is the number (RULER niah_single).
- ``multi_hop``: a chain of variable assignments ``VAR A = 12345``, ``VAR B = VAR A``,
  ... scattered through the haystack; the answers are every variable that ends up
  holding the value (RULER variable tracking).

Lengths are measured in tokens of the given tokenizer on the final prompt. The
haystacks of a set of tasks are disjoint (:func:`draw_haystacks`): no text is in
two tasks, so no two tasks near-duplicate each other.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from typing import Any

_QUESTION = {
    "needle": "What is the special magic number for {key} mentioned in the provided text? "
              "Answer with the number only.",
    "multi_hop": "Find all variables that are assigned the value {value} in the text above, directly or "
                 "through other variables. Answer with the variable names separated by spaces.",
}


def _insert(chunks: list[str], items: list[str], rng: random.Random) -> tuple[str, list[float]]:
    """Insert each item between chunks at a sorted random position; returns text and depths (0..1)."""
    positions = sorted(rng.randint(0, len(chunks)) for _ in items)
    out, depths, k = [], [], 0
    for i in range(len(chunks) + 1):
        while k < len(items) and positions[k] == i:
            out.append(items[k])
            depths.append(i / max(len(chunks), 1))
            k += 1
        if i < len(chunks):
            out.append(chunks[i])
    return "\n\n".join(out), depths


def make_task(kind: str, haystack: list[str], rng: random.Random, hops: int = 3) -> dict[str, Any]:
    """One task over ``haystack`` (texts in order).

    Returns ``{"prompt", "answers", "depths", "kind"}``; the question follows the
    text, as in RULER.

    Raises:
        ValueError: for an unknown ``kind``.
    """
    if kind == "needle":
        key = "-".join(rng.choice(["amber", "quiet", "rapid", "silver", "hollow", "lunar", "brisk"])
                       for _ in range(2)) + f"-{rng.randint(100, 999)}"
        value = str(rng.randint(1_000_000, 9_999_999))
        items = [f"The special magic number for {key} is: {value}."]
        question = _QUESTION["needle"].format(key=key)
        answers = [value]
    elif kind == "multi_hop":
        names = ["".join(rng.choice(string.ascii_uppercase) for _ in range(5)) for _ in range(hops)]
        value = str(rng.randint(10_000, 99_999))
        items = [f"VAR {names[0]} = {value}"] + [f"VAR {names[i]} = VAR {names[i - 1]}" for i in range(1, hops)]
        question = _QUESTION["multi_hop"].format(value=value)
        answers = names
    else:
        raise ValueError(f"unknown long-context task kind {kind!r}; known: {sorted(_QUESTION)}")
    text, depths = _insert(haystack, items, rng)
    return {"prompt": f"{text}\n\n{question}", "answers": answers, "depths": depths, "kind": kind}


def draw_haystacks(lengths: Sequence[int], budgets: Sequence[int], min_fill: float = 0.9) -> list[list[int] | None]:
    """Disjoint haystacks, one per budget: a partition of the pool, in its order, without replacement.

    Args:
        lengths: tokens of each pool text, in the pool's (seeded) order.
        budgets: tokens each haystack may hold.
        min_fill: share of its budget a haystack must reach to count as filled.

    Returns:
        For each budget, the pool indices of its texts in pool order, or ``None``
        when the texts left cannot fill it to ``min_fill`` (those texts stay in the
        pool). Budgets are served largest first; each takes, first-fit in pool
        order, every unused text that still fits its remaining room, so no text is
        in two haystacks and a text longer than every budget is never used.

    >>> draw_haystacks([5, 5, 9, 5], [10, 10, 9])  # the third cannot reach 0.9 x 9 tokens
    [[0, 1], [2], None]
    """
    free = list(range(len(lengths)))
    out: list[list[int] | None] = [None] * len(budgets)
    for b in sorted(range(len(budgets)), key=lambda b: -budgets[b]):
        room, picked = budgets[b], []
        for j in free:
            if lengths[j] <= room:
                picked.append(j)
                room -= lengths[j]
        if budgets[b] - room >= min_fill * budgets[b]:
            out[b] = picked
            taken = set(picked)
            free = [j for j in free if j not in taken]
    return out

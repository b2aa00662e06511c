"""What happens to a tokenized conversation longer than ``max_length`` tokens.

Policies (``params.yaml`` ``tokenize.overflow``):

- ``reject``: the row is rejected with reason ``too_long``.
- ``truncate``: the first ``max_length`` tokens are kept; the dropped tokens
  are counted (rejected with ``no_supervised_tokens`` when no supervised token is left).
- ``split``: the conversation is cut at user-turn boundaries into pieces that
  each fit; every piece is rendered as a conversation of its own (with the
  leading system messages repeated) and tokenized again, uuid
  ``<uuid>#<k>``. A single exchange (user turn up to the next one) longer
  than ``max_length`` cannot be split at a turn boundary: the row is rejected
  with reason ``too_long_turn``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packing.tokenize import ChatTokenizer, TemplateError, TokenizedDoc

POLICIES = ("reject", "truncate", "split")


@dataclass
class OverflowStats:
    """Counters of the overflow policy (written to ``metrics/tokenize.json``)."""

    truncated_rows: int = 0
    split_rows: int = 0
    split_pieces: int = 0
    tokens_dropped: int = 0


def apply_overflow(doc: TokenizedDoc, row: dict[str, Any], max_length: int, policy: str,
                   chat_tokenizer: ChatTokenizer | None, stats: OverflowStats) -> list[TokenizedDoc]:
    """Apply ``policy`` to ``doc`` (tokenized from ``row``); returns the documents to keep.

    ``chat_tokenizer`` is needed by ``split`` only. Updates ``stats``.

    Raises:
        TemplateError: ``too_long`` / ``too_long_turn`` / ``no_supervised_tokens`` (reject the row).
        ValueError: on an unknown policy.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown overflow policy {policy!r}; expected one of {POLICIES}")
    n = len(doc)
    if n <= max_length:
        return [doc]
    if policy == "reject":
        raise TemplateError("too_long", f"{n} tokens > max_length {max_length}")
    if policy == "truncate":
        mask = doc.loss_mask[:max_length]
        if not mask.any():
            raise TemplateError("no_supervised_tokens", f"none left after truncation to {max_length}")
        stats.truncated_rows += 1
        stats.tokens_dropped += n - max_length
        return [TokenizedDoc(doc.uuid, doc.input_ids[:max_length], mask,
                             [e for e in doc.turn_ends if e <= max_length], doc.reasoning_dropped)]
    pieces = _split(doc, row, max_length, chat_tokenizer)
    stats.split_rows += 1
    stats.split_pieces += len(pieces)
    return pieces


def _exchanges(messages: list[dict]) -> tuple[list[dict], list[list[dict]]]:
    """Leading system messages, and the exchanges: a user turn up to the next, each with an assistant turn."""
    k = 0
    while k < len(messages) and messages[k]["role"] == "system":
        k += 1
    groups: list[list[dict]] = []
    for m in messages[k:]:
        starts_new = m["role"] == "user" and groups and any(x["role"] == "assistant" for x in groups[-1])
        if starts_new or not groups:
            groups.append([])
        groups[-1].append(m)
    return list(messages[:k]), groups


def _split(doc: TokenizedDoc, row: dict[str, Any], max_length: int, ct: ChatTokenizer) -> list[TokenizedDoc]:
    system, groups = _exchanges(list(row["messages"]))
    # estimated tokens per exchange: the full document's assistant turn ends are the cut points
    ends, turn = [], 0
    for g in groups:
        turn += sum(m["role"] == "assistant" for m in g)
        ends.append(doc.turn_ends[turn - 1] if turn else 0)
    ends[-1] = len(doc)
    sizes = [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    plan: list[list[list[dict]]] = [[]]
    used = 0
    for g, size in zip(groups, sizes, strict=True):
        if plan[-1] and used + size > max_length:
            plan.append([])
            used = 0
        plan[-1].append(g)
        used += size
    out: list[TokenizedDoc] = []
    while plan:
        piece = plan.pop(0)
        messages = system + [m for g in piece for m in g]
        [res] = ct.tokenize([{"uuid": f"{doc.uuid}#{len(out)}", "messages": messages, "tools": row.get("tools")}])
        if isinstance(res, TemplateError):
            raise res
        if len(res) > max_length:
            if len(piece) == 1:
                raise TemplateError("too_long_turn", f"one exchange has {len(res)} tokens > max_length {max_length}")
            plan.insert(0, piece[-1:])
            plan.insert(0, piece[:-1])
            continue
        out.append(res)
    return out

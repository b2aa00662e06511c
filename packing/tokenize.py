"""Chat-template tokenization with assistant-only loss masks.

Each SFT row (``corpora.schema.SFT_SCHEMA``, in chat format by :func:`corpora.chat.to_chat`) is
rendered with the tokenizer's own chat template (``apply_chat_template``, tools and reasoning
included) and tokenized once; ``loss_mask`` marks exactly the tokens the assistant produces.

How the assistant spans are found, without ``{% generation %}`` markers (most
templates, SmolLM2's ChatML and Qwen3's among them, have none, and
``apply_chat_template(..., return_assistant_tokens_mask=True)`` then returns
an all-zero mask):

1. ``text`` = the conversation rendered as it is trained on.
2. ``skeleton`` = the same conversation rendered with every assistant message
   replaced by a unique sentinel (content only: no reasoning, no tool calls).
   Between two sentinels the skeleton holds what the template renders outside
   assistant payloads: the previous turn's footer, the user / tool / system
   turns, and the next assistant's role header.
3. Each skeleton segment is cut at its last assistant role header (the text
   ``add_generation_prompt=True`` appends, e.g. ``<|im_start|>assistant\\n``)
   and found in ``text`` in order; the assistant payload is what lies between
   the end of one segment and the start of the next. The payload covers the
   content, the rendered reasoning (``<think>...</think>``) and the rendered
   tool calls; the special token that opens the following footer
   (``<|im_end|>``, ``<|eot_id|>``, or GLM's next role marker) is the
   end-of-turn token and is supervised with it. Role headers never are.
4. The text is tokenized once, batched, and each character span is mapped to
   tokens through the token offsets (``searchsorted``): a token is supervised
   when it overlaps a span, the convention of ``return_assistant_tokens_mask``.
   Byte-level BPE tokenizers that tiktoken reproduces (SmolLM2, Qwen3;
   :mod:`packing.bpe`) are encoded by tiktoken (the same ids with 5-7x less
   CPU than the Hugging Face encoder; offsets in UTF-8 bytes); every other
   tokenizer, and any row tiktoken cannot take, by the fast tokenizer's
   ``encode_batch`` (character offsets).

Because both renderings are of the whole conversation, a template that drops
earlier turns' reasoning (Qwen3 renders ``<think>`` only after the last user
query) renders the same skeleton, and the mask follows what ``text`` really
holds: it cannot shift into a user turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from corpora.chat import to_chat
from packing.bpe import FastBPE, fast_bpe

#: SmolLM2's own ChatML template with ``{% generation %}`` markers around what the assistant
#: produces: the reference ``apply_chat_template(..., return_assistant_tokens_mask=True)`` needs
#: them (tests and ``benchmarks/packing.py`` compare :class:`ChatTokenizer` masks against it).
CHATML_GENERATION = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SENTINEL = "\ue000{}\ue001"  # private-use code points: never produced by a template


class TemplateError(ValueError):
    """A row cannot be rendered or its assistant spans cannot be located.

    ``reason`` is a short stable key (the rejects' ``reason`` column).
    """

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class TokenizedDoc:
    """One tokenized conversation.

    Attributes:
        uuid: the SFT row's ``uuid`` (``<uuid>#<k>`` for the k-th piece of a split row).
        input_ids: int32 [n] token ids of the rendered conversation.
        loss_mask: int8 [n], 1 on supervised (assistant) tokens.
        turn_ends: token index just past each assistant turn's end-of-turn token.
        reasoning_dropped: assistant turns whose ``reasoning_content`` the template did not render.
    """

    uuid: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    turn_ends: list[int] = field(default_factory=list)
    reasoning_dropped: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)


class ChatTokenizer:
    """Render + tokenize SFT rows with assistant-only ``loss_mask``.

    Args:
        tokenizer: a Hugging Face fast tokenizer with a chat template.
        chat_template: overrides the tokenizer's template when given.
        use_tiktoken: encode with :func:`packing.bpe.fast_bpe` when it reproduces the tokenizer.
        threads: tiktoken encoding threads (default: the CPUs this process may use).
        check_every: re-encode every ``check_every``-th tiktoken-encoded row with the Hugging Face
            encoder and compare the ids (0: never). tiktoken merges by token rank, Hugging Face by
            merge rank; they agree on every real row tested, and this keeps checking it. Rows are
            counted across calls, or, when :meth:`tokenize` is given ``positions``, a row is checked
            when its position is a multiple of ``check_every`` (the same rows however a table is
            batched or spread over workers).

    Raises:
        ValueError: when the tokenizer is not a fast one (no offsets) or its
            template has no assistant generation prompt.
        RuntimeError: (from :meth:`tokenize`) a checked row's tiktoken ids differ from the Hugging
            Face encoder's, naming the row's uuid and the first differing token.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None, *, use_tiktoken: bool = True,
                 threads: int | None = None, check_every: int = 0):
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer: character offsets are needed")
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        probe = [{"role": "user", "content": SENTINEL.format("probe")}]
        bare, prompted = self.render(probe, None), self.render(probe, None, add_generation_prompt=True)
        if not prompted.startswith(bare) or prompted == bare:
            raise ValueError("the chat template renders no assistant header with add_generation_prompt=True")
        self.header = prompted[len(bare):]
        # special tokens that may close a turn, longest first (so "<|im_end|>" wins over "<|im")
        self.end_tokens = sorted({t.content for t in tokenizer.added_tokens_decoder.values() if t.special},
                                 key=len, reverse=True)
        self.fast: FastBPE | None = fast_bpe(tokenizer, threads) if use_tiktoken else None
        self.check_every, self.checked, self._fast_rows = check_every, 0, 0

    def render(self, chat: list[dict], tools: list[dict] | None, add_generation_prompt: bool = False) -> str:
        """The conversation as text, exactly as ``apply_chat_template(tokenize=False)`` renders it."""
        return self.tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, chat_template=self.chat_template,
                                                  add_generation_prompt=add_generation_prompt)

    def spans(self, chat: list[dict], tools: list[dict] | None) -> tuple[str, list[tuple[int, int]], int]:
        """Render ``chat`` and locate each assistant turn's supervised characters.

        Returns:
            ``(text, spans, reasoning_dropped)``: ``spans`` are ``[start, end)``
            character ranges of ``text``, one per assistant turn, in order; each
            covers the payload and the end-of-turn token.

        Raises:
            TemplateError: ``template_error`` (the template raised),
                ``template_structure`` (spans cannot be located), ``content_not_rendered``,
                ``tool_calls_not_rendered``, ``sentinel_in_text``.
        """
        turns = [i for i, m in enumerate(chat) if m["role"] == "assistant"]
        if not turns:
            raise TemplateError("no_assistant_turn")
        skeleton_chat = list(chat)
        for j, i in enumerate(turns):
            skeleton_chat[i] = {"role": "assistant", "content": SENTINEL.format(j)}
        try:
            text = self.render(chat, tools)
            skeleton = self.render(skeleton_chat, tools)
        except Exception as exc:  # noqa: BLE001 -- jinja raises anything (TemplateError, TypeError, its own exceptions)
            raise TemplateError("template_error", f"{type(exc).__name__}: {exc}") from None
        if "\ue000" in text:
            raise TemplateError("sentinel_in_text", "the conversation contains U+E000")
        segments = _split_skeleton(skeleton, len(turns))
        spans, cursor, reasoning_dropped = [], 0, 0
        starts = []
        for j, seg in enumerate(segments[:-1]):
            cut = seg.rfind(self.header)
            if cut < 0:
                raise TemplateError("template_structure", f"no assistant header before assistant turn {j}")
            lead = seg[:cut + len(self.header)]
            pos = text.find(lead, cursor) if j else (0 if text.startswith(lead) else -1)
            if pos < 0:
                raise TemplateError("template_structure", f"assistant turn {j}: surrounding text not found")
            if j:
                starts.append(pos)  # end of the previous payload
            cursor = pos + len(lead)
            starts.append(cursor)
        tail = segments[-1]
        if not text.endswith(tail) or len(text) - len(tail) < cursor:
            raise TemplateError("template_structure", "text after the last assistant turn not found")
        starts.append(len(text) - len(tail))
        for j, i in enumerate(turns):
            ps, pe = starts[2 * j], starts[2 * j + 1]
            payload, msg = text[ps:pe], chat[i]
            content = (msg.get("content") or "").strip()
            if content and content not in payload:
                raise TemplateError("content_not_rendered", f"assistant turn {j} (message {i})")
            for call in msg.get("tool_calls") or []:
                if call["function"]["name"] not in payload:
                    raise TemplateError("tool_calls_not_rendered", f"assistant turn {j} (message {i})")
            reasoning = (msg.get("reasoning_content") or "").strip()
            reasoning_dropped += bool(reasoning) and reasoning not in payload
            end = next((pe + len(t) for t in self.end_tokens if text.startswith(t, pe)), pe)
            spans.append((ps, end))
        return text, spans, reasoning_dropped

    def _check(self, rows: list[dict[str, Any]], texts: list[str], fast: list[Any],
               positions: list[int] | None) -> None:
        """Compare every ``check_every``-th tiktoken encoding (by ``positions`` when given, else by
        the count of tiktoken rows so far) with the Hugging Face encoder's ids."""
        picked = []
        for i, (row, text, enc) in enumerate(zip(rows, texts, fast, strict=True)):
            if enc is not None:
                if (self._fast_rows if positions is None else positions[i]) % self.check_every == 0:
                    picked.append((row, text, enc[0]))
                self._fast_rows += positions is None
        hf = self.tokenizer.backend_tokenizer.encode_batch([t for _, t, _ in picked], add_special_tokens=False)
        for (row, _, ids), ref in zip(picked, hf, strict=True):
            ref_ids = np.asarray(ref.ids, dtype=np.int32)
            if not np.array_equal(ids, ref_ids):
                at = next((i for i, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), min(len(ids), len(ref_ids)))
                raise RuntimeError(f"row {row.get('uuid')!r}: tiktoken ids differ from the Hugging Face encoder's "
                                   f"at token {at}; set tokenize.encoder: hf")
        self.checked += len(picked)

    def tokenize(self, rows: Sequence[dict[str, Any]],
                 positions: Sequence[int] | None = None) -> list[TokenizedDoc | TemplateError]:
        """Tokenize a batch of SFT rows (``uuid``, ``messages``, ``tools``) in one fast-tokenizer call.

        ``positions`` (one int per row, e.g. the rows' positions in their table) pick the rows
        cross-checked against the Hugging Face encoder (``check_every``) instead of a running count.

        Returns one item per row: a :class:`TokenizedDoc`, or the
        :class:`TemplateError` saying why the row cannot be used
        (``no_supervised_tokens`` when the mask would be all zero).
        """
        rendered: list[tuple[str, list[tuple[int, int]], int] | TemplateError] = []
        for row in rows:
            try:
                rendered.append(self.spans(*to_chat(row["messages"], row.get("tools"))))
            except TemplateError as exc:
                rendered.append(exc)
            except (KeyError, TypeError, json.JSONDecodeError) as exc:
                rendered.append(TemplateError("bad_row", f"{type(exc).__name__}: {exc}"))
        texts = [r[0] for r in rendered if not isinstance(r, TemplateError)]
        fast = self.fast.encode_batch(texts) if self.fast else [None] * len(texts)
        if self.check_every:
            ok = [i for i, r in enumerate(rendered) if not isinstance(r, TemplateError)]
            self._check([rows[i] for i in ok], texts, fast, None if positions is None else [positions[i] for i in ok])
        slow = iter(self.tokenizer.backend_tokenizer.encode_batch(
            [t for t, f in zip(texts, fast, strict=True) if f is None], add_special_tokens=False))
        encoded = iter(fast)
        out: list[TokenizedDoc | TemplateError] = []
        for row, r in zip(rows, rendered, strict=True):
            if isinstance(r, TemplateError):
                out.append(r)
                continue
            text, spans, reasoning_dropped = r
            enc = next(encoded)
            if enc is not None:  # tiktoken: byte offsets
                ids, bounds = enc
                starts, ends, spans = bounds[:-1], bounds[1:], _to_bytes(text, spans)
            else:  # Hugging Face: character offsets
                hf = next(slow)
                ids, offsets = np.asarray(hf.ids, dtype=np.int32), np.asarray(hf.offsets, dtype=np.int64).reshape(-1, 2)
                starts, ends = offsets[:, 0], offsets[:, 1]
            mask, turn_ends = _mask_from_spans(starts, ends, spans)
            out.append(TokenizedDoc(row["uuid"], ids, mask, turn_ends, reasoning_dropped) if mask.any()
                       else TemplateError("no_supervised_tokens"))
        return out


def _split_skeleton(skeleton: str, n: int) -> list[str]:
    """The ``n + 1`` pieces of ``skeleton`` around sentinels ``0..n-1``."""
    pieces, cursor = [], 0
    for j in range(n):
        s = SENTINEL.format(j)
        pos = skeleton.find(s, cursor)
        if pos < 0:
            raise TemplateError("template_structure", f"the template does not render assistant content {j} verbatim")
        pieces.append(skeleton[cursor:pos])
        cursor = pos + len(s)
    pieces.append(skeleton[cursor:])
    return pieces


def _to_bytes(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character spans of ``text`` (in order, not overlapping) as UTF-8 byte spans."""
    if text.isascii():
        return spans
    out, char, byte = [], 0, 0
    for start, end in spans:
        byte += len(text[char:start].encode("utf-8"))
        first = byte
        byte += len(text[start:end].encode("utf-8"))
        char = end
        out.append((first, byte))
    return out


def _mask_from_spans(starts: np.ndarray, ends: np.ndarray, spans: list[tuple[int, int]]) -> tuple[np.ndarray, list[int]]:
    """int8 [n] mask of the tokens overlapping ``spans``, and the index just past each span's last token.

    ``starts``/``ends``: int64 [n] token offsets, non-decreasing, in the unit of ``spans``.
    """
    mask = np.zeros(len(starts), dtype=np.int8)
    first = np.searchsorted(ends, [s for s, _ in spans], side="right")  # first token ending after the start
    past = np.searchsorted(starts, [e for _, e in spans], side="left")  # first token starting at/after the end
    turn_ends: list[int] = []
    for (start, end), t0, t1 in zip(spans, first.tolist(), past.tolist(), strict=True):
        if end <= start:
            turn_ends.append(turn_ends[-1] if turn_ends else 0)
            continue
        mask[t0:t1] = 1
        turn_ends.append(t1)
    return mask, turn_ends


def iter_tokenized(chat_tokenizer: ChatTokenizer, rows: Iterator[dict[str, Any]] | Sequence[dict[str, Any]],
                   batch_rows: int = 256) -> Iterator[tuple[dict[str, Any], TokenizedDoc | TemplateError]]:
    """Yield ``(row, result)`` for every row, tokenizing ``batch_rows`` at a time."""
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == batch_rows:
            yield from zip(batch, chat_tokenizer.tokenize(batch), strict=True)
            batch = []
    if batch:
        yield from zip(batch, chat_tokenizer.tokenize(batch), strict=True)

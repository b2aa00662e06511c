"""Load a release back with the messages' key sets of its source rows.

Parquet stores each message as an Arrow struct, so ``datasets.load_dataset`` gives every message
every key of :data:`corpora.schema.MESSAGE_TYPE`: a plain user turn comes back with
``reasoning_content``, ``tool_calls`` and ``tool_call_id`` set to ``None``. A chat template that
tests a key's presence (``{% if 'tool_calls' in message %}``) then renders differently from the
source row, or fails iterating ``None``.

The canonical schema makes null mean absent for exactly those optional keys: ``role`` and
``content`` are required strings (adapters turn a null ``content`` into ``""``), every key of a
tool call is required, and :func:`corpora.schema.validate_row` stores an absent optional key as
null, so an explicit null and an absent key are one canonical row (``corpora.chat.to_chat``
trains on it with nulls dropped). Tool schemas (``tools``) and tool-call ``arguments`` are JSON
strings and come back byte for byte. :func:`drop_absent_keys` is therefore an exact inverse of the
padding; its source is printed in each release's dataset card so that the card's snippet works
without cascade-rl installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def drop_absent_keys(batch):
    """Drop the null optional keys Arrow added to each message (a ``datasets`` transform).

    ``batch`` maps column names to lists of values (SFT ``messages``, RL
    ``responses_create_params.input``); other columns pass unchanged.
    """
    optional = ("reasoning_content", "tool_calls", "tool_call_id")

    def exact(messages):
        return [{k: v for k, v in m.items() if v is not None or k not in optional} for m in messages]

    if "messages" in batch:
        batch["messages"] = [exact(m) for m in batch["messages"]]
    if "responses_create_params" in batch:
        batch["responses_create_params"] = [{**p, "input": exact(p["input"])}
                                            for p in batch["responses_create_params"]]
    return batch


def load_release(path: str | Path, config: str, split: str | None = None) -> Any:
    """A release config as ``datasets`` objects whose rows equal the source rows, key sets included.

    Args:
        path: a release directory (``release/sft``) or a Hub dataset id.
        config: a config of the release (an SFT domain, an RL set).
        split: one split (a ``datasets.Dataset``), or None for all (a ``datasets.DatasetDict``).

    Rows read by indexing, iteration, column access or ``map`` pass :func:`drop_absent_keys`;
    ``to_list()``/``to_pandas()`` and what ``map`` writes are Arrow again (null-padded).

    Raises:
        ValueError / FileNotFoundError: from ``datasets.load_dataset`` for an unknown config,
        split or path.
    """
    from datasets import load_dataset

    return load_dataset(str(path), config, split=split).with_transform(drop_absent_keys)

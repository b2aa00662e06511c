"""Small canonical tables for tests."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from corpora.schema import RL_SCHEMA, SFT_SCHEMA


def sft_table(users: list[str], **fields: list[Any]) -> pl.DataFrame:
    """One SFT row per user text (answer 'ok'), uuids ``s0, s1, ...``; ``fields`` override columns."""
    rows = [{"uuid": f"s{i}", "messages": [{"role": "user", "content": u}, {"role": "assistant", "content": "ok"}],
             "tools": "[]", "domain": "chat", "source": "train_src", "source_version": "1",
             "license": "MIT", "metadata": "{}"} for i, u in enumerate(users)]
    for key, values in fields.items():
        for row, v in zip(rows, values, strict=True):
            row[key] = v
    return pl.from_arrow(pa.Table.from_pylist(rows, schema=SFT_SCHEMA))


def rl_table(prompts: list[str], source: str = "bench", prefix: str = "b", **fields: list[Any]) -> pl.DataFrame:
    """One RL row per prompt, uuids ``<prefix>0, ...``."""
    rows = [{"uuid": f"{prefix}{i}", "domain": "math", "agent_ref": "math",
             "responses_create_params": {"input": [{"role": "user", "content": p}], "tools": "[]"},
             "ground_truth": '{"answer": "1"}', "source": source, "source_version": "1",
             "license": "MIT", "metadata": "{}"} for i, p in enumerate(prompts)]
    for key, values in fields.items():
        for row, v in zip(rows, values, strict=True):
            row[key] = v
    return pl.from_arrow(pa.Table.from_pylist(rows, schema=RL_SCHEMA))


class StartsWith:
    """Reward 1 when the response starts with ``text``."""

    def __init__(self, text):
        self.text = text

    def score(self, responses, rows):
        return [(float(r.startswith(self.text)), r.startswith(self.text)) for r in responses]

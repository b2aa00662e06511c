"""The ``tokenize`` and ``pack`` blocks of ``params.yaml`` (:mod:`packing.steps` runs them; assembled with
the other blocks by :mod:`curation.params`). Light on purpose: validating params imports no tokenizer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TokenizeParams(BaseModel):
    """``params.yaml: tokenize``: the tokenizer dir (a fast tokenizer with a chat template) and an
    optional template overriding its own; conversations longer than ``max_length`` tokens are handled by
    ``overflow`` (``reject`` | ``truncate`` | ``split`` at user turns, :mod:`packing.overflow`); rows per
    batch; ``encoder`` ``auto`` (tiktoken where it reproduces the tokenizer, :mod:`packing.bpe`) | ``hf``;
    every ``check_every``-th tiktoken row re-encoded by the HF encoder (0: never)."""

    model_config = ConfigDict(extra="forbid")
    tokenizer: str
    chat_template: str | None = None
    max_length: int = Field(262144, ge=1)
    overflow: Literal["reject", "truncate", "split"] = "reject"
    batch_rows: int = Field(256, ge=1)
    encoder: Literal["auto", "hf"] = "auto"
    check_every: int = Field(50, ge=0)


class PackParams(BaseModel):
    """``params.yaml: pack``: tokens per pack, packs padded to a multiple of ``pad_to_multiple_of`` (1:
    off), packs per parquet row group, documents planned at once (``plan_documents``: a split up to that
    size is one global best-fit-decreasing plan; a larger one is planned in windows of it, in file order,
    so memory holds one window's plan, ~40 bytes a document)."""

    model_config = ConfigDict(extra="forbid")
    pack_length: int = Field(262144, ge=1)
    pad_to_multiple_of: int = Field(1, ge=1)
    packs_per_row_group: int = Field(8, ge=1)
    plan_documents: int = Field(1 << 20, ge=1)

"""Text normalization and row text shared by dedup and decontamination.

Normalization (the documented one, see the DEDUP-02 case): Unicode NFKC, then
lowercase, then every whitespace run collapsed to one space, then both ends
stripped. ``'Café'`` (composed) and ``'Cafe\u0301'`` (decomposed) normalize
alike; so do ``'Solve  for x'`` and ``'SOLVE FOR X\n'``.

All functions are polars expressions so that steps work column-wise.
"""

from __future__ import annotations

import duckdb
import polars as pl


def normalize(expr: pl.Expr) -> pl.Expr:
    """NFKC + lowercase + collapse whitespace + strip, on a string expression."""
    return (expr.str.normalize("NFKC").str.to_lowercase()
            .str.replace_all(r"\s+", " ").str.strip_chars())


def _messages_text(col: pl.Expr, roles: tuple[str, ...] | None) -> pl.Expr:
    el = pl.element()
    text = el.struct.field("role") + pl.lit(": ") + el.struct.field("content")
    if roles is not None:
        text = pl.when(el.struct.field("role").is_in(list(roles))).then(el.struct.field("content"))
    return col.list.eval(text.drop_nulls()).list.join("\n")


def messages_column(kind: str) -> pl.Expr:
    """The message list of a table: ``messages`` (sft) or ``responses_create_params.input`` (rl)."""
    if kind == "sft":
        return pl.col("messages")
    return pl.col("responses_create_params").struct.field("input")


def row_text(kind: str) -> pl.Expr:
    """Text that identifies a row for exact dedup.

    SFT: every turn as ``role: content`` joined by newlines (the whole conversation).
    RL: the prompt turns the same way (the policy sees only the prompt).
    """
    return _messages_text(messages_column(kind), None)


def user_text(kind: str) -> pl.Expr:
    """All user turns of a row joined by newlines (what decontamination matches)."""
    return _messages_text(messages_column(kind), ("user",))


def item_text(kind: str) -> pl.Expr:
    """The text that identifies a row's task for decontamination: ``metadata.question``
    when an adapter wrapped the item in an instruction template (math, multiple
    choice, code, synthesized IF constraints), else all user turns."""
    return pl.coalesce(pl.col("metadata").str.json_path_match("$.question"), user_text(kind))


def md5_hex(values: pl.Series, salt: str = "") -> pl.Series:
    """md5 hex digest of ``salt + value`` for each string (stable across runs and versions)."""
    frame = pl.DataFrame({"v": values.cast(pl.Utf8)}).select((pl.lit(salt) + pl.col("v")).alias("v"))
    with duckdb.connect() as con:  # a private in-memory connection: safe from worker threads
        return con.from_arrow(frame.to_arrow()).select("md5(v) AS h").pl()["h"].alias(values.name)

"""Text normalization and row text shared by dedup and decontamination.

Normalization (the documented one, see the DEDUP-02 case): Unicode NFKC, then
lowercase, then every whitespace run collapsed to one space, then both ends
stripped. ``'Café'`` (composed) and ``'Cafe\u0301'`` (decomposed) normalize
alike; so do ``'Solve  for x'`` and ``'SOLVE FOR X\n'``.

The functions are polars expressions so that steps work column-wise, except
:func:`item_texts` (a whole series: it reads JSON with DuckDB).
"""

from __future__ import annotations

import os

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
    RL: the prompt turns the same way (the policy sees only the prompt); for a row played as a
    multi-turn episode (its ``agent_ref`` names an episode environment: :func:`validators.episodes.is_episodic`)
    the ``ground_truth`` follows, since its later user turns and initial state are part of the task
    (BFCL's categories share first turns).
    """
    prompt = _messages_text(messages_column(kind), None)
    if kind == "sft":
        return prompt
    from common import plugins

    episodic = plugins.names("episode_environments")
    return pl.when(pl.col("agent_ref").is_in(episodic)).then(
        pl.concat_str([prompt, pl.col("ground_truth")], separator="\n")).otherwise(prompt)


def user_text(kind: str) -> pl.Expr:
    """All user turns of a row joined by newlines (the prompt side decontamination matches)."""
    return _messages_text(messages_column(kind), ("user",))


def answer_text(kind: str) -> pl.Expr:
    """All assistant turns of a row joined by newlines, each as its ``reasoning_content`` then its
    ``content`` (the answer side decontamination matches; empty for a row without one)."""
    el = pl.element()
    turn = pl.when(el.struct.field("role") == "assistant").then(
        pl.concat_str([el.struct.field("reasoning_content"), el.struct.field("content")], separator="\n",
                      ignore_nulls=True))
    return messages_column(kind).list.eval(turn.drop_nulls()).list.join("\n").fill_null("")


def item_texts(frame: pl.DataFrame, kind: str) -> pl.Series:
    """The text that identifies each row's task for decontamination (Utf8, one per row of
    ``frame``, schema ``kind``): ``metadata.question`` when an adapter wrapped the item in an
    instruction template (math, multiple choice, code, synthesized IF constraints), else all
    user turns (:func:`user_text`).

    ``metadata.question`` is read by DuckDB's ``json_extract_string`` (about half the CPU of
    polars' ``json_path_match`` on the RL table, same values: numbers and objects as their JSON
    text, null when absent or when the metadata is not an object).
    """
    question = _duckdb_column(frame.select("metadata"), "json_extract_string(metadata, '$.question')")
    return frame.select(pl.coalesce(pl.lit(question), user_text(kind)).alias("item_text"))["item_text"]


def md5_hex(values: pl.Series, salt: str = "") -> pl.Series:
    """md5 hex digest of ``salt + value`` for each string (stable across runs and versions)."""
    frame = pl.DataFrame({"v": values.cast(pl.Utf8)}).select((pl.lit(salt) + pl.col("v")).alias("v"))
    return _duckdb_column(frame, "md5(v)").alias(values.name)


def md5_halves(digest: pl.Series) -> pl.Series:
    """An md5 hex digest series (:func:`md5_hex`) as a struct of its high and low 64 bits (UInt64 ``hi``,
    ``lo``): 16 bytes a row instead of a 32-character string, equal where the digests are, and sorted as
    they are."""
    half = {k: digest.str.slice(i, 16).str.to_integer(base=16, dtype=pl.UInt64) for k, i in (("hi", 0), ("lo", 16))}
    return pl.select(pl.struct(**half).alias(digest.name)).to_series()


_DB: tuple[int, duckdb.DuckDBPyConnection] | None = None


def _duckdb_column(frame: pl.DataFrame, expr: str) -> pl.Series:
    """DuckDB's SQL expression ``expr`` over the columns of ``frame``, one value per row.

    Runs on a cursor of one in-memory database per process (opening a database costs ~20 ms of
    CPU, a cursor nothing; a cursor per call is safe from worker threads). Arrow in and out
    (DuckDB's ``.pl()`` conversion costs more than the query here).
    """
    global _DB
    if _DB is None or _DB[0] != os.getpid():  # a forked child opens its own
        _DB = (os.getpid(), duckdb.connect())
    with _DB[1].cursor() as cur:
        result = cur.from_arrow(frame.to_arrow()).select(f"{expr} AS x").arrow().read_all()
    return pl.from_arrow(result)["x"]


def text_hashes(df: pl.DataFrame, kind: str, normalized: bool = True) -> pl.Series:
    """md5 hex digest of each row's (normalized) text, as a Utf8 series of ``len(df)``."""
    text = row_text(kind)
    return md5_hex(df.select((normalize(text) if normalized else text).alias("t"))["t"])

"""Each row of a polars frame as a JSON object, in polars expressions: the bytes of ``json.dumps``.

A rejects file keeps every rejected record as ``json.dumps(row, ensure_ascii=False)`` of the row's
dict (:class:`common.io.Rejects`). Encoding row by row in Python cost ~90 µs a record (``to_dicts``,
the encoder, the record's dict): at 16x the default data, export's 313K refused rows took 28 of its
50 s. :func:`json_rows` builds the same strings column-wise: strings escaped as CPython's encoder
escapes them with ``ensure_ascii=False`` (``\\\\``, ``\\"``, ``\\b \\f \\n \\r \\t``, the other
characters below U+0020 as ``\\u00xx``; everything else as is), ``", "`` and ``": "`` separators,
``null`` for a null at any depth, integers and booleans as Python prints them, and floats through
Python's own ``json.dumps`` (its ``repr``, ``NaN``, ``Infinity``), one value at a time.
"""

from __future__ import annotations

import json

import polars as pl

#: The characters ``json.dumps(..., ensure_ascii=False)`` escapes, with their escapes (CPython's
#: ``json.encoder.ESCAPE_DCT``).
ESCAPES = [("\\", "\\\\"), ('"', '\\"'), ("\b", "\\b"), ("\f", "\\f"), ("\n", "\\n"), ("\r", "\\r"),
           ("\t", "\\t")] + [(chr(c), f"\\u{c:04x}") for c in range(0x20) if chr(c) not in "\b\f\n\r\t"]


class Unencodable(TypeError):
    """A dtype :func:`json_rows` has no column-wise encoding for (the caller encodes row by row)."""


def _string(expr: pl.Expr) -> pl.Expr:
    """``expr`` (String) as JSON string literals; null stays null. One pass of ``replace_many``
    (Aho-Corasick, non-overlapping): an escape's backslash is not escaped again."""
    escaped = expr.str.replace_many([c for c, _ in ESCAPES], [e for _, e in ESCAPES])
    return pl.concat_str([pl.lit('"'), escaped, pl.lit('"')])


def _object(members: list[tuple[str, pl.Expr]]) -> pl.Expr:
    """``{"name": value, ...}`` of JSON-text expressions, with ``json.dumps``' separators."""
    parts: list[pl.Expr] = []
    for i, (name, value) in enumerate(members):
        parts += [pl.lit(("{" if i == 0 else ", ") + json.dumps(name, ensure_ascii=False) + ": "), value]
    return pl.concat_str(parts + [pl.lit("}")]) if parts else pl.lit("{}")


def _value(expr: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """``expr`` of ``dtype`` as JSON text, ``null`` for null. Raises :class:`Unencodable` for a float
    (encoded in Python, at the top level only) or a dtype outside strings, integers, booleans, nulls,
    lists and structs of them."""
    if dtype == pl.String or isinstance(dtype, (pl.Categorical, pl.Enum)):
        text = _string(expr.cast(pl.String))
    elif dtype.is_integer():
        text = expr.cast(pl.String)
    elif dtype == pl.Boolean:
        text = pl.when(expr).then(pl.lit("true")).otherwise(pl.lit("false"))
    elif dtype == pl.Null:
        return pl.lit("null")
    elif isinstance(dtype, pl.List):
        inner = _value(pl.element(), dtype.inner)
        text = pl.concat_str([pl.lit("["), expr.list.eval(inner).list.join(", "), pl.lit("]")])
    elif isinstance(dtype, pl.Struct):
        text = _object([(f.name, _value(expr.struct.field(f.name), f.dtype)) for f in dtype.fields])
    else:
        raise Unencodable(f"no column-wise JSON encoding for dtype {dtype}")
    return pl.when(expr.is_null()).then(pl.lit("null")).otherwise(text)


def json_rows(frame: pl.DataFrame) -> pl.Series:
    """``[json.dumps(row, ensure_ascii=False) for row in frame.to_dicts()]`` as a String series (same
    length as ``frame``), built column by column.

    Raises:
        Unencodable: for a column (or a nested field) of a dtype other than strings, categoricals,
            integers, booleans, nulls, lists and structs of them, and floats at the top level.
    """
    if not frame.columns:
        return pl.Series("record", ["{}"] * len(frame), dtype=pl.String)

    def value(name: str, dtype: pl.DataType) -> pl.Expr:  # floats: Python's repr, NaN, Infinity, one at a time
        if dtype.is_float():
            return pl.lit(pl.Series([json.dumps(v) for v in frame[name].to_list()], dtype=pl.String))
        return _value(pl.col(name), dtype)

    members = [(name, value(name, dtype)) for name, dtype in frame.schema.items()]
    return frame.select(_object(members).alias("record")).to_series()

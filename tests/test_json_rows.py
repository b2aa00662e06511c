"""Rows as JSON column-wise: the bytes of ``json.dumps(row, ensure_ascii=False)``, attacks included."""

from __future__ import annotations

import datetime
import json
import math
import random

import polars as pl
import pyarrow as pa
import pytest

from common.json_rows import ESCAPES, Unencodable, json_rows
from corpora.schema import RL_SCHEMA, SFT_SCHEMA

# every character json.dumps escapes, the ones it must not (DEL, U+2028, non-BMP, '/'), and escapes
# that look already escaped (a backslash before a quote or a 'u')
ALPHABET = [c for c, _ in ESCAPES] + ["a", " ", "é", "\x7f", "\u2028", "\U0001f600", "/", '\\"', "\\u0041", "{", "}"]


def _text(rng: random.Random) -> str | None:
    return None if rng.random() < 0.1 else "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8)))


def _value(rng: random.Random, dtype: pa.DataType):
    """A random value of ``dtype``, nulls and empty lists at every depth."""
    if rng.random() < 0.1:
        return None
    if pa.types.is_list(dtype):
        return [_value(rng, dtype.value_type) for _ in range(rng.randint(0, 3))]
    if pa.types.is_struct(dtype):
        return {f.name: _value(rng, f.type) for f in dtype}
    if pa.types.is_floating(dtype):
        return rng.choice([0.0, -0.0, 0.1, 1.0, 1e-5, 1e16, 123456789.123, math.nan, math.inf, -math.inf])
    if pa.types.is_integer(dtype):
        return rng.choice([0, -1, 7, 2**62])
    return _text(rng)


@pytest.mark.parametrize("schema", [SFT_SCHEMA, RL_SCHEMA], ids=["sft", "rl"])
def test_random_rows_of_both_schemas_encode_as_json_dumps_does(schema):
    rng = random.Random(0)
    rows = [{f.name: _value(rng, f.type) for f in schema} for _ in range(400)]
    frame = pl.from_arrow(pa.Table.from_pylist(rows, schema=schema))
    assert json_rows(frame).to_list() == [json.dumps(r, ensure_ascii=False) for r in frame.to_dicts()]


def test_escapes_are_not_escaped_twice_and_other_types_encode_like_python():
    frame = pl.DataFrame({"s": ['a\\"b', "\\u0041", "\x00\x1f\x7f", None], "b": [True, False, None, True],
                          "n": [None, None, None, None], "i": [0, -3, None, 2**40],
                          "c": pl.Series(["x", "y", None, "x"], dtype=pl.Categorical)})
    expected = [json.dumps(r, ensure_ascii=False) for r in frame.to_dicts()]
    assert json_rows(frame).to_list() == expected
    assert expected[0] == '{"s": "a\\\\\\"b", "b": true, "n": null, "i": 0, "c": "x"}'
    assert json.loads(json_rows(frame)[2])["s"] == "\x00\x1f\x7f"


def test_a_dtype_without_a_columnwise_encoding_is_refused_not_guessed():
    with pytest.raises(Unencodable, match="Date"):
        json_rows(pl.DataFrame({"d": [datetime.date(2026, 1, 1)]}))
    with pytest.raises(Unencodable, match="Float64"):  # a float inside a list: only top-level floats
        json_rows(pl.DataFrame({"f": [[0.1]]}))


@pytest.mark.parametrize("frame", [
    pl.DataFrame({"a": pl.Series([[None, None], [], None], dtype=pl.List(pl.Null))}),
    pl.DataFrame({"a": [[[1, 2], [], None], None, [[None]]], "b": [[True, None], [], None]}),
    pl.DataFrame({"a": pl.Series([2**64 - 1, 0, None], dtype=pl.UInt64),
                  "f": pl.Series([0.1, None, 2.5], dtype=pl.Float32)}),
    pl.DataFrame({'k"\n': ["v"], "é": [None]}),
    pl.DataFrame({"a": pl.Series([], dtype=pl.String)}),
], ids=["list_of_nulls", "nested_lists", "u64_and_f32", "keys_escaped", "no_rows"])
def test_edge_dtypes_and_keys_encode_as_json_dumps_does(frame):
    assert json_rows(frame).to_list() == [json.dumps(r, ensure_ascii=False) for r in frame.to_dicts()]

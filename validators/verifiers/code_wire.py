"""Plain-data wire format between the code grader and the solution process (standard library only;
shipped into both sandboxes as a file, and imported by the host for the same rules).

Only builtin data crosses: ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``,
``list``, ``tuple``, ``dict``, ``set``, ``frozenset``, as one JSON line. JSON objects are reserved for
tags, so a decoded value is always a real builtin built by :func:`decode` (never an object the
solution made: a rigged ``__eq__``, ``__hash__`` or ``__bool__`` cannot cross)::

    [1, 2]                      list             {"$t": [1, 2]}           tuple
    {"$d": [[k, v], ...]}       dict             {"$s": [...]}            set
    {"$f": [...]}               frozenset        {"$b": "<base64>"}       bytes
    {"$c": [re, im]}            complex          {"$x": "nan"|"inf"|"-inf"} float
    {"$i": "<hex>"}             int of 16+ digits (hex: no 4,300-digit str limit)
    {"$h": n}                   handle: an object of the solution process kept there by number

Encoding (done in the solution process, so it is the solution's claim of its value, nothing more)
converts subclasses to their base (a namedtuple is a tuple, a Counter a dict); anything else, or a
structure deeper than :data:`MAX_DEPTH`, is not plain data (:class:`WireError`) unless ``handles``
is given, where it becomes a handle. Decoding refuses unknown tags and unhashable set members.

>>> decode(encode({(1, 2): {3.5, float("inf")}, "b": b"x"}))
{(1, 2): {3.5, inf}, 'b': b'x'}
"""

import base64
import json
import math

MAX_DEPTH = 100
_BIG = 1 << 53


class WireError(ValueError):
    """A value that is not plain data, or a message that is not well formed."""


class Handle:
    """Grader-side stand-in for an object that lives in the solution process (number ``ref``):
    it can be passed back into calls; it equals only itself."""

    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref

    def __repr__(self):
        return f"<solution object #{self.ref}>"


def to_json(value, handles=None, depth=0):
    """The JSON-able form of ``value`` (see the module doc); ``handles`` is the solution side's
    list of kept objects (non-plain values are appended there), or None to refuse them."""
    if depth > MAX_DEPTH:
        raise WireError("structure nested too deeply")
    if value is None or value is True or value is False or type(value) is str:
        return value
    if isinstance(value, Handle):
        return {"$h": value.ref}
    if isinstance(value, bool):
        return bool.__bool__(value)
    if isinstance(value, int):
        n = int.__index__(value)
        return n if -_BIG < n < _BIG else {"$i": hex(n)}
    if isinstance(value, float):
        x = float.__float__(value)
        return x if math.isfinite(x) else {"$x": repr(x)}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, complex):
        return {"$c": [to_json(value.real), to_json(value.imag)]}
    if isinstance(value, list):
        return [to_json(v, handles, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"$t": [to_json(v, handles, depth + 1) for v in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"$d": [[to_json(k, handles, depth + 1), to_json(v, handles, depth + 1)]
                       for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"$f": [to_json(v, handles, depth + 1) for v in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"$s": [to_json(v, handles, depth + 1) for v in set.__iter__(value)]}
    if handles is None:
        raise WireError(f"a {type(value).__name__} is not plain data")
    handles.append(value)
    return {"$h": len(handles) - 1}


def from_json(obj, depth=0):
    """The builtin value of a JSON form made by :func:`to_json` (handles become :class:`Handle`).

    Raises:
        WireError: an unknown tag, a malformed tagged value, unhashable set members or keys.
    """
    if depth > MAX_DEPTH:
        raise WireError("structure nested too deeply")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [from_json(v, depth + 1) for v in obj]
    if not isinstance(obj, dict) or len(obj) != 1:
        raise WireError("malformed value")
    (tag, body), = obj.items()
    try:
        if tag == "$t":
            return tuple(from_json(v, depth + 1) for v in _list(body))
        if tag == "$d":
            return {from_json(k, depth + 1): from_json(v, depth + 1) for k, v in _list(body)}
        if tag == "$s":
            return {from_json(v, depth + 1) for v in _list(body)}
        if tag == "$f":
            return frozenset(from_json(v, depth + 1) for v in _list(body))
        if tag == "$b" and isinstance(body, str):
            return base64.b64decode(body, validate=True)
        if tag == "$c":
            re_, im = _list(body)
            return complex(_float(from_json(re_)), _float(from_json(im)))
        if tag == "$x" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "$i" and isinstance(body, str):
            return int(body, 16)
        if tag == "$h" and type(body) is int:
            return Handle(body)
    except (TypeError, ValueError) as exc:
        raise WireError(f"malformed {tag} value: {exc}") from None
    raise WireError(f"unknown tag {tag!r}")


def _list(body):
    if not isinstance(body, list):
        raise WireError("malformed value")
    return body


def _float(x):
    if type(x) not in (int, float):
        raise WireError("malformed complex value")
    return float(x)


def encode(value, handles=None):
    """One JSON line (bytes, newline-terminated) for ``value``; see :func:`to_json`."""
    return (json.dumps(to_json(value, handles), separators=(",", ":"), allow_nan=False) + "\n").encode()


def decode(line):
    """The value of one line made by :func:`encode`.

    Raises:
        WireError: anything malformed (bad JSON included).
    """
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not a JSON value: {exc}") from None
    return from_json(obj)

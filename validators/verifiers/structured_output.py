"""Structured-output verifier (``agent_ref`` ``structured_output``): JSON Schema validation.

ground_truth ``{"schema": <JSON Schema>}``; the schema is checked against its metaschema
(``jsonschema.validators.validator_for(schema).check_schema``) when the row is built. The final
answer must be one JSON value that validates (``jsonschema``; formats not asserted). Fenced blocks
(``metadata.fenced``, default ``"allow"``): with ``"allow"`` an answer that is exactly one fenced
block (```` ```json ... ``` ```` or ```` ``` ... ``` ````, surrounding whitespace ignored) is
unwrapped first; with ``"reject"`` a fence is a format error (reward 0). Any text around the JSON
fails either way. Binary reward.

Extra keys: every object schema that lists ``properties`` and says nothing of other keys (no
``additionalProperties``, ``patternProperties`` or ``unevaluatedProperties``) is closed before
validation (``additionalProperties: false``, the strict structured-output convention of OpenAI and
vLLM), except inside ``allOf`` branches, where closing would reject the other branches' keys. So
padding an object with every key that might be wanted earns nothing; ``metadata.allow_extra_keys:
true`` validates against the schema as written. One answer only: a second JSON value after the
first is not a single JSON value (reward 0). A skeleton is no answer: a schema-valid value with a
string that holds no content (blank, a placeholder word such as ``"string"`` or ``"N/A"``, or its own
key, :func:`placeholder`) scores 0, since the prompts ask for a realistic value (``metadata.
allow_placeholders: true`` turns this off). Strict JSON (``common.answers.strict_json``): ``NaN`` and
``Infinity``, a duplicate key (Python would keep the last value), more than 64 levels of nesting or a
number past Python's digit limit are no JSON value (reward 0).
"""

from __future__ import annotations

import json
import re
from typing import Any

from common.answers import strict_json
from validators.verifiers.registry import (
    Verdict,
    Verifier,
    fail,
    ground_truth,
    metadata,
)

FENCED = re.compile(r"\A\s*```(?:json|JSON)?[ \t]*\n(.*?)\n?```\s*\Z", re.S)
FENCE_POLICIES = ("allow", "reject")


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames")
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def closed(schema: Any, in_all_of: bool = False) -> Any:
    """A copy of ``schema`` with its objects closed (see the module doc); other values unchanged."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed(s, in_all_of=True) for s in out["allOf"]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(s) for k, s in out[key].items()}
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = closed(out[key])
    if isinstance(out.get("properties"), dict) and not in_all_of and not any(k in out for k in _OPEN_KEYS):
        out["additionalProperties"] = False
    return out


PLACEHOLDERS = frozenset({"", "string", "str", "text", "value", "example", "sample", "placeholder", "todo",
                          "tbd", "n/a", "na", "none", "null", "unknown", "xxx", "...", "…", "-", "?", "lorem ipsum"})


def _enumerated(schema: Any) -> frozenset[str]:
    """Every string a schema names as an ``enum`` member or a ``const`` (an answer may be one of them)."""
    found: set[str] = set()
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            found.update(v for v in node.get("enum", []) if isinstance(v, str))
            if isinstance(node.get("const"), str):
                found.add(node["const"])
            todo += list(node.values())
        elif isinstance(node, list):
            todo += node
    return frozenset(found)


def placeholder(value: Any, path: str = "", allowed: frozenset[str] = frozenset()) -> tuple[str, str] | None:
    """The first string in ``value`` that holds no content (``(json path, string)``), or None: blank,
    a word of :data:`PLACEHOLDERS` (case and surrounding ``<>[]{}`` ignored), or its own key
    (``{"city": "city"}``); strings in ``allowed`` (the schema's ``enum``/``const`` values) never are."""
    if isinstance(value, str):
        word = value.strip().strip("<>[]{}").strip().casefold()
        key = path.rsplit("/", 1)[-1].casefold()
        hollow = word in PLACEHOLDERS or (key and word == key)
        return (path, value) if hollow and value not in allowed else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = placeholder(v, f"{path}/{k}" if path else str(k), allowed)
        if found is not None:
            return found
    return None


def _validator(schema: Any):
    from jsonschema.validators import validator_for

    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


class StructuredOutputVerifier(Verifier):
    """JSON Schema validation of the final answer (see the module doc)."""

    def check(self, row: dict[str, Any]) -> None:
        from jsonschema.exceptions import SchemaError

        schema = ground_truth(row, "schema")["schema"]
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth.schema must be a JSON Schema object")
        try:
            _validator(schema)
        except SchemaError as exc:
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth.schema is not a valid JSON Schema: "
                             f"{exc.message}") from None
        policy = metadata(row).get("fenced", "allow")
        if policy not in FENCE_POLICIES:
            raise ValueError(f"row {row.get('uuid')!r}: metadata.fenced {policy!r} not in {FENCE_POLICIES}")

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        policy = metadata(row).get("fenced", "allow")
        fenced = FENCED.match(answer)
        if fenced and policy == "reject":
            return fail("fenced block where bare JSON is required")
        text = fenced.group(1) if fenced else answer
        try:
            value = strict_json(text)
        except json.JSONDecodeError as exc:
            return fail(f"not a single JSON value: {exc.msg} at char {exc.pos}")
        except ValueError as exc:  # NaN / Infinity, a duplicate key, too deep, a number too long
            return fail(f"not a single JSON value: {exc}")
        schema = ground_truth(row, "schema")["schema"]
        if not metadata(row).get("allow_extra_keys"):
            schema = closed(schema)
        errors = sorted(_validator(schema).iter_errors(value), key=lambda e: e.path)
        if errors:
            where = "/".join(map(str, errors[0].absolute_path)) or "<root>"
            return fail(f"schema violation at {where}: {errors[0].message}", n_errors=len(errors))
        if not metadata(row).get("allow_placeholders"):
            hollow = placeholder(value, allowed=_enumerated(schema))
            if hollow is not None:
                return fail(f"a skeleton, not an answer: {hollow[0] or '<root>'} is {hollow[1]!r}")
        return Verdict(1.0, True, "valid against the schema")

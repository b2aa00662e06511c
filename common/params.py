"""The one-line error of a ``params.yaml`` block that fails its pydantic model: what
:func:`curation.params.check_params` raises for the whole file, and what a block validated on its own
(``sandbox`` under ``cascade train``, :meth:`validators.verifiers.sandbox.SandboxParams.from_block`)
raises, in the same words."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError


def _known(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the block that ``loc`` (minus its last part) points into."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if isinstance(part, str) else None
        inner = getattr(field, "annotation", None) if field else None
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return []
        model = inner
    return list(model.model_fields)


def params_error(exc: ValidationError, model: type[BaseModel], source: str = "params.yaml",
                 prefix: tuple[str, ...] = ()) -> ValueError:
    """The error to raise for ``exc``, raised validating ``model`` (the block at ``prefix`` of
    ``source``): one line naming its first bad key, e.g.
    ``params.yaml dedup.near.treshold: unknown key (did you mean 'threshold'?)`` or
    ``params.yaml dedup.near.threshold: Input should be less than or equal to 1 (got 1.7)``.
    The offending value is shown except for a missing key or a validator's own message."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in (*prefix, *err["loc"]))
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(err["loc"][-1]), _known(model, err["loc"]), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return ValueError(f"{source} {where}: unknown key{hint}")
    got = "" if err["type"] in ("missing", "value_error") else f" (got {err['input']!r})"
    return ValueError(f"{source} {where}: {err['msg'].removeprefix('Value error, ')}{got}")

"""Adapters: one function per source format, mapping a raw record to canonical row(s).

An adapter is ``fn(raw, spec, root) -> dict | list[dict]`` installed as an entry point of group
``cascade_rl.adapters`` (the built-ins in ``pyproject.toml``; :mod:`common.plugins`); ``root`` is
the directory the source's paths resolve against (for side files such as BFCL's
``possible_answer``). It returns *partial* rows in the schema of ``spec.output`` (see
:mod:`corpora.schema`); :func:`curation.ingest.finalize_row` fills ``uuid``, ``source``,
``source_version``, ``license`` and the default ``domain``, and serializes JSON fields given as
Python objects (``tools``, ``ground_truth``, ``kwargs``, ``metadata``, tool-call ``arguments``).

An adapter that wraps a source item in an instruction template (the boxed-
answer request of math and multiple-choice rows) records the item's own text
as ``metadata.question``: decontamination indexes that text for benchmark
rows, so a shared template is never mistaken for contamination.

An adapter raises :class:`corpora.schema.RecordError` with the field and the
problem for a record it cannot map (an unknown role, a missing field); it
never drops a record silently. Returning ``[]`` is allowed only when the
record legitimately holds no rows and must be documented in the adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import plugins
from corpora.registry import SourceSpec

Adapter = Callable[[Any, SourceSpec, Path], "dict[str, Any] | list[dict[str, Any]]"]

def get_adapter(name: str) -> Adapter:
    """The adapter installed as ``name`` (entry-point group ``cascade_rl.adapters``, :mod:`common.plugins`).

    Raises:
        KeyError: listing the installed adapters.
    """
    return plugins.load("adapters", name)

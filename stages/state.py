"""Training state: what a killed stage needs to go on as if it had never stopped.

Every ``save_every`` optimizer steps and at the last one, :func:`save_state` writes under the stage's
state root (``StageConfig.state_dir``: ``<checkpoint_root>/.states/<stage>``)::

    step-000012/
        model.safetensors, optimizer.pt   the train engine's (TrainEngine.save_state: weights,
                                          optimizer and LR-scheduler state; DeepSpeed: its checkpoint)
        rng.pt                            python, numpy and torch (CPU, CUDA) generator states
                                          (rank 0; rank r of a data-parallel run: rng-rank<r>.pt)
        state.json                        step, optimizer updates, data cursor, counts, metrics rows,
                                          the stage's extra state (MOPD: its teachers), the run's
                                          fingerprint, and every file's size and sha256

A state is written into ``.step-000012.*.tmp`` and renamed when complete (:func:`common.io.atomic_dir`),
so a ``step-*`` directory is never half-written (with data-parallel ranks, rank 0 makes the directory,
every rank writes its part, and rank 0 renames it once all are done); damage afterwards (a truncated file) fails the
sizes and sha256 of ``state.json``, and :func:`latest_state` falls back to the previous state with a
warning. The last ``keep_last`` states are kept. A state of another configuration or other input
data (:func:`fingerprint`) is refused, naming what differs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.io import atomic_dir
from stages import distributed
from stages.checkpoints import dataset_hash

STATE = "state.json"
# config fields that do not change what a run computes: a resumed run may change them
RESUME_FREE = frozenset({"save_every", "keep_last", "threads", "enabled"})


class StateMismatch(RuntimeError):
    """The latest complete state was written by another configuration or from other inputs."""


def fingerprint(config: dict[str, Any], datasets: list[Path], init: Path) -> dict[str, Any]:
    """What must be equal for a state to be resumed: the stage config (``config``, JSON-ready, less
    :data:`RESUME_FREE`), the md5 of every dataset and of the init checkpoint
    (:func:`stages.checkpoints.dataset_hash`, the hashes of the lineage record), and the number of
    data-parallel ranks (a ZeRO checkpoint is partitioned by it)."""
    return {"config": {k: v for k, v in config.items() if k not in RESUME_FREE},
            "datasets": {str(d): dataset_hash(d) for d in datasets},
            "init": {str(init): dataset_hash(init)},
            "ranks": {"world_size": distributed.world_size()}}


def rng_file(rank: int) -> str:
    """The RNG-state file of data-parallel rank ``rank`` in a state directory."""
    return "rng.pt" if rank == 0 else f"rng-rank{rank}.pt"


def rng_state() -> dict[str, Any]:
    """Every generator a stage draws from: python ``random``, numpy's global, torch CPU (and CUDA)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest(root: Path) -> dict[str, dict[str, Any]]:
    return {str(p.relative_to(root)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != STATE}


def save_state(root: Path, step: int, engine: Any, payload: dict[str, Any], keep_last: int = 2) -> Path:
    """Write the state of optimizer step ``step`` as ``root/step-{step:06d}`` (temporary directory, then
    rename) and remove all but the last ``keep_last`` states. ``engine``: a train engine
    (``save_state(dir)``, called on every rank); ``payload``: JSON-ready fields of ``state.json``.
    Every data-parallel rank calls it (collective). Returns the directory."""
    main = distributed.is_main()
    with atomic_dir(root / f"step-{step:06d}") if main else contextlib.nullcontext() as made:
        tmp = Path(distributed.broadcast(str(made) if main else None))
        engine.save_state(tmp)
        torch.save(rng_state(), tmp / rng_file(distributed.rank()))
        distributed.barrier()  # every rank's part is written
        if main:
            (tmp / STATE).write_text(json.dumps({**payload, "step": step, "files": _manifest(tmp)}),
                                     encoding="utf-8")
    distributed.barrier()  # renamed
    if main:
        for old in sorted(root.glob("step-*"))[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return root / f"step-{step:06d}"


def _complete(path: Path) -> dict[str, Any] | None:
    """``state.json`` of ``path`` when every file it lists has its size and sha256, else ``None`` (warned)."""
    try:
        state = json.loads((path / STATE).read_text(encoding="utf-8"))
        bad = [name for name, f in state["files"].items()
               if not (path / name).is_file() or (path / name).stat().st_size != f["bytes"]
               or _sha256(path / name) != f["sha256"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        bad = [f"{STATE} ({exc})"]
    if bad:
        warnings.warn(f"training state {path} is damaged ({', '.join(bad)}): falling back to the one before",
                      stacklevel=3)
        return None
    return state


def latest_state(root: Path, expected: dict[str, Any], stage: str) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete state under ``root`` and its ``state.json``, or ``None`` when there is none.
    Leftover temporary directories of an interrupted write are removed.

    Raises:
        StateMismatch: that state's fingerprint differs from ``expected`` (:func:`fingerprint`); the
            message names the differing keys and how to start over.
    """
    if not root.is_dir():
        return None
    for tmp in root.glob(".step-*.tmp") if distributed.is_main() else ():
        shutil.rmtree(tmp, ignore_errors=True)
    for path in sorted(root.glob("step-*"), reverse=True):
        state = _complete(path)
        if state is None:
            continue
        found = state.get("fingerprint", {})
        if found != expected:
            diff = sorted(f"{part}.{k}" for part in expected for k in
                          set(expected[part]) | set(found.get(part, {}))
                          if expected[part].get(k) != found.get(part, {}).get(k))
            raise StateMismatch(
                f"stage {stage}: the training state {path} was written by another run (differs in: "
                f"{', '.join(diff) or 'layout'}); resume it with the same config and inputs, or start over with "
                f"`cascade train {stage} --restart` (deletes {root})")
        return path, state
    return None

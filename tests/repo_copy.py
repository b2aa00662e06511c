"""A working copy of the repository (tracked and untracked-not-ignored files) for tests that run DVC."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def repo_files() -> list[str]:
    """The repository's files, repository-relative: ``git ls-files -co --exclude-standard`` (tracked, and
    untracked but not ignored)."""
    return subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.split()


def copy_repo(dst: Path) -> Path:
    """Copy the repository's files (:func:`repo_files`) into ``dst``."""
    for f in repo_files():
        if (REPO / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dst / f)
    return dst


def run_checked(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Run ``args`` in ``cwd``; its stdout, or an assertion error showing the tails of both streams."""
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def cascade_copy(dst: Path) -> tuple[dict[str, str], list[str]]:
    """A copy of the repository in ``dst`` ready to ``dvc repro`` the training stages: the built sets,
    assets, packs and difficulty-filtered sets copied in (the packs built there by ``tokenize``/``pack``,
    the filtered sets by ``difficulty``, when the repository has none), a git repo, an offline
    environment. Returns (env, the ``dvc`` command).

    Raises:
        AssertionError: the repository has no built sets (``dvc repro build``)."""
    import os
    import sys

    missing = [d for d in ("data/sets/rl", "data/sets/sft") if not (REPO / d).exists()]
    assert not missing, f"{missing} missing: run `dvc repro build` first"
    copy_repo(dst)
    for d in ("data/sets", "data/assets", "data/packed", "data/filtered"):
        if (REPO / d).exists():
            shutil.copytree(REPO / d, dst / d)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1"}
    run_checked(["git", "init", "-q"], dst, env)
    # a first commit, as in a user's clone: dvclive (stages/metrics.py) reads the HEAD revision
    run_checked(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "copy"],
                dst, env)
    dvc = [sys.executable, "-m", "dvc"]
    if not (dst / "data/packed").exists():
        run_checked([*dvc, "repro", "--single-item", "tokenize", "pack"], dst, env)
    if not (dst / "data/filtered").exists():  # the RL stages read it (stages/datasets.py)
        run_checked([*dvc, "repro", "--single-item", "difficulty"], dst, env)
    return env, dvc

"""A working copy of the repository (tracked and untracked-not-ignored files) for tests that run DVC."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_repo(dst: Path) -> Path:
    """Copy the repository's files (as ``git ls-files -co --exclude-standard`` lists them) into ``dst``."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        if (REPO / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dst / f)
    return dst

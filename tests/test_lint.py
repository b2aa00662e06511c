"""The tree stays clean: ruff (pyflakes, pycodestyle, import order, bugbear, pyupgrade; pyproject's
``[tool.ruff]``) and the import-linter layer contract (``[tool.importlinter]``: curation > stages >
packing > validators > corpora > common; a lower layer never imports a higher one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("argv", [["ruff", "check", "."], ["lint-imports"]], ids=["ruff", "import-linter"])
def test_lint(argv):
    exe = BIN / argv[0] if (BIN / argv[0]).exists() else shutil.which(argv[0])
    assert exe, f"{argv[0]} is not installed (scripts/setup.sh installs the dev extra)"
    proc = subprocess.run([str(exe), *argv[1:]], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

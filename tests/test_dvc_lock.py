"""The committed ``dvc.lock`` records the checkout's code and params for the data release (``dvc repro
export``), so a fresh clone's lock changes only where the data does (synthesize's samples depend on the
CPU: README)."""

import json
import os
import sys
from pathlib import Path

from tests.repo_copy import REPO, repo_files, run_checked


def test_the_lock_holds_the_current_code_and_params_of_every_step_export_runs():
    """``dvc status export --with-deps``: no code file or folder of the repository, param or command differs
    from the lock (data dependencies, absent on a fresh clone or rebuilt on another CPU, are not compared).
    It failed on 889966a's lock, whose synthesize entry held the old hash of stages/checkpoints.py."""
    status = run_checked([sys.executable, "-m", "dvc", "status", "export", "--with-deps", "--json"], REPO,
                         {**os.environ, "DVC_NO_ANALYTICS": "1"})
    files = repo_files()
    code = set(files) | {str(parent) for f in files for parent in Path(f).parents if str(parent) != "."}
    stale = []
    for stage, changes in json.loads(status or "{}").items():
        for change in changes:
            if isinstance(change, str):  # "changed command", "always changed"
                stale.append(f"{stage}: {change}")
                continue
            for path, state in change.get("changed deps", {}).items():
                if isinstance(state, dict):  # params: {key: "modified" | "new" | "deleted"}
                    stale += [f"{stage}: {path} {key} {how}" for key, how in state.items()]
                elif path in code:
                    stale.append(f"{stage}: {path} {state}")
    assert not stale, "dvc.lock is stale; re-run the steps (or, for outputs that stay byte-identical, " \
                      "record the code hashes):\n" + "\n".join(stale)

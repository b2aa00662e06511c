"""A stage run of :mod:`tests.resume_job` that records, per rank, what the data-parallel tests check.

    torchrun --nproc-per-node 2 -m tests.dp_job RUNNER DATA_DIR OUT_DIR [KEY=JSON ...]
    python -m tests.dp_job RUNNER DATA_DIR OUT_DIR [KEY=JSON ...]        (the one-process run)

Each rank appends to ``OUT_DIR/rank<r>.jsonl`` one line per prompt its rollout engine sampled
(``{"prompt": ids, "step": k}``) and one per file it published with ``os.replace`` (every atomic write
of this package ends so: checkpoints, states, metrics, plots).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests import resume_job


def _record(out: Path, **entry) -> None:
    with (out / f"rank{os.environ.get('RANK', '0')}.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def instrument(out: Path) -> None:
    """Wrap the hf engine's ``generate`` and ``os.replace`` to record what this rank does."""
    from stages.rollout import HFRolloutEngine

    generate, replace = HFRolloutEngine.generate, os.replace
    calls = {"n": 0}

    def recorded_generate(self, prompts, n, greedy=False, max_new_tokens=None, seed=None):
        if not greedy:  # training rollouts (validation is greedy)
            calls["n"] += 1
            for p in prompts:
                _record(out, prompt=list(p), step=calls["n"])
        return generate(self, prompts, n, greedy=greedy, max_new_tokens=max_new_tokens, seed=seed)

    def recorded_replace(src, dst, *args, **kwargs):
        _record(out, replaced=str(dst))
        return replace(src, dst, *args, **kwargs)

    HFRolloutEngine.generate = recorded_generate
    os.replace = recorded_replace


if __name__ == "__main__":
    runner_, data_, out_, *pairs = sys.argv[1:]
    out_path = Path(out_)
    out_path.mkdir(parents=True, exist_ok=True)
    instrument(out_path)
    if os.environ.get("CASCADE_TEST_EPISODES"):
        from tests.parity_episodes import install

        install()
    resume_job.run(runner_, Path(data_), out_path, **{k: json.loads(v) for k, v in (p.split("=", 1) for p in pairs)})

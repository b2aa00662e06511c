"""What every stage run shares: seeding, model + train engine, progress bar, metrics and
plots, per-domain validation, and the checkpoint with its registry record.

Outputs of stage ``NAME`` (the paths ``dvc.yaml`` declares):
  ``<checkpoint_root>/NAME/``       HF model + tokenizer + ``cascade_checkpoint.json``
  ``<metrics_dir>/NAME.json``       summary: final step metrics, validation, counts, wall time
  ``<plots_dir>/NAME.csv`` / ``.png`` one row per optimizer step / curves
  ``logs/tensorboard/NAME/``         the same scalars, when ``tensorboard`` is installed
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Self

import torch
from tqdm import tqdm

from common.io import write_json
from stages.base import StageConfig, StageResult
from stages.checkpoints import load_checkpoint, write_record
from stages.metrics import MetricsLog
from stages.train_engine import make_train_engine


def seed_everything(seed: int) -> None:
    """Seed python's and torch's RNGs (sampling, dropout, shuffles)."""
    random.seed(seed)
    torch.manual_seed(seed)


class BatchCycle:
    """Consecutive batches of ``size`` items, cycling through ``items`` (the shuffled prompts of a
    stage) from ``position``: what every RL loop draws one optimizer step from. ``position`` is the
    data cursor (items drawn so far), so a run can be resumed from it.

    >>> cycle = BatchCycle(["a", "b", "c"], 2)
    >>> cycle.next(), cycle.next(), cycle.position
    (['a', 'b'], ['c', 'a'], 4)

    Raises:
        ValueError: no items, or ``size < 1``.
    """

    def __init__(self, items: list[Any], size: int, position: int = 0):
        if not items or size < 1:
            raise ValueError(f"a batch cycle needs items and size >= 1, got {len(items)} items, size {size}")
        self.items, self.size, self.position = items, size, position

    def next(self) -> list[Any]:
        """The next ``size`` items (wrapping around the end)."""
        batch = [self.items[(self.position + i) % len(self.items)] for i in range(self.size)]
        self.position += self.size
        return batch


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads, then restore the previous count
    (``None``: leave it). On shared cores 1 thread avoids OpenMP spin-waiting (see params.yaml)."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class StageRun:
    """Context for one stage run; see the module docstring for its outputs.

    Attributes:
        engine: the train engine (``cfg.train_engine``) around the loaded model.
        tokenizer: the init checkpoint's tokenizer (saved with the checkpoint).
        counts: dropped/skipped counters that go into the summary (never silent loss).
    """

    def __init__(self, cfg: StageConfig, datasets: list[Path], init_checkpoint: Path):
        self.cfg, self.datasets, self.init = cfg, [Path(d) for d in datasets], Path(init_checkpoint)
        self.counts: dict[str, int] = {}
        self.last: dict[str, float] = {}
        self.updates = 0  # optimizer steps taken (the weights version a strict on-policy sampler must hold)

    def __enter__(self) -> Self:
        self.t0 = time.perf_counter()
        self._restore = ExitStack()  # undone on exit, also when loading fails below
        self._restore.enter_context(torch_threads(self.cfg.threads))
        try:
            seed_everything(self.cfg.seed)
            model, self.tokenizer = load_checkpoint(self.init)
            model.train()
            self.engine = make_train_engine(self.cfg.train_engine, model, self.cfg.optim, self.cfg.steps,
                                            self.cfg.zero_stage)
            self.log_ = MetricsLog(Path(self.cfg.plots_dir) / f"{self.cfg.name}.csv",
                                   tensorboard_dir=Path("logs") / "tensorboard" / self.cfg.name)
        except BaseException:
            self._restore.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if hasattr(self, "bar"):
            self.bar.close()
        self._restore.close()

    def rollout_engine(self, name: str, sampling: Any) -> Any:
        """The stage's rollout engine ``name`` (``auto`` | ``hf`` | ``vllm`` | a plugin) on the policy,
        started once from the init checkpoint and closed when the run ends."""
        from stages.rollout import make_rollout_engine

        rollout = make_rollout_engine(name, self.engine.module, self.tokenizer, sampling, str(self.init))
        self._restore.callback(rollout.close)
        return rollout

    def frozen_copy(self) -> torch.nn.Module:
        """A frozen copy of the initial policy (the KL reference), in eval mode."""
        ref = copy.deepcopy(self.engine.module).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def progress(self, steps: int) -> Any:
        """``range(1, steps + 1)`` with a progress bar showing the latest metrics."""
        self.bar = tqdm(range(1, steps + 1), desc=self.cfg.name, unit="step")
        return self.bar

    def log(self, step: int, values: dict[str, float]) -> None:
        """Record step metrics (CSV row, progress-bar postfix)."""
        self.last = values
        self.log_.log(step, values)
        shown = {k: f"{v:.4g}" for k, v in values.items() if k in ("loss", "reward_mean", "lr", "tokens_per_s")}
        self.bar.set_postfix(shown)

    def validate(self, rollout: Any, builder: Any, env: Any) -> dict[str, dict[str, float]]:
        """Per-domain validation of the current weights on ``cfg.eval.datasets``."""
        from stages.evaluate import evaluate

        with self.engine.gathered():
            return evaluate(rollout, builder, env, self.cfg.eval)

    def finish(self, validation: dict[str, dict[str, float]], curves: tuple[str, ...]) -> StageResult:
        """Save checkpoint + tokenizer + record, the summary JSON and the curves; return the paths."""
        cfg = self.cfg
        ckpt = cfg.checkpoint_dir
        self.engine.save(ckpt)
        self.tokenizer.save_pretrained(ckpt)
        summary = {"stage": cfg.name, "runner": cfg.runner, "steps": cfg.steps, "final": self.last,
                   "validation": validation, "counts": self.counts,
                   "wall_s": round(time.perf_counter() - self.t0, 1)}
        write_record(ckpt, stage=cfg.name, runner=cfg.runner, init=self.init, datasets=self.datasets,
                     validation=validation, train={"final": self.last, "counts": self.counts})
        metrics = Path(cfg.metrics_dir) / f"{cfg.name}.json"
        write_json(summary, metrics)
        self.log_.write(Path(cfg.plots_dir) / f"{cfg.name}.png", curves)
        return StageResult(ckpt, metrics, summary)

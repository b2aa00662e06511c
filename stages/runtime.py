"""What every stage run shares: seeding, model + train engine, progress bar, metrics and
plots, per-domain validation, and the checkpoint with its registry record.

Launched by ``torchrun`` / ``deepspeed`` with N ranks, every rank runs the same loop on its share of each
global batch (:mod:`stages.distributed`) and rank 0 alone writes these outputs.

Outputs of stage ``NAME`` (the paths ``dvc.yaml`` declares):
  ``<checkpoint_root>/NAME/``       HF model + tokenizer + ``cascade_checkpoint.json``
  ``<metrics_dir>/NAME.json``       summary: final step metrics, validation, counts, wall time
  ``<plots_dir>/NAME.csv`` / ``.png`` one row per optimizer step / curves
  ``logs/tensorboard/NAME/``         the same scalars, when ``tensorboard`` is installed
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
from tqdm import tqdm

from common.io import write_json
from stages import distributed
from stages.base import StageConfig, StageResult
from stages.checkpoints import SCORES_FILE, load_checkpoint, write_record
from stages.metrics import MetricsLog
from stages.moe import router_tap
from stages.rollout import torch_threads
from stages.state import fingerprint, latest_state, rng_file, save_state, set_rng_state
from stages.train_engine import checkpoint_activations, in_precision, make_train_engine, train_top_layers


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's RNGs (sampling, dropout, shuffles)."""
    random.seed(seed)
    np.random.seed(seed)
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

    def seek(self, position: int) -> None:
        """Continue from ``position`` (a resumed run's data cursor)."""
        self.position = position

    def next(self) -> list[Any]:
        """The next ``size`` items (wrapping around the end)."""
        batch = [self.items[(self.position + i) % len(self.items)] for i in range(self.size)]
        self.position += self.size
        return batch


class StageLocked(RuntimeError):
    """Another process is training the same stage (its lock file is held)."""


@contextmanager
def stage_lock(cfg: StageConfig) -> Iterator[Path]:
    """Hold ``<checkpoint_root>/.locks/<stage>.lock`` (an exclusive ``flock``, released by the kernel if
    the process dies) while a run of stage ``cfg.name`` writes its states, checkpoint and metrics: a
    second ``cascade train`` of the stage fails at once instead of corrupting the first one's files.

    Raises:
        StageLocked: naming the stage, the lock file and the pid that holds it.
    """
    path = Path(cfg.checkpoint_root) / ".locks" / f"{cfg.name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            raise StageLocked(f"stage {cfg.name} is being trained by another process (pid {holder}, lock {path}): "
                              "wait for it to finish or stop it; a killed run resumes from its last state") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield path
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _qualname(value: Any) -> str:
    """A config value JSON cannot hold (a function in ``environment_kwargs``) by its qualified name."""
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__qualname__)}"


class StageRun:
    """Context for one stage run; see the module docstring for its outputs.

    A run resumes by default: entering loads the latest complete training state of the same config
    and inputs (:mod:`stages.state`; :class:`~stages.state.StateMismatch` for another's), and
    :meth:`progress` continues after its step with its RNG states, :meth:`resumable` puts the data
    cursor back, ``extra`` holds what the stage saved. :meth:`log` writes a state every
    ``save_every`` steps and at the last; :meth:`finish` removes the states.

    Attributes:
        device: the rank's device (``cfg.device``); the policy, reference and teachers live there.
        engine: the train engine (``cfg.train_engine``) around the loaded model.
        routers: the policy's MoE routers (:func:`stages.moe.router_tap`: aux loss and expert load), or
            ``None`` for a dense model.
        tokenizer: the init checkpoint's tokenizer (saved with the checkpoint).
        counts: dropped/skipped counters that go into the summary (never silent loss).
        updates: optimizer steps taken (the weights version a strict on-policy sampler must hold).
        start_step: the step a resumed run continues after (0: a fresh run).
        extra: JSON-ready stage state saved with every training state (MOPD: its teachers).
    """

    def __init__(self, cfg: StageConfig, datasets: list[Path], init_checkpoint: Path):
        self.cfg, self.datasets, self.init = cfg, [Path(d) for d in datasets], Path(init_checkpoint)
        self.counts: dict[str, int] = {}
        self.last: dict[str, float] = {}
        self.updates = self.start_step = 0
        self.extra: dict[str, Any] = {}
        self._cursor: Any = None
        self._resumed: tuple[Path, dict[str, Any]] | None = None

    def __enter__(self) -> Self:
        self._restore = ExitStack()  # undone on exit, also when loading fails below
        try:
            if os.environ.get("RANK", "0") == "0":  # one lock per run: the launcher's rank 0 holds it
                self._restore.enter_context(stage_lock(self.cfg))
            self._restore.enter_context(torch_threads(self.cfg.threads or len(distributed.cpu_share())))
            distributed.init()
            self.device = distributed.device(self.cfg.device)
            seed_everything(self.cfg.seed + distributed.rank())  # ranks draw differently (rollouts: per-sample seeds)
            model, self.tokenizer = load_checkpoint(self.init, self.cfg.attn_implementation)
            model.to(self.device).train()
            if self.cfg.trainable_layers is not None:
                self.counts["trainable_parameters"] = train_top_layers(model, self.cfg.trainable_layers)
            if self.cfg.gradient_checkpointing:
                checkpoint_activations(model)
            self.engine = make_train_engine(self.cfg.train_engine, model, self.cfg.optim, self.cfg.steps,
                                            self.cfg.zero_stage, self.cfg.dtype, self.cfg.param_dtype)
            self.routers = router_tap(self.engine.model, self.cfg.router_aux_loss_coef,
                                      self.cfg.router_bias_update_rate)
            if self.routers is not None:
                self._restore.callback(self.routers.close)
            self.log_ = MetricsLog(Path(self.cfg.plots_dir) / f"{self.cfg.name}.csv", self.cfg.live_dir,
                                   tensorboard_dir=Path("logs") / "tensorboard" / self.cfg.name,
                                   writer=distributed.is_main())
            self._fingerprint = fingerprint(self.cfg.model_dump(mode="json", fallback=_qualname), self.datasets,
                                            self.init)
            self._resume()
        except BaseException:
            self._restore.close()
            raise
        return self

    def _resume(self) -> None:
        self._resumed = latest_state(self.cfg.state_dir, self._fingerprint, self.cfg.name)
        if self._resumed is None:
            self.log_.start()
            return
        path, state = self._resumed
        self.engine.load_state(path)
        self.start_step, self.updates = state["step"], state["updates"]
        self.counts, self.extra = state["counts"], state["extra"]
        self.log_.start(state["rows"])
        self.last = {k: v for k, v in state["rows"][-1].items() if k != "step"} if state["rows"] else {}

    def __exit__(self, *exc: object) -> None:
        if hasattr(self, "bar"):
            self.bar.close()
        self._restore.close()

    def resumable(self, cursor: Any) -> Any:
        """``cursor`` (the stage's data order: ``position`` and ``seek(position)``, e.g. a
        :class:`BatchCycle`) moved to the resumed state's position; saved with every state."""
        self._cursor = cursor
        if self._resumed is not None:
            cursor.seek(self._resumed[1]["cursor"])
        return cursor

    def save_state(self, step: int) -> Path:
        """Write the training state after optimizer step ``step`` (:func:`stages.state.save_state`) and
        the CSV of the rows so far."""
        payload = {"updates": self.updates, "cursor": self._cursor.position if self._cursor is not None else 0,
                   "counts": self.counts, "rows": self.log_.rows, "extra": self.extra,
                   "fingerprint": self._fingerprint}
        path = save_state(self.cfg.state_dir, step, self.engine, payload, self.cfg.keep_last)
        self.log_.write()
        return path

    def rollout_engine(self, name: str, sampling: Any) -> Any:
        """The stage's rollout engine ``name`` (``auto`` | ``hf`` | ``vllm`` | a plugin) on the policy,
        started once from the init checkpoint and closed when the run ends; ``sampling`` as adjusted
        for the stage's ``dtype`` (:meth:`~stages.rollout.SamplingConfig.for_dtype`) and kept as ``sampling``."""
        from stages.rollout import make_rollout_engine

        self.sampling = sampling = sampling.for_dtype(self.cfg.dtype)
        rollout = make_rollout_engine(name, self.engine.module, self.tokenizer, sampling, str(self.init))
        if self.updates:  # resumed: the engine starts from the init checkpoint, the policy has moved on
            with self.engine.gathered():
                rollout.sync_weights(self.engine.module)
            rollout.weights_version = self.updates
        self._restore.callback(rollout.close)
        return rollout

    def environment(self, name: str, kwargs: dict[str, Any], given: Any = None) -> Any:
        """The stage's :class:`~stages.environment.Environment`: ``given`` (a runner's own, closed by its
        owner), else ``name`` (entry point of ``cascade_rl.environments``) built from ``kwargs`` and
        closed when the run ends (a verifier environment's worker pool lives for the whole run)."""
        from stages.environment import make_environment

        if given is not None:
            return given
        env = make_environment(name, **kwargs)
        if hasattr(env, "close"):
            self._restore.callback(env.close)
        return env

    def validation_environment(self, env: Any) -> Any:
        """``env`` when it scores each response alone, else the verifiers (per-domain validation scores
        single greedy answers; a judge scores groups: ``Environment.grades_responses``)."""
        return env if getattr(env, "grades_responses", True) else self.environment("verifiers", {})

    def reference_model(self) -> Any:
        """The KL reference: the init checkpoint loaded again (never a copy of the policy, which may
        be partitioned or already trained), frozen, in eval mode, run in the stage's ``dtype``
        (:func:`~stages.train_engine.in_precision`)."""
        ref, _ = load_checkpoint(self.init, self.cfg.attn_implementation)
        ref.to(self.device).eval().requires_grad_(False)
        return in_precision(ref, ref, self.cfg.dtype)

    def progress(self, steps: int) -> Any:
        """``range(start_step + 1, steps + 1)`` with a progress bar (step, ETA, latest metrics); a
        resumed run gets its RNG states back here, right before its first step."""
        if self._resumed is not None:
            set_rng_state(torch.load(self._resumed[0] / rng_file(distributed.rank()), weights_only=False))
        self.bar = tqdm(range(self.start_step + 1, steps + 1), desc=self.cfg.name, unit="step",
                        initial=self.start_step, total=steps, disable=not distributed.is_main())
        return self.bar

    def log(self, step: int, values: dict[str, float]) -> None:
        """Record step metrics (live files, progress-bar postfix); then the training state when ``step``
        is a multiple of ``save_every`` or the last."""
        self.last = values
        self.log_.log(step, values)
        shown = {k: f"{v:.4g}" for k, v in values.items() if k in ("loss", "reward_mean", "lr", "tokens_per_s")}
        self.bar.set_postfix(shown)
        if step == self.cfg.steps or (self.cfg.save_every and step % self.cfg.save_every == 0):
            self.save_state(step)

    def validate(self, rollout: Any, builder: Any, env: Any) -> dict[str, dict[str, float]]:
        """Per-domain validation of the current weights on ``cfg.eval.datasets``: rank 0 generates and
        scores (greedy: the one-process numbers), every rank gets its result."""
        from stages.evaluate import evaluate

        with self.engine.gathered():
            result = evaluate(rollout, builder, env, self.cfg.eval, self.cfg.episodes,
                              self.cfg.max_context_tokens) if distributed.is_main() else None
        return distributed.broadcast(result)

    def finish(self, validation: dict[str, dict[str, float]], curves: tuple[str, ...]) -> StageResult:
        """Save checkpoint + tokenizer + record, the summary JSON and the curves (rank 0); return the paths."""
        from stages.evaluate import split_scores

        cfg = self.cfg
        ckpt = cfg.checkpoint_dir
        self.engine.save(ckpt)  # collective under ZeRO-3; rank 0 writes
        final = {k: v for k, v in self.last.items() if not k.endswith("_s") and isinstance(v, (int, float))}
        validation, scores = split_scores(validation)
        summary = {"stage": cfg.name, "runner": cfg.runner, "steps": cfg.steps, "final": final,
                   "validation": validation, "counts": self.counts}
        metrics = Path(cfg.metrics_dir) / f"{cfg.name}.json"
        if distributed.is_main():
            self._write_outputs(ckpt, metrics, summary, curves)
            write_json(scores, ckpt / SCORES_FILE)  # per-prompt validation scores (cascade report's bootstrap)
        distributed.barrier()
        return StageResult(ckpt, metrics, summary)

    def _write_outputs(self, ckpt: Path, metrics: Path, summary: dict[str, Any], curves: tuple[str, ...]) -> None:
        cfg, final, validation = self.cfg, summary["final"], summary["validation"]
        self.tokenizer.save_pretrained(ckpt)
        # no timings in the DVC metrics (dvc.lock stays stable): wall time in logs/timings.json (run_step),
        # per-step seconds and rates in the live files and the CSV
        write_record(ckpt, stage=cfg.name, runner=cfg.runner, init=self.init, datasets=self.datasets,
                     validation=validation, train={"final": final, "counts": self.counts})
        write_json(summary, metrics)
        moe = ("aux_loss", "expert_load_max_mean") if self.routers is not None else ()
        self.log_.write(Path(cfg.plots_dir) / f"{cfg.name}.png", (*curves, *moe))
        shutil.rmtree(cfg.state_dir, ignore_errors=True)  # done: a later run of this stage starts over
        cfg.state_dir.mkdir(parents=True)  # (empty: dvc.yaml declares it, persist: true)

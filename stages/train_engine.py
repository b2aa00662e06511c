"""Train engines: own the optimizer and scheduler, take backward passes and optimizer steps.

``torch`` is a single process; ``deepspeed`` wraps the same model, the same torch AdamW
and the same scheduler in a DeepSpeed engine (ZeRO 0-3; on CPU it uses the gloo backend).
The caller normalizes every micro-batch loss by the token count of the whole accumulation
window, so neither engine rescales losses: several ``backward`` calls then one ``step``.

Optimizer: AdamW, betas (0.9, 0.98), weight decay 0.1 on matrices only (norm gains and
biases are not decayed), cosine LR from ``lr`` to ``min_lr_ratio * lr`` after a linear
warm-up (recipe, SFT row; ``transformers.get_cosine_with_min_lr_schedule_with_warmup``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import BaseModel, ConfigDict

from common import plugins


class OptimConfig(BaseModel):
    """AdamW + cosine-with-warm-up knobs (defaults: the recipe's SFT row)."""

    model_config = ConfigDict(extra="forbid")
    lr: float = 5e-5
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 0
    max_grad_norm: float = 1.0


class TrainEngine(Protocol):
    """What a stage needs from the training backend."""

    model: torch.nn.Module  # callable forward (a DeepSpeed engine for ``deepspeed``)
    module: torch.nn.Module  # the plain HF module (generation, saving)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate gradients of ``loss`` (already normalized by the window token count)."""

    def step(self) -> dict[str, float]:
        """Clip, take one optimizer + scheduler step, zero grads; returns ``grad_norm`` and ``lr``."""

    def gathered(self) -> contextlib.AbstractContextManager:
        """Context in which ``module`` holds full parameters (ZeRO-3 gathers them)."""

    def save(self, path: str | Path) -> None:
        """Write ``module`` with ``save_pretrained`` to ``path`` atomically (temp dir + rename)."""


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    """torch AdamW over ``model``'s trainable parameters and its cosine schedule.

    Returns ``(optimizer, scheduler)``. Raises ValueError when ``total_steps < 1``.
    """
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    sched = get_cosine_with_min_lr_schedule_with_warmup(
        opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=total_steps, min_lr_rate=cfg.min_lr_ratio)
    return opt, sched


def _save_atomic(module: torch.nn.Module, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        module.save_pretrained(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class TorchEngine:
    """Single-process engine: plain ``loss.backward()`` and torch AdamW."""

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, total_steps: int):
        self.model = self.module = model
        self.cfg = optim
        self.optimizer, self.scheduler = build_optimizer(model, optim, total_steps)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> dict[str, float]:
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": float(norm), "lr": lr}

    def gathered(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def save(self, path: str | Path) -> None:
        _save_atomic(self.module, path)


def _init_single_process() -> None:
    """Set the env:// rendezvous for a one-process group when no launcher did (free local port)."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


class DeepSpeedEngine:
    """DeepSpeed engine (ZeRO ``zero_stage`` 0-3) around the torch AdamW of :func:`build_optimizer`.

    Uses ``managed_gradient_accumulation: false``: ``backward`` only accumulates and ``step``
    is the boundary, so a window may hold any number of micro-batches. Runs under the
    ``deepspeed``/``torchrun`` launchers or, without one, as a single gloo process.

    Raises:
        ImportError: deepspeed missing (``pip install 'cascade-rl[distributed]'``).
    """

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, total_steps: int, zero_stage: int = 2,
                 extra_config: dict[str, Any] | None = None):
        try:
            import deepspeed
        except ImportError as exc:
            raise ImportError("the deepspeed engine needs: DS_BUILD_OPS=0 pip install 'cascade-rl[distributed]'") from exc
        _init_single_process()
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
        self.cfg, self.zero_stage, self.module = optim, zero_stage, model
        optimizer, scheduler = build_optimizer(model, optim, total_steps)
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "managed_gradient_accumulation": False, "gradient_clipping": optim.max_grad_norm,
                  "zero_optimization": {"stage": zero_stage}, "steps_per_print": 2**31,
                  **(extra_config or {})}
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config)

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss, scale_wrt_gas=False)

    def step(self) -> dict[str, float]:
        lr = self.model.get_lr()[0]
        self.model.step()
        norm = self.model.get_global_grad_norm()
        return {"grad_norm": float(norm) if norm is not None else float("nan"), "lr": lr}

    def gathered(self) -> contextlib.AbstractContextManager:
        if self.zero_stage < 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.module.parameters()))

    def save(self, path: str | Path) -> None:
        with self.gathered():
            if torch.distributed.get_rank() == 0:
                _save_atomic(self.module, path)


def make_train_engine(name: str, model: torch.nn.Module, optim: OptimConfig, total_steps: int,
                      zero_stage: int = 2) -> TrainEngine:
    """The engine installed as ``name`` (entry-point group ``cascade_rl.train_engines``: ``torch`` |
    ``deepspeed`` built in), built by its factory ``(model, optim, total_steps, zero_stage)``.

    Raises:
        ValueError: unknown name, listing the installed ones.
    """
    return plugins.load("train_engines", name)(model, optim, total_steps, zero_stage)


def torch_engine(model: torch.nn.Module, optim: OptimConfig, total_steps: int, zero_stage: int = 2) -> TorchEngine:
    """Entry point ``torch`` of ``cascade_rl.train_engines`` (``zero_stage`` is ignored)."""
    return TorchEngine(model, optim, total_steps)


def deepspeed_engine(model: torch.nn.Module, optim: OptimConfig, total_steps: int,
                     zero_stage: int = 2) -> DeepSpeedEngine:
    """Entry point ``deepspeed`` of ``cascade_rl.train_engines``."""
    return DeepSpeedEngine(model, optim, total_steps, zero_stage)

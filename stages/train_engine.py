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
import socket
from pathlib import Path
from typing import Annotated, Any, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field

from common import plugins
from common.io import atomic_dir
from stages import distributed
from stages.master_weights import MasterWeights


class OptimConfig(BaseModel):
    """AdamW + cosine-with-warm-up knobs (defaults: the recipe's SFT row)."""

    model_config = ConfigDict(extra="forbid")
    lr: float = Field(5e-5, gt=0.0)
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)
    betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0)], Annotated[float, Field(ge=0.0, lt=1.0)]] = (0.9, 0.98)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.1, ge=0.0)
    warmup_steps: int = Field(0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0.0)


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

    def save_state(self, path: Path) -> None:
        """Write weights, optimizer and LR-scheduler state into the existing directory ``path``
        (:mod:`stages.state` makes it atomic)."""

    def load_state(self, path: Path) -> None:
        """Restore what :meth:`save_state` wrote, exactly (a resumed run is bitwise the same)."""


FINAL_NORMS = ("norm", "norm_f", "final_layernorm")  # the decoder's final norm: Llama/Qwen, NemotronH, Jamba


def train_top_layers(model: torch.nn.Module, n: int) -> int:
    """Partial-layer training: freeze every parameter except the top ``n`` decoder layers and the final
    norm (embeddings, lower layers and the LM head stay as loaded). The frozen lower layers then run
    without building a graph and the backward stops at layer ``L - n``; with DeepSpeed (any ZeRO stage)
    and torch AdamW alike, only the trainable parameters get optimizer state. Returns the trainable
    parameter count.

    The decoder is ``model.get_decoder()`` (HF causal LMs: Llama, Qwen, Mistral, NemotronH, Jamba, ...)
    holding ``layers`` (a ``ModuleList``) and its final norm (:data:`FINAL_NORMS`).

    Raises:
        ValueError: ``n`` is not in ``[1, L]``, or the model has no such decoder (names its class).
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"trainable_layers: {type(model).__name__} has no decoder `layers` to train the top of")
    if not 1 <= n <= len(layers):
        raise ValueError(f"trainable_layers must be in [1, {len(layers)}] for {type(model).__name__}, got {n}")
    model.requires_grad_(False)
    norms = [getattr(decoder, name) for name in FINAL_NORMS if isinstance(getattr(decoder, name, None), torch.nn.Module)]
    for module in [*layers[len(layers) - n:], *norms[:1]]:
        module.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Activation checkpointing (``gradient_checkpointing: true``): ``model``'s decoder layers keep only
    their inputs in the forward and are run again in the backward (HF
    ``gradient_checkpointing_enable``), trading one more forward for activations of one layer at a time.

    Non-reentrant (``torch.utils.checkpoint`` with ``use_reentrant=False``): it works under DeepSpeed
    ZeRO-3 (the recompute's module calls gather their parameters like any forward) and with frozen
    lower layers (``trainable_layers``: no input needs a gradient), so HF's hook that makes the
    embeddings' output require grad (needed by reentrant checkpointing only) is removed again and the
    backward still stops at the lowest trainable layer. :func:`packing.isolation.recompute_context` is
    the recompute's ``context_fn``: packed documents stay isolated in the recompute.

    Checkpointed layers in training mode drop ``past_key_values`` / ``use_cache``, so a training forward
    cannot build a KV cache (:func:`stages.logprobs.response_logprobs` then does not share prompts).

    Raises:
        ValueError: the model does not support gradient checkpointing (transformers' message).
    """
    from packing.isolation import recompute_context

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
                                                                       "context_fn": recompute_context})
    model.disable_input_require_grads()


def recomputes_layers(model: Any) -> bool:
    """Whether a forward of ``model`` (an HF module or a wrapper of one) runs checkpointed layers: it is
    in training mode with activation checkpointing on (:func:`checkpoint_activations`), so its layers
    ignore ``past_key_values`` / ``use_cache`` (transformers' ``GradientCheckpointingLayer``)."""
    module = getattr(model, "module", model)
    return module.training and getattr(module, "is_gradient_checkpointing", False)


def build_optimizer(params: list[torch.nn.Parameter], cfg: OptimConfig, total_steps: int):
    """torch AdamW over ``params`` (the trainable parameters, or their fp32 masters) and its cosine schedule.

    Returns ``(optimizer, scheduler)``. Raises ValueError when ``total_steps < 1``.
    """
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    # fused (one kernel over all tensors): 0.12 s vs 0.5 s (foreach) per step on SmolLM2-135M, 2 cores
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype == torch.float32 for p in params)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)
    sched = get_cosine_with_min_lr_schedule_with_warmup(
        opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=total_steps, min_lr_rate=cfg.min_lr_ratio)
    return opt, sched


def _save_atomic(module: torch.nn.Module, path: str | Path) -> None:
    with atomic_dir(path) as tmp:
        module.save_pretrained(tmp)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """``model``'s parameters that require a gradient."""
    return [p for p in model.parameters() if p.requires_grad]


class TorchEngine:
    """Plain ``loss.backward()`` and torch AdamW; with data-parallel ranks, the gradients are summed over
    ranks once per optimizer step, before clipping (:func:`stages.distributed.all_reduce_grads`: DDP's
    reduction with accumulation under ``no_sync``). The losses are normalized by the global token count,
    so the sum is the one-process gradient of the global batch. (Not the ``DistributedDataParallel``
    wrapper: its hooks expect one forward per backward, and the prompt-shared forward of the RL losses
    calls the model twice and reads the LM head's weight outside the forward.) Rank 0 writes.

    ``param_dtype`` ``bfloat16``: the model's parameters are cast to bf16 and AdamW steps fp32 masters
    (:class:`stages.master_weights.MasterWeights`); gradients are reduced, clipped and accumulated in
    fp32, and saves write the masters."""

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, total_steps: int, param_dtype: str = "float32"):
        self.model = self.module = model
        self.cfg = optim
        if param_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"param_dtype must be float32 or bfloat16, got {param_dtype!r}")
        self.master = MasterWeights(model, torch.bfloat16) if param_dtype == "bfloat16" else None
        self.params = self.master.trained if self.master is not None else trainable(model)
        self.optimizer, self.scheduler = build_optimizer(self.params, optim, total_steps)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> dict[str, float]:
        distributed.all_reduce_grads(self.params)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not None:
            self.master.copy_to_model()
        return {"grad_norm": float(norm), "lr": lr}

    def gathered(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def full_precision(self) -> contextlib.AbstractContextManager:
        """Context in which ``module``'s parameters are the fp32 masters (saves, loads)."""
        return self.master.swapped() if self.master is not None else contextlib.nullcontext()

    def save(self, path: str | Path) -> None:
        if distributed.is_main():
            with self.full_precision():
                _save_atomic(self.module, path)

    def save_state(self, path: Path) -> None:
        from safetensors.torch import save_model

        if not distributed.is_main():  # every rank holds the same weights and optimizer state
            return
        with self.full_precision():
            save_model(self.module, str(path / "model.safetensors"))  # tied weights stored once
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                   path / "optimizer.pt")

    def load_state(self, path: Path) -> None:
        from safetensors.torch import load_model

        with self.full_precision():
            load_model(self.module, str(path / "model.safetensors"))
        state = torch.load(path / "optimizer.pt", weights_only=False)  # our own file: scheduler's lr_lambdas
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


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
    is the boundary, so a window may hold any number of micro-batches (the same number on every
    rank: the stage loops pad). DeepSpeed averages gradients over the data-parallel ranks, so
    ``backward`` scales the loss (normalized by the global token count) by the world size: the
    gradient is the one-process gradient of the global batch. Runs under the ``deepspeed``/``torchrun``
    launchers or, without one, as a single gloo process.

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
        optimizer, scheduler = build_optimizer(trainable(model), optim, total_steps)
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "managed_gradient_accumulation": False, "gradient_clipping": optim.max_grad_norm,
                  "zero_optimization": {"stage": zero_stage}, "steps_per_print": 2**31,
                  **(extra_config or {})}
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config)

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss * distributed.world_size(), scale_wrt_gas=False)

    def step(self) -> dict[str, float]:
        lr = self.model.get_lr()[0]
        self.model.step()
        norm = self.model.get_global_grad_norm()
        return {"grad_norm": float(norm) if norm is not None else float("nan"), "lr": lr}

    def gathered(self) -> contextlib.AbstractContextManager:
        """ZeRO-3: the full parameters on every rank (collective) with DeepSpeed's module hooks removed,
        so a generation or weight push runs plain forwards (the hooks would re-partition gathered
        parameters and make every forward a collective); the hooks are put back on exit."""
        return self._gathered() if self.zero_stage == 3 else contextlib.nullcontext()

    @contextlib.contextmanager
    def _gathered(self):
        import deepspeed

        offload = self.model.optimizer.parameter_offload
        for p in self.module.parameters():
            p.ds_active_sub_modules.clear()
        # the top module's start-of-forward hook too: its reset_step is a collective, which deadlocks where
        # one rank alone runs forwards (rank-0 validation) or ranks decode different numbers of steps
        start_of_forward = offload.module._forward_pre_hooks[offload.fwd_pre_hook.id]
        for hook in [offload.fwd_pre_hook, *offload.forward_hooks, *offload.backward_hooks]:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            with deepspeed.zero.GatheredParameters(list(self.module.parameters())):
                yield
        finally:
            offload.fwd_pre_hook = offload.module.register_forward_pre_hook(start_of_forward)
            offload._register_deepspeed_module(offload.module)  # also invalidates the prefetch trace

    def save(self, path: str | Path) -> None:
        with self.gathered():
            if torch.distributed.get_rank() == 0:
                _save_atomic(self.module, path)

    def save_state(self, path: Path) -> None:
        """DeepSpeed's own checkpoint (every rank writes its partitions) under ``path/deepspeed``."""
        self.model.save_checkpoint(str(path / "deepspeed"), tag="state")

    def load_state(self, path: Path) -> None:
        self.model.load_checkpoint(str(path / "deepspeed"), tag="state", load_optimizer_states=True,
                                   load_lr_scheduler_states=True)


class Autocast:
    """``forward`` run under ``torch.autocast(dtype)`` on the parameters' device: mixed precision, the
    weights (and a trainer's gradients and AdamW state) staying fp32 while matmuls run in ``dtype``.

    Frozen models (KL reference, MOPD teachers) run the same way. On this CPU kind (AVX-512 BF16, torch
    2.13) a SmolLM2-135M forward of 16 x 66 tokens takes 1.09 s under autocast and 1.05 s with bf16
    weights (an older torch build took 2.1-2.6 s with bf16 weights); a trained policy can hold bf16
    weights with fp32 masters instead (``param_dtype``, :class:`stages.master_weights.MasterWeights`).
    Attributes other than the call go to the wrapped forward (a DeepSpeed engine keeps its methods).
    """

    def __init__(self, forward: Any, dtype: torch.dtype, device_type: str):
        self.forward, self.dtype, self.device_type = forward, dtype, device_type

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.forward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.forward, name)


def compute_dtype(forward: Any) -> torch.dtype | None:
    """The dtype ``forward`` computes in when it is an :class:`Autocast` wrapper, else ``None``."""
    return forward.dtype if isinstance(forward, Autocast) else None


def in_precision(forward: Any, module: torch.nn.Module, dtype: str) -> Any:
    """``forward`` (``module`` or a wrapper of it) computing in ``dtype``: ``float32`` as is,
    ``bfloat16`` under :class:`Autocast` on ``module``'s device.

    Raises:
        ValueError: another ``dtype``.
    """
    if dtype == "float32":
        return forward
    if dtype == "bfloat16":
        return Autocast(forward, torch.bfloat16, next(module.parameters()).device.type)
    raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")


def make_train_engine(name: str, model: torch.nn.Module, optim: OptimConfig, total_steps: int,
                      zero_stage: int = 2, dtype: str = "float32", param_dtype: str = "float32") -> TrainEngine:
    """The engine installed as ``name`` (entry-point group ``cascade_rl.train_engines``: ``torch`` |
    ``deepspeed`` built in), built by its factory ``(model, optim, total_steps, zero_stage)``, which also
    gets ``param_dtype="bfloat16"`` when asked for.

    ``dtype``: the precision of the engine's ``model`` forward. ``param_dtype`` ``float32``: fp32 weights
    (and master weights) run under :func:`in_precision`; ``bfloat16`` (with ``dtype`` bfloat16): the engine
    holds bf16 parameters and fp32 masters (``torch``: :class:`stages.master_weights.MasterWeights`), and
    the forward runs as is.

    Raises:
        ValueError: unknown name, listing the installed ones; an unknown ``dtype``; ``param_dtype``
            bfloat16 without ``dtype`` bfloat16, or on an engine that does not take it.
    """
    factory = plugins.load("train_engines", name)
    if param_dtype == "float32":
        engine = factory(model, optim, total_steps, zero_stage)
        engine.model = in_precision(engine.model, model, dtype)
        return engine
    if param_dtype != "bfloat16" or dtype != "bfloat16":
        raise ValueError(f"param_dtype {param_dtype!r} with dtype {dtype!r}: param_dtype is float32, or bfloat16 "
                         "with dtype bfloat16")
    return factory(model, optim, total_steps, zero_stage, param_dtype=param_dtype)


def torch_engine(model: torch.nn.Module, optim: OptimConfig, total_steps: int, zero_stage: int = 2,
                 param_dtype: str = "float32") -> TorchEngine:
    """Entry point ``torch`` of ``cascade_rl.train_engines`` (``zero_stage`` is ignored)."""
    return TorchEngine(model, optim, total_steps, param_dtype)


def deepspeed_engine(model: torch.nn.Module, optim: OptimConfig, total_steps: int,
                     zero_stage: int = 2, param_dtype: str = "float32") -> DeepSpeedEngine:
    """Entry point ``deepspeed`` of ``cascade_rl.train_engines`` (fp32 parameters only).

    Raises:
        ValueError: ``param_dtype`` bfloat16 (not built for this engine: run ``dtype: bfloat16`` under
            autocast, or ``train_engine: torch``).
    """
    if param_dtype != "float32":
        raise ValueError("param_dtype bfloat16 needs train_engine torch; the deepspeed engine keeps fp32 "
                         "parameters (dtype bfloat16 runs them under autocast)")
    return DeepSpeedEngine(model, optim, total_steps, zero_stage)

"""Data-parallel ranks: which rank this process is, its share of a global batch, and the collectives
the stage loops need (all on ``torch.distributed``; one process: every helper is the identity).

``torchrun --nproc-per-node N cascade train STAGE`` (or the ``deepspeed`` launcher) starts N ranks;
:func:`init` joins them in one process group (``nccl`` on CUDA, ``gloo`` on CPU). The stage loops
then follow one rule: every rank draws the same *global* batch from the same seeded order, keeps
its contiguous share (:func:`shard`; an RL group is never split, since prompts are what is shared),
normalizes its losses by the all-reduced token count of the whole global batch, and the train
engine sums gradients over ranks, so an optimizer step equals the one-process step on the same global
batch. Metrics are computed from the gathered per-sample values (:func:`gather`); only rank 0
(:func:`is_main`) writes checkpoints, metrics, plots and records.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def init() -> None:
    """Join the launcher's process group (``WORLD_SIZE`` > 1 in the environment, as torchrun and the
    deepspeed launcher set it) unless one is up already; a single process is left alone. On CUDA the
    rank's device is ``cuda:LOCAL_RANK``."""
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)


def device(name: str) -> torch.device:
    """The rank's device for a stage's ``device`` setting: ``cpu``; ``cuda`` (``cuda:LOCAL_RANK``);
    ``auto``: ``cuda`` when a GPU is visible, else ``cpu``.

    Raises:
        ValueError: ``cuda`` asked for where no GPU is visible, or another name.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device: cuda, but torch sees no GPU (torch.cuda.is_available() is False)")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    raise ValueError(f"device must be auto, cpu or cuda, got {name!r}")


def cpu_share() -> list[int]:
    """The CPU cores of this rank: the process's affinity mask cut into ``LOCAL_WORLD_SIZE`` contiguous
    runs (torchrun's; the deepspeed launcher's ``LOCAL_SIZE``; 1 without), run ``LOCAL_RANK``. With fewer cores
    than local ranks, ranks share: rank ``r`` gets core ``r mod cores``.

    A rank's trainer threads and its rollout engine's binding both take this share: the engine samples
    while the trainer waits and the trainer computes while the engine idles, so each phase has every
    core of the rank and ranks never oversubscribe each other."""
    cores = sorted(os.sched_getaffinity(0))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or "1")
    if ranks <= 1:
        return cores
    if len(cores) < ranks:
        return [cores[local % len(cores)]]
    size, extra = divmod(len(cores), ranks)
    start = local * size + min(local, extra)
    return cores[start:start + size + (local < extra)]


def world_size() -> int:
    """Ranks in the process group (1 without one)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """Whether this rank writes the run's outputs (rank 0)."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    if world_size() > 1:
        dist.barrier()


def shard(items: list[Any], key: str) -> tuple[list[Any], int]:
    """This rank's contiguous share of the global batch ``items`` and the global index of its first item.

    Raises:
        ValueError: ``len(items)`` is not a multiple of the world size (``key``: the params key that
            sets the global batch, named in the message).
    """
    world = world_size()
    if len(items) % world:
        raise ValueError(f"{key} = {len(items)} must be a multiple of the {world} data-parallel ranks")
    size = len(items) // world
    start = rank() * size
    return items[start:start + size], start


def all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    """``values`` summed key by key over ranks (every rank must pass the same keys, in any order);
    float64 on the wire."""
    if world_size() == 1 or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def total(value: float) -> float:
    """``value`` summed over ranks (a count of this rank's share -> the global batch's)."""
    return all_reduce_sum({"n": value})["n"]


def all_reduce_max(value: int) -> int:
    """The largest ``value`` over ranks."""
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def all_true(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (a decision every rank must take alike)."""
    return flag if world_size() == 1 else all_reduce_max(int(not flag)) == 0


def gather(values: list[Any]) -> list[Any]:
    """Every rank's ``values`` (picklable) concatenated in rank order: the global batch's per-sample
    values when each rank passes its share's."""
    if world_size() == 1:
        return list(values)
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, values)
    return [v for part in parts for v in part]


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` (picklable) on every rank."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_grads(parameters: list[torch.nn.Parameter]) -> None:
    """Sum the gradients of ``parameters`` over ranks in place (a missing gradient counts as zeros), in
    flat buckets of one dtype: the reduction DDP makes, once per optimizer step after accumulation."""
    if world_size() == 1:
        return
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in parameters:
        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

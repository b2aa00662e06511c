"""SFT on packed sequences (recipe, SFT row): next-token cross-entropy over the supervised
(assistant) tokens, normalized by the supervised-token count of the whole gradient-accumulation
window; AdamW β=(0.9, 0.98), wd 0.1, cosine LR with warm-up (``optim`` in params).

Packs come from ``cascade pack`` (:class:`packing.dataset.PackedDataset`). No sequence-mixing layer
crosses documents: ``position_ids`` restart per document and the model runs under
:func:`packing.isolation.document_isolation` (SDPA on each document, no ``[T, T]`` mask; Mamba/SSM layers
restart their state at each document). Packs longer
than ``max_tokens`` (the paper packs 256K tokens) are cut at document boundaries into windows of
at most ``max_tokens``; a document longer than that is cropped (tokens counted in
``cropped_tokens``). ``max_tokens: null`` trains whole packs.

An MoE policy adds ``router_aux_loss_coef x`` its router load-balancing loss under the same window
normalization and logs ``aux_loss`` and the expert load (:mod:`stages.moe`, :func:`accumulate_sft`).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from pydantic import Field

from packing.dataset import PackedDataset, collate_packed
from packing.isolation import document_isolation
from stages import distributed
from stages.base import StageConfig, StageResult
from stages.lm_head import final_hidden_states, head_logprobs, model_device
from stages.losses import sft_target_mask
from stages.moe import RouterTap, packed_real_tokens
from stages.runtime import StageRun
from stages.train_engine import compute_dtype

if TYPE_CHECKING:
    from stages.environment import Environment


class SFTConfig(StageConfig):
    """One SFT stage; ``datasets`` are pack parquet files or directories holding ``<split>.parquet``.

    An optimizer step trains ``micro_batch_size x grad_accum x ranks`` windows (the global batch, as
    DeepSpeed and the HF Trainer count it): every rank draws them from the same seeded stream and
    trains its contiguous share.
    """

    micro_batch_size: int = Field(1, ge=1)   # windows per forward/backward (per rank)
    grad_accum: int = Field(1, ge=1)         # micro-batches per optimizer step (per rank)
    max_tokens: int | None = Field(2048, ge=1)  # window length (None: whole packs)
    split: str = "train"
    validation_windows: int = Field(4, ge=0)             # held-out windows (validation split) for val_loss
    # scores the per-domain RL validation (cfg.eval)
    environment: str = Field("verifiers", json_schema_extra={"plugin": "environments"})
    max_prompt_tokens: int = Field(1024, ge=1)


def pack_windows(pack: dict[str, torch.Tensor], max_tokens: int | None) -> Iterator[tuple[dict[str, torch.Tensor], int]]:
    """Cut one pack into windows of whole documents of at most ``max_tokens`` tokens.

    Args:
        pack: ``input_ids``/``labels``/``position_ids`` int64 ``[T]``, ``cu_seqlens`` int32 ``[D + 1]``.
    Yields:
        ``(window, cropped)``: a pack-shaped dict (``cu_seqlens`` from 0) and the tokens cropped from
        a document longer than ``max_tokens`` (0 otherwise).
    """
    cu = pack["cu_seqlens"].tolist()
    if max_tokens is None or cu[-1] <= max_tokens:
        yield pack, 0
        return
    start, bounds = cu[0], [0]
    for a, b in itertools.pairwise(cu):
        if b - start > max_tokens and a > start:  # close the window before this document
            yield _window(pack, start, a, bounds), 0
            start, bounds = a, [0]
        if b - a > max_tokens:  # one document alone is too long: crop it
            yield _window(pack, a, a + max_tokens, [0]), (b - a) - max_tokens
            start, bounds = b, [0]
            continue
        bounds.append(b - start)
    if cu[-1] > start:
        yield _window(pack, start, cu[-1], bounds), 0


def _window(pack: dict[str, torch.Tensor], a: int, b: int, bounds: list[int]) -> dict[str, torch.Tensor]:
    out = {k: pack[k][a:b] for k in ("input_ids", "labels", "position_ids")}
    if bounds[-1] != b - a:
        bounds = [*bounds, b - a]
    out["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int32)
    return out


def packed_forward(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits ``[B, T, V]`` of a collated packed batch with document-local attention
    (:func:`packing.isolation.document_isolation`): the unchunked reference of :func:`packed_nll`."""
    with document_isolation(model):
        return model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits


def packed_nll(model, batch: dict[str, torch.Tensor], chunk: int) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL (float32 scalar, with a graph, on the model's device) of the supervised
    targets of a packed batch (:func:`stages.losses.sft_target_mask`) and their count, with
    document-local attention; ``batch`` may be on any device.

    Only the supervised positions go through the LM head, ``chunk`` at a time
    (:func:`stages.lm_head.chunked_logprobs`): the ``[T, V]`` logits never exist, and the value and
    gradients equal :func:`stages.losses.sft_loss` on :func:`packed_forward`'s logits (under DeepSpeed
    ZeRO-3: one head call, :func:`stages.lm_head.head_logprobs`).
    """
    batch = {k: v.to(model_device(model)) for k, v in batch.items()}
    mask = sft_target_mask(batch["labels"], batch["position_ids"])
    with document_isolation(model):
        hidden, _ = final_hidden_states(model, input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    logprobs = head_logprobs(model, hidden[:, :-1][mask], batch["labels"][:, 1:][mask], chunk,
                             dtype=compute_dtype(model))
    return -logprobs.sum(), int(mask.sum())


def accumulate_sft(model, backward, micro_batches: list[dict[str, torch.Tensor]], chunk: int = 4096,
                   routers: RouterTap | None = None) -> dict[str, float]:
    """Backward the SFT loss of one accumulation window (:func:`packed_nll`, LM head ``chunk`` tokens at a
    time); each micro-batch loss is divided by the supervised-token count of the window of every
    data-parallel rank (all-reduced; every rank holds as many micro-batches). Each backward runs inside
    the micro-batch's :func:`~packing.isolation.document_isolation` block, as its forward. Returns the
    global window ``loss`` (mean nats/token) and ``supervised_tokens``.

    With ``routers`` (an MoE policy, :class:`stages.moe.RouterTap`) each micro-batch also backwards
    ``coef x`` its share of the router load-balancing loss (each packed row's over its non-padding
    tokens, weighted by its supervised tokens over the window's), and the stats gain ``aux_loss`` (the
    window's token-weighted mean, without ``coef``; ``loss`` stays the NLL) and the step's expert load
    (:meth:`~stages.moe.RouterTap.step_stats`)."""
    num_tokens = distributed.total(sum(int(sft_target_mask(b["labels"], b["position_ids"]).sum())
                                       for b in micro_batches))
    total, aux_total = 0.0, 0.0
    for b in micro_batches:
        with document_isolation(model):  # the backward too (it may recompute the forward)
            with nullcontext() if routers is None else routers.recording(packed_real_tokens(b["labels"],
                                                                                            b["position_ids"])):
                nll, _ = packed_nll(model, b, chunk)
            loss = nll / max(num_tokens, 1)
            total += float(loss.detach())
            if routers is not None:
                loss, aux = routers.add_aux(loss, b["input_ids"],
                                            sft_target_mask(b["labels"], b["position_ids"]).sum(1), num_tokens)
                aux_total += aux or 0.0
            backward(loss)
    stats = {"loss": distributed.total(total), "supervised_tokens": float(num_tokens)}
    if routers is not None:
        if routers.balancing_loss is not None:
            stats["aux_loss"] = distributed.total(aux_total)
        stats.update(routers.step_stats())
    return stats


def _pack_file(dataset: str | Path, split: str) -> Path:
    p = Path(dataset)
    return p if p.suffix == ".parquet" else p / f"{split}.parquet"


class WindowStream:
    """Training windows (:func:`pack_windows`) of ``packs``, epoch after epoch over a seeded shuffle.

    ``position`` counts the windows drawn (the data cursor); :meth:`seek` replays the stream to a
    position without counting, so a resumed run draws what the uninterrupted one would have.
    ``counts`` gets ``cropped_tokens`` and ``epochs``.

    Args:
        packs: ``(dataset, pack index)`` pairs; max_tokens: window length (``None``: whole packs);
        seed: the shuffle's seed; counts: the run's counters.
    """

    def __init__(self, packs: list[tuple[PackedDataset, int]], max_tokens: int | None, seed: int,
                 counts: dict[str, int]):
        self.packs, self.max_tokens, self.seed, self.counts = packs, max_tokens, seed, counts
        self.position, self._counting = 0, True
        self._windows = self._stream()

    def _stream(self) -> Iterator[dict[str, torch.Tensor]]:
        packs, rng = list(self.packs), random.Random(self.seed)
        while True:
            rng.shuffle(packs)
            for ds, i in packs:
                for window, cropped in pack_windows(ds[i], self.max_tokens):
                    if self._counting:
                        self.counts["cropped_tokens"] = self.counts.get("cropped_tokens", 0) + cropped
                    yield window
            if self._counting:
                self.counts["epochs"] = self.counts.get("epochs", 0) + 1

    def __next__(self) -> dict[str, torch.Tensor]:
        self.position += 1
        return next(self._windows)

    def seek(self, position: int) -> None:
        """Draw ``position`` windows from the start, uncounted (the resumed state holds the counts)."""
        self._windows, self._counting = self._stream(), False
        for _ in range(position):
            next(self._windows)
        self.position, self._counting = position, True


class SFTStage:
    """Stage runner ``sft`` (entry point ``cascade_rl.stages``).

    Args:
        config: :class:`SFTConfig`.
        environment: scores the per-domain RL validation (default: ``cfg.environment``).
    """

    config_class: ClassVar[type[SFTConfig]] = SFTConfig

    def __init__(self, config: SFTConfig, environment: Environment | None = None):
        self.cfg = config
        self.environment = environment

    def _windows(self, datasets: list[Path], split: str, counts: dict[str, int]) -> WindowStream:
        packs = [(ds, i) for ds in (PackedDataset(_pack_file(d, split)) for d in datasets) for i in range(len(ds))]
        if not packs:
            raise ValueError(f"stage {self.cfg.name}: no packs in {[str(d) for d in datasets]} ({split})")
        return WindowStream(packs, self.cfg.max_tokens, self.cfg.seed, counts)

    def run(self, datasets: list[Path], init_checkpoint: Path) -> StageResult:
        """Train ``cfg.steps`` optimizer steps from ``init_checkpoint``; returns checkpoint + metrics paths."""
        cfg = self.cfg
        with StageRun(cfg, datasets, init_checkpoint) as run:
            engine, pad = run.engine, run.tokenizer.pad_token_id or 0
            windows = run.resumable(self._windows(datasets, cfg.split, run.counts))
            per_rank = cfg.micro_batch_size * cfg.grad_accum
            for step in run.progress(cfg.steps):
                t0 = time.perf_counter()
                mine, _ = distributed.shard([next(windows) for _ in range(per_rank * distributed.world_size())],
                                            "micro_batch_size x grad_accum x ranks")
                micro = [collate_packed(mine[i:i + cfg.micro_batch_size], pad) for i in range(0, per_rank,
                                                                                             cfg.micro_batch_size)]
                stats = accumulate_sft(engine.model, engine.backward, micro, cfg.loss_chunk_tokens, run.routers)
                stats.update(engine.step())
                dt = time.perf_counter() - t0
                tokens = distributed.total(sum(b["input_ids"].numel() for b in micro))
                stats.update(step_s=dt, tokens_per_s=tokens / dt)
                run.log(step, stats)
            validation = self._validate(run, datasets, pad)
            return run.finish(validation, curves=("loss", "val_loss", "lr", "tokens_per_s"))

    @torch.no_grad()
    def _validate(self, run: StageRun, datasets: list[Path], pad: int) -> dict[str, dict[str, float]]:
        """``val_loss`` over the first ``validation_windows`` held-out windows, sharded over the ranks
        (window ``i`` on rank ``i % ranks``; ranks with fewer run a zero-weight window, since ZeRO-3
        forwards are collective), summed over ranks: the one-process number."""
        cfg = self.cfg
        model = run.engine.model
        run.engine.module.eval()
        windows = self._windows(datasets, "validation", {})
        held = [next(windows) for _ in range(cfg.validation_windows)]
        mine = held[distributed.rank()::distributed.world_size()]
        rounds = distributed.all_reduce_max(len(mine))
        nll = tokens = 0.0
        for i in range(rounds):
            window = mine[i] if i < len(mine) else held[0]
            window_nll, window_tokens = packed_nll(model, collate_packed([window], pad), cfg.loss_chunk_tokens)
            if i < len(mine):
                nll, tokens = nll + float(window_nll), tokens + window_tokens
        run.engine.module.train()
        total = distributed.all_reduce_sum({"nll": nll, "tokens": tokens})
        run.last["val_loss"] = total["nll"] / max(total["tokens"], 1.0)
        run.log_.rows[-1]["val_loss"] = run.last["val_loss"]
        validation: dict[str, dict[str, float]] = {}
        if cfg.eval.datasets:
            from stages.environment import PromptBuilder
            from stages.rollout import SamplingConfig

            rollout = run.rollout_engine(cfg.rollout_engine, SamplingConfig(batch_size=cfg.eval.batch_size))
            with run.engine.gathered():
                rollout.sync_weights(run.engine.module)  # the engine starts from the init checkpoint
            validation.update(run.validate(rollout, PromptBuilder(run.tokenizer, cfg.max_prompt_tokens),
                                           run.environment(cfg.environment, {}, self.environment)))
        return validation

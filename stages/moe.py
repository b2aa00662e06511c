"""Mixture-of-experts routers of the trained model: the load-balancing (auxiliary) loss and the expert load.

Routers are found as transformers finds them for ``output_router_logits``: the model class's
``_can_record_outputs["router_logits"]`` recorder (``Qwen3MoeTopKRouter``, Jamba's ``router`` linears,
``GraniteMoeHybridTopKRouter``, ``NemotronHTopkRouter``, ``MixtralTopKRouter``, ...). A dense model has
none: :func:`router_tap` returns ``None`` and nothing changes. :class:`RouterTap` hooks them while the
policy's forwards run (never during a backward, so recomputation under activation checkpointing is not
counted again) and reads each call's router logits and selected experts.

Auxiliary loss. The value is the model family's own ``load_balancing_loss_func`` from its transformers
module (Switch Transformer eqs. 4-6, ``E * sum_i f_i P_i`` with ``f_i`` the fraction of top-k
assignments and ``P_i`` the mean router probability of expert ``i`` over every MoE layer's tokens),
applied to each sequence over its real tokens: a packed SFT row without its padding; an RL sample's
prompt and response but the response's last token (only a target, which the prompt-shared forward of
:func:`stages.logprobs.response_logprobs` never runs), a prompt run once for the ``n`` samples of a
group counting in each of them, as it would unshared (the same value either way).
A stage adds ``coef * sum_rows aux_row * loss_tokens_row / window_loss_tokens`` to its loss
(:func:`weighted_aux`): the token-weighted mean over the accumulation window of every rank, under the
same normalization as the main loss, so one micro-batch of two rows equals two of one row and two
ranks equal one process. (HF's ``ForCausalLM`` applies the formula to a whole forward batch instead,
which makes the value depend on the micro-batch size; for one row the two are the same.)
``StageConfig.router_aux_loss_coef`` ``None`` takes the model config's ``router_aux_loss_coef`` (0 when
it has none). The logged ``aux_loss`` is the window value without the coefficient.

Auxiliary-loss-free routing (NemotronH: sigmoid router with an ``e_score_correction_bias`` buffer,
DeepSeek-V3 §2.1.2) has no such loss in transformers: its coefficient must stay 0. The bias is a buffer
the optimizer never touches, so by default it stays as loaded and ``expert_load_max_mean`` shows any
drift; ``router_bias_update_rate`` ``gamma > 0`` applies DeepSeek-V3's update
``b_i += gamma * sign(mean_j load_j - load_i)`` per layer after each optimizer step's accumulation, from the
step's all-reduced load (:func:`update_router_bias`), the same on every rank; buffers are saved with
the model and the training state, so a resumed run continues from the updated bias.

Expert load: tokens routed to each expert of each MoE layer (each real token a forward ran counts once
per selected expert), summed over an optimizer step's micro-batches and all data-parallel ranks (:meth:`RouterTap.load`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

from stages import distributed

_FORWARD_ROWS: ContextVar[torch.Tensor | None] = ContextVar("forward_rows", default=None)


@contextmanager
def forward_rows(rows: torch.Tensor) -> Iterator[None]:
    """The forwards run inside compute rows ``rows`` (int64 ``[n]``, positions in the micro-batch) of the
    micro-batch, in that order: how :meth:`RouterTap.take` assigns a continuation forward over some rows
    (a length run of :func:`stages.logprobs.response_logprobs`) to them."""
    token = _FORWARD_ROWS.set(rows)
    try:
        yield
    finally:
        _FORWARD_ROWS.reset(token)


def routers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every router of an HF model, in forward order: the modules
    transformers' own output recorder hooks for ``router_logits`` (``_can_record_outputs``; a class, or an
    ``OutputRecorder`` with ``target_class``/``class_name`` and an optional ``layer_name``). ``[]`` for a dense model."""
    specs = (getattr(module, "_can_record_outputs", None) or {}).get("router_logits")
    if specs is None:
        return []
    specs = specs if isinstance(specs, list) else [specs]
    found = []
    for name, m in module.named_modules():
        for spec in specs:
            cls, class_name = (spec, None) if isinstance(spec, type) else (spec.target_class, spec.class_name)
            layer = None if isinstance(spec, type) else spec.layer_name
            if not ((cls is not None and isinstance(m, cls)) or (class_name and name.endswith(class_name))):
                continue
            if layer is None or f".{layer.strip('.')}." in f".{name}.":
                found.append((name, m))
                break
    return found


def _output_index(module: nn.Module) -> int:
    spec = module._can_record_outputs["router_logits"]
    spec = spec[0] if isinstance(spec, list) else spec
    return 1 if isinstance(spec, type) else spec.index  # transformers' default index for a bare class


def aux_coefficient(module: nn.Module, coef: float | None) -> float:
    """The auxiliary-loss coefficient of a stage: ``coef`` (``router_aux_loss_coef`` of the stage config),
    else the model config's ``router_aux_loss_coef``, else 0 (also for a family without the loss).

    Raises:
        ValueError: ``coef > 0`` for a model whose transformers module has no ``load_balancing_loss_func``
            (auxiliary-loss-free routing, e.g. NemotronH).
    """
    if coef is None:
        own = getattr(module.config.get_text_config(), "router_aux_loss_coef", None)
        return float(own or 0.0) if _balancing_loss(module) is not None else 0.0
    if coef and _balancing_loss(module) is None:
        raise ValueError(f"router_aux_loss_coef: {type(module).__name__} has no load-balancing loss in "
                         "transformers (auxiliary-loss-free routing); set it to 0 or leave it unset")
    return float(coef)


def _balancing_loss(module: nn.Module) -> Any:
    return getattr(sys.modules[type(module).__module__], "load_balancing_loss_func", None)


class RouterTap:
    """Forward hooks on the routers of a trained model (:func:`routers`; use :func:`router_tap`).

    Inside :meth:`recording` every router call is kept (its logits with their graph and the experts it
    selected), and a pre-hook on the base model notes each forward's ``input_ids`` and real tokens;
    :meth:`take` turns them into per-row auxiliary losses and adds the expert load.

    Args:
        model: the HF module or a wrapper of it (an :class:`~stages.train_engine.Autocast`, a DeepSpeed engine).
        coef: the resolved coefficient (:func:`aux_coefficient`).
        bias_rate: ``router_bias_update_rate`` (:func:`update_router_bias` in :meth:`step_stats`; 0: off).
    """

    def __init__(self, model: Any, coef: float, bias_rate: float = 0.0):
        module = getattr(model, "module", model)
        self.coef, self.bias_rate, self.routers = coef, bias_rate, routers(module)
        self.top_k = module.config.get_text_config().num_experts_per_tok
        self.balancing_loss = _balancing_loss(module)
        self.experts = [getattr(m, "num_experts", None) or m.out_features for _, m in self.routers]
        self.counts = [torch.zeros(e, dtype=torch.int64) for e in self.experts]
        self._armed, self._real = False, None
        self._forwards: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[Any], torch.Tensor | None]] = []
        index = _output_index(module)
        self._handles = [m.register_forward_hook(self._hook(i, index)) for i, (_, m) in enumerate(self.routers)]
        self._handles.append(module.base_model.register_forward_pre_hook(self._pre_hook, with_kwargs=True))

    def _pre_hook(self, _m: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if not self._armed:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise ValueError("RouterTap: a forward without input_ids (inputs_embeds) cannot be assigned to rows")
        real = self._real
        if real is None:
            mask = kwargs.get("attention_mask")
            real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask[:, -ids.shape[1]:].bool()
        pos = kwargs.get("position_ids")
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids) if pos is None else pos
        self._forwards.append((ids, real.to(ids.device), pos, [None] * len(self.routers), _FORWARD_ROWS.get()))

    def _hook(self, layer: int, index: int) -> Any:
        def hook(_m: nn.Module, _args: tuple, out: Any) -> None:
            if not self._armed:
                return
            logits = out[index] if isinstance(out, tuple) else out
            chosen = next((t for t in out if not t.is_floating_point()), None) if isinstance(out, tuple) else None
            if chosen is None:  # a softmax router that returns its logits only (Jamba): top-k of the logits
                chosen = logits.topk(self.top_k, dim=-1).indices
            calls = self._forwards[-1][3]
            if calls[layer] is not None:
                raise RuntimeError(f"RouterTap: router {self.routers[layer][0]} ran twice in one forward (a backward "
                                   "recomputing checkpointed layers inside recording()?)")
            calls[layer] = (logits.reshape(-1, logits.shape[-1]), chosen.reshape(-1, self.top_k))
        return hook

    @contextmanager
    def recording(self, real: torch.Tensor | None = None) -> Iterator[RouterTap]:
        """Record the router calls of the forwards run inside (never a backward).

        Args:
            real: bool ``[B, T]``, the real tokens of the forward(s) inside (packed rows, which have no
                attention mask); default: each forward's ``attention_mask`` (its last ``T`` columns), else all.
        """
        self._armed, self._real = True, real
        try:
            yield self
        finally:
            self._armed, self._real = False, None

    def take(self, input_ids: torch.Tensor, count: bool = True, last: torch.Tensor | None = None
             ) -> torch.Tensor | None:
        """The auxiliary loss of each row of the micro-batch recorded since the last call; the recorded
        real tokens' expert choices are added to the step's load when ``count`` (False: a zero-weight
        padding micro-batch). ``last``: int ``[B]``, a position id per row whose token the loss leaves out
        (a response's last token, which only is a target: the prompt-shared forward never runs it).

        A recorded forward run inside :func:`forward_rows` belongs to those rows (a length run of the
        prompt-shared forward of :func:`stages.logprobs.response_logprobs`); any other over fewer rows than
        ``input_ids`` (``[B, T]``, the micro-batch's full rows) ran its distinct prompts: row ``b`` takes the
        recorded row equal to its first columns.

        Returns:
            float32 ``[B]`` with a graph (``load_balancing_loss_func`` per row over its real tokens), or
            ``None`` when the family has no such loss.

        Raises:
            RuntimeError: a recorded forward did not call every router once.
        """
        forwards, self._forwards = self._forwards, []
        per_row: list[list[list[torch.Tensor]]] = [[[] for _ in self.routers] for _ in range(len(input_ids))]
        for ids, real, pos, calls, rows_of in forwards:
            if any(c is None for c in calls):
                raise RuntimeError(f"RouterTap: a forward called {sum(c is not None for c in calls)} of "
                                   f"{len(calls)} routers")
            if rows_of is not None:  # (micro-batch row, recorded row) pairs
                pairs = list(zip(rows_of.tolist(), range(len(ids)), strict=True))
            elif len(ids) == len(input_ids):
                pairs = [(b, b) for b in range(len(ids))]
            else:  # the distinct prompts: the recorded row each full row starts with
                same = (input_ids[:, None, :ids.shape[1]].to(ids.device) == ids[None]).all(-1)
                pairs = list(enumerate(same.float().argmax(1).tolist()))
            flat = real.reshape(-1)
            for layer, (logits, chosen) in enumerate(calls):
                if count:
                    self.counts[layer] += torch.bincount(chosen[flat].reshape(-1), minlength=logits.shape[-1]).cpu()
                if self.balancing_loss is None:
                    continue
                by_row = logits.view(*real.shape, -1)
                for b, r in pairs:
                    keep = real[r] if last is None else real[r] & (pos[r] != last[b].to(pos.device))
                    per_row[b][layer].append(by_row[r][keep])
        if self.balancing_loss is None:
            return None
        return torch.stack([self.balancing_loss(tuple(torch.cat(parts) for parts in layers), layers[0][0].shape[-1],
                                                self.top_k).float() for layers in per_row])

    def load(self) -> dict[str, list[int]]:
        """Tokens per expert of each router (by module name) since the last call, summed over ranks
        (collective); resets the counts."""
        total = distributed.all_reduce_sum({f"{layer}/{e}": float(v) for layer, c in enumerate(self.counts)
                                            for e, v in enumerate(c.tolist())})
        self.counts = [torch.zeros(e, dtype=torch.int64) for e in self.experts]
        return {name: [round(total[f"{layer}/{e}"]) for e in range(n)]
                for layer, ((name, _), n) in enumerate(zip(self.routers, self.experts, strict=True))}

    def add_aux(self, loss: torch.Tensor, input_ids: torch.Tensor, row_tokens: torch.Tensor, window_tokens: float,
                count: bool = True, last: torch.Tensor | None = None) -> tuple[torch.Tensor, float | None]:
        """``loss`` of a micro-batch plus ``coef x`` its share of the window's auxiliary loss
        (:meth:`take` of the forwards recorded since the last call, :func:`weighted_aux` with ``row_tokens``
        int ``[B]``, the loss tokens of each row, over ``window_tokens``, those of every rank's window), and
        that share as a float (``None``: no such loss for this family). ``loss`` is returned as it is
        when ``coef`` is 0. ``count`` and ``last``: as in :meth:`take`."""
        aux = self.take(input_ids, count, last)
        if aux is None:
            return loss, None
        share = weighted_aux(aux, row_tokens, window_tokens)
        return (loss + self.coef * share if self.coef else loss), float(share.detach())

    def step_stats(self) -> dict[str, Any]:
        """End of an optimizer step's accumulation (collective): the step's :func:`load_stats` over all
        ranks, after the bias update when ``bias_rate`` is set (:func:`update_router_bias`)."""
        load = self.load()
        update_router_bias(self, load, self.bias_rate)
        return load_stats(load)

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()


def router_tap(model: Any, coef: float | None, bias_rate: float = 0.0) -> RouterTap | None:
    """A :class:`RouterTap` on ``model``'s routers with the stage's coefficient (:func:`aux_coefficient`)
    and bias update rate, or ``None`` for a model without routers (dense: no hooks, no cost). Close it when done.

    Raises:
        ValueError: ``bias_rate > 0`` for a model with no ``e_score_correction_bias`` (key
            ``router_bias_update_rate``), or :func:`aux_coefficient`'s error.
    """
    module = getattr(model, "module", model)
    found = routers(module)
    if not found:
        return None
    if bias_rate and not any(hasattr(m, "e_score_correction_bias") for _, m in found):
        raise ValueError(f"router_bias_update_rate: {type(module).__name__}'s routers have no "
                         "e_score_correction_bias to update (auxiliary-loss-free routing only)")
    return RouterTap(model, aux_coefficient(module, coef), bias_rate)


def weighted_aux(aux: torch.Tensor, row_tokens: torch.Tensor, window_tokens: float) -> torch.Tensor:
    """``sum_b aux[b] * row_tokens[b] / window_tokens``: a micro-batch's share of the window's
    token-weighted mean auxiliary loss (float32 scalar with ``aux``'s graph).

    >>> float(weighted_aux(torch.tensor([2.0, 1.0]), torch.tensor([3, 1]), 8))
    0.875
    """
    return (aux * row_tokens.to(aux.device, torch.float32)).sum() / max(window_tokens, 1.0)


def load_stats(load: dict[str, list[int]]) -> dict[str, Any]:
    """Step metrics of an expert load (:meth:`RouterTap.load`): ``expert_load_max_mean``, the largest
    ``max_i load_i / mean_i load_i`` over layers (1: balanced; ``E / top_k``: every token on the same
    experts), and ``expert_load``, the per-layer tokens per expert (kept in the step row, not plotted).

    >>> load_stats({"layers.0.gate": [3, 1, 0, 0]})["expert_load_max_mean"]
    3.0
    """
    ratios = [max(c) * len(c) / sum(c) for c in load.values() if sum(c)]
    return {"expert_load_max_mean": max(ratios, default=float("nan")), "expert_load": load}


def packed_real_tokens(labels: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """bool ``[B, T]``: the tokens of packed rows (:func:`packing.dataset.collate_packed`) that are not
    padding. Padding is a row's last segment (from its last position id 0) when none of its labels is
    supervised: every packed document has a supervised token (``packing.tokenize`` rejects the rest).

    >>> packed_real_tokens(torch.tensor([[-100, 5, -100, -100]]), torch.tensor([[0, 1, 0, 1]])).tolist()
    [[True, True, False, False]]
    """
    real = torch.ones_like(labels, dtype=torch.bool)
    for row in range(len(labels)):
        start = int((position_ids[row] == 0).nonzero().max())
        if (labels[row, start:] == -100).all():
            real[row, start:] = False
    return real


@torch.no_grad()
def update_router_bias(tap: RouterTap, load: dict[str, list[int]], rate: float) -> None:
    """DeepSeek-V3's auxiliary-loss-free balancing (arXiv:2412.19437, §2.1.2): per router with an
    ``e_score_correction_bias`` buffer, ``b_i += rate * sign(mean_j load_j - load_i)`` from the step's
    all-reduced ``load`` (so every rank updates alike). Routers without the buffer are left alone."""
    if not rate:
        return
    for name, router in tap.routers:
        bias = getattr(router, "e_score_correction_bias", None)
        if bias is None or name not in load:
            continue
        counts = torch.tensor(load[name], dtype=torch.float32, device=bias.device)
        bias.add_((counts.mean() - counts).sign().to(bias.dtype), alpha=rate)

"""Log-probabilities of sampled responses under a causal LM: the tensors every on-policy loss and
every scorer of rollouts (the policy, the KL reference, MOPD's teachers) starts from.

- :func:`policy_batch`: rollouts to left-padded prompt + right-padded response tensors;
- :func:`response_logprobs`: log pi(response token | prefix) at the sampling temperature, the LM head
  run in chunks over the response tokens only, with the rollouts of one prompt sharing its forward.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from stages import distributed
from stages.lm_head import final_hidden_states, head_logprobs, head_weight, model_device, partitioned
from stages.moe import forward_rows, routers
from stages.rollout import Rollouts
from stages.train_engine import compute_dtype, recomputes_layers


def policy_batch(rollouts: Rollouts, indices: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Training tensors for samples ``indices``: prompts left-padded, responses right-padded.

    Returns int64 ``input_ids``/``attention_mask``/``position_ids`` ``[B, P + R]``,
    ``response_ids`` ``[B, R]`` and bool ``response_mask`` ``[B, R]`` (``P``, ``R``: the
    longest prompt / response among ``indices``). Every response starts at column ``P``.
    """
    prompts = [rollouts.prompt_ids[i] for i in indices]
    responses = [rollouts.response_ids[i] for i in indices]
    p_w, r_w = max(map(len, prompts)), max(max(map(len, responses)), 1)
    ids, att, resp, rmask = [], [], [], []
    for p, r in zip(prompts, responses, strict=True):
        ids.append([pad_id] * (p_w - len(p)) + p + r + [pad_id] * (r_w - len(r)))
        att.append([0] * (p_w - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_w - len(r)))
        resp.append(r + [pad_id] * (r_w - len(r)))
        rmask.append([True] * len(r) + [False] * (r_w - len(r)))
    attention_mask = torch.tensor(att)
    return {"input_ids": torch.tensor(ids), "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_ids": torch.tensor(resp), "response_mask": torch.tensor(rmask)}


# Model types with recurrent (Mamba) cache layers whose mixers continue a multi-token forward from a cached
# conv/SSM state: equal log-probs and gradients shared and unshared (tests/test_model_families.py). Not
# Jamba: its Mamba-1 torch scan restarts from a zero state on any multi-token forward (transformers 5.19).
CONTINUES_RECURRENT_CACHE = frozenset({"nemotron_h", "granitemoehybrid"})
ZERO3_SHARES_MOE = frozenset({"nemotron_h"})  # MoE families whose shared forward trains under ZeRO-3
_warned: set[Any] = set()


def can_share_prompts(model: Any) -> bool:
    """Whether :func:`response_logprobs` may share prompt forwards on ``model`` (a DeepSpeed engine or DDP
    wrapper included): its cache has attention layers only, or its ``model_type`` is in
    :data:`CONTINUES_RECURRENT_CACHE`. Warns once per model type where it may not, with the reason."""
    config = getattr(model, "module", model).config
    if config.model_type in CONTINUES_RECURRENT_CACHE or not any(
            isinstance(layer, LinearAttentionCacheLayerMixin) for layer in DynamicCache(config=config).layers):
        return True
    if config.model_type not in _warned:
        _warned.add(config.model_type)
        warnings.warn(f"share_prompts off for model type {config.model_type!r}: its recurrent cache layers are not "
                      "known to continue a multi-token forward from a cached state (stages.logprobs."
                      "CONTINUES_RECURRENT_CACHE); each rollout runs its prompt itself", stacklevel=2)
    return False


def zero3_can_share(model: Any) -> bool:
    """Whether the prompt-shared forward may run on ``model`` under DeepSpeed ZeRO-3: a dense model, or an
    MoE family in :data:`ZERO3_SHARES_MOE`. Measured on 2 ranks (tests/test_model_families.py): Qwen3-MoE's
    experts (3-D weights indexed per routed expert) run in both forwards of the shared path get a gradient
    DeepSpeed reduces twice in one backward (``stage3.py``: ``len(set(p.ds_id ...)) ==
    len(params_in_bucket)`` fails); NemotronH's train. Warns once per model type where it may not."""
    hf = getattr(model, "module", model)
    if not routers(hf) or hf.config.model_type in ZERO3_SHARES_MOE:
        return True
    if ("zero3", hf.config.model_type) not in _warned:
        _warned.add(("zero3", hf.config.model_type))
        warnings.warn(f"share_prompts off for model type {hf.config.model_type!r} under DeepSpeed ZeRO-3: its "
                      "experts' gradients would be reduced twice (stages.logprobs.ZERO3_SHARES_MOE)", stacklevel=2)
    return False


def response_logprobs(model: Callable[..., Any], batch: dict[str, torch.Tensor], temperature: float = 1.0,
                      share_prompts: bool = True, chunk: int = 4096) -> torch.Tensor:
    """float32 ``[B, R]`` on the model's device: log pi(response token | prefix) at the sampling
    temperature; 0 where ``response_mask`` is False. ``batch`` (:func:`policy_batch`) may be on any device.

    Only the response tokens go through the LM head, ``chunk`` at a time
    (:func:`stages.lm_head.chunked_logprobs`): no ``[B, R, V]`` logits. Rows with the same prompt (the
    ``n`` rollouts of a prompt, equal left-padded columns ``[:P]``) share its forward when
    ``share_prompts``: the ``U`` distinct prompts run once with a KV cache, the cache is indexed out to
    the ``B`` rows (differentiably: gradients flow back into the prompt forward), and only the
    responses run per row; token for token the same log-probs and gradients as one forward over
    ``[B, P + R]`` (up to float reassociation), on ``U * P + B * R`` tokens instead of ``B * (P + R)``.
    The responses continue in runs of similar length (:func:`length_buckets`; each run from its own fork of
    the prompt cache, :func:`fork_cache`), so ``R`` is each run's longest response, not the batch's: the
    padding of short responses is not computed; an MoE model's router tap (:class:`stages.moe.RouterTap`)
    is told each run's rows (:func:`stages.moe.forward_rows`). ZeRO-3 (every rank must make the same module
    calls) continues in one run.
    Hybrid caches share too (attention keys/values and Mamba conv/SSM states indexed alike) where
    :func:`can_share_prompts` says so; other models run unshared.
    A model that recomputes its layers in the backward (activation checkpointing in training mode,
    :func:`stages.train_engine.recomputes_layers`) builds no KV cache: it never shares (warned once).

    Under DeepSpeed ZeRO-3 (partitioned parameters, gathered inside module calls, each call a
    collective every rank must make the same number of times) the ranks share prompts only when all of
    them can (one all-reduce), and the LM head runs as one module call
    (:func:`stages.lm_head.head_logprobs`).
    """
    batch = {k: v.to(model_device(model)) for k, v in batch.items()}
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    r_w = batch["response_ids"].shape[1]
    p_w = ids.shape[1] - r_w
    scored = batch["response_mask"].bool()
    prompts, inverse = torch.unique(ids[:, :p_w], dim=0, return_inverse=True)
    share = share_prompts and len(prompts) < len(ids) and r_w > 1 and can_share_prompts(model)
    if share and recomputes_layers(model):
        warnings.warn("gradient_checkpointing: the policy's rollouts are scored without the prompt-shared forward "
                      "(checkpointed layers build no KV cache in training mode)", stacklevel=2)
        share = False
    if partitioned(head_weight(model)):
        share = distributed.all_true(share and zero3_can_share(model))
    if not share:
        hidden, _ = final_hidden_states(model, input_ids=ids, attention_mask=mask, position_ids=pos)
        hidden = hidden[:, p_w - 1:-1]  # position t scores the token at t + 1
        hidden = hidden[scored]
    else:
        first = torch.empty(len(prompts), dtype=torch.long, device=ids.device).scatter_(
            0, inverse, torch.arange(len(ids), device=ids.device))  # any row of each prompt
        head, out = final_hidden_states(model, input_ids=prompts, attention_mask=mask[first, :p_w],
                                        position_ids=pos[first, :p_w], use_cache=True)
        lengths = scored.sum(1).tolist()
        buckets = [list(range(len(ids)))] if partitioned(head_weight(model)) else length_buckets(lengths)
        pieces, where = [], []
        rank = torch.zeros(scored.shape, dtype=torch.long, device=scored.device)  # each scored token's place
        rank[scored] = torch.arange(int(scored.sum()), device=scored.device)    # in row-major order
        for rows in buckets:
            width, at = max(1, *(lengths[i] for i in rows)), torch.tensor(rows, device=ids.device)
            cache = out.past_key_values if len(buckets) == 1 else fork_cache(out.past_key_values)
            cache.reorder_cache(inverse[at])  # every layer: keys/values and recurrent (Mamba conv, SSM) states
            part = head[inverse[at], -1:]  # scores each response's first token
            if width > 1:
                with forward_rows(at):
                    tail, _ = final_hidden_states(model, input_ids=ids[at, p_w:p_w + width - 1],
                                                  attention_mask=mask[at, :p_w + width - 1],
                                                  position_ids=pos[at, p_w:p_w + width - 1], past_key_values=cache,
                                                  use_cache=True)
                part = torch.cat([part, tail], dim=1)
            pieces.append(part[scored[at, :width]])
            where.append(rank[at, :width][scored[at, :width]])
        hidden = torch.cat(pieces)
        if len(buckets) > 1:  # back to the rows' order
            hidden = hidden[torch.argsort(torch.cat(where).to(hidden.device))]
    logprobs = torch.zeros(scored.shape, dtype=torch.float32, device=hidden.device)
    logprobs[scored] = head_logprobs(model, hidden, batch["response_ids"][scored], chunk, temperature,
                                     dtype=compute_dtype(model))
    return logprobs


BUCKET_TOKENS = 64  # what one more continuation forward costs, in padded tokens (length_buckets)


def length_buckets(lengths: list[int], cost: int | None = None, most: int = 4) -> list[list[int]]:
    """Rows (positions in ``lengths``, response token counts) grouped into at most ``most`` runs of similar
    length, each run later padded to its longest: the grouping of rows sorted by length that computes the
    fewest padded tokens, counting ``cost`` (default :data:`BUCKET_TOKENS`) more per run (dynamic programming
    over the sorted lengths). Each run lists its rows in ascending order."""
    cost = BUCKET_TOKENS if cost is None else cost
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    sizes = np.asarray(lengths, dtype=np.float64)[order]
    n = len(sizes)
    best = np.full((most + 1, n + 1), np.inf)  # best[k, j]: the first j sorted rows in k runs
    cut = np.zeros((most + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0
    for k in range(1, most + 1):
        for j in range(1, n + 1):  # the last run is rows i..j-1, padded to sizes[j - 1]
            c = best[k - 1, :j] + (j - np.arange(j)) * sizes[j - 1] + cost
            cut[k, j] = int(np.argmin(c))
            best[k, j] = c[cut[k, j]]
    k = int(np.argmin(best[1:, n])) + 1 if n else 0
    runs, j = [], n
    while k:
        i = int(cut[k, j])
        runs.append(sorted(order[i:j].tolist()))
        j, k = i, k - 1
    return runs[::-1]


def fork_cache(cache: Any) -> Any:
    """A copy of the KV/recurrent cache ``cache`` whose layers can be reordered and extended without touching
    ``cache``: its layer objects and their containers (a Mamba layer's dict of states) are copied, the
    tensors are shared (a reorder replaces them, it never writes into them)."""
    twin = copy.copy(cache)
    twin.layers = []
    for layer in cache.layers:
        new = copy.copy(layer)
        for name, value in vars(layer).items():
            if isinstance(value, dict | list):
                setattr(new, name, copy.copy(value))
        twin.layers.append(new)
    return twin

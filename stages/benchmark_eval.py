"""``cascade eval CHECKPOINT``: score a checkpoint on benchmark sets with the code that grades training.

Every benchmark of the chosen preset (params ``benchmarks``) is read as RL rows (:mod:`curation.benchmarks`),
its prompts rendered with the checkpoint's chat template (:class:`stages.environment.PromptBuilder`, the
trainer's), answered by the rollout engine and scored by the row's verifier (:class:`VerifierEnvironment`),
through :func:`stages.evaluate.score_rows`, the function that validates every stage:

* greedy: every prompt of a benchmark in one batched ``generate`` call, ``max_new_tokens`` per benchmark;
  the metric is the verifier's pass (IFEval / IFBench: prompt-level strict accuracy);
* pass@k: ``samples`` answers per prompt at ``temperature`` (top-p 1) in a second call, sample ``j`` of row
  ``i`` seeded ``seed + i * k + j`` on every checkpoint (common random numbers), so pass@k is the fraction
  of prompts with a passing answer among the k (Chen et al. 2021 with n = k) and ``pass@1@t`` the mean pass
  of the samples (the unbiased pass@1 at that temperature);
* intervals: 95 % percentile bootstrap over prompts (:mod:`stages.bootstrap`, 10,000 resamples); a delta
  between two checkpoints is paired on the prompts both answered (:func:`paired_deltas`).

A preset caps each benchmark to its first ``rows`` rows (file order: the same rows every run) and sets its
``max_new_tokens``; prompts over ``max_prompt_tokens`` are counted ``prompt_too_long``. Loading the rows
(and leaving out those a training split holds) and writing the result is :func:`curation.benchmarks.run_eval`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stages.bootstrap import interval


class BenchmarkCap(BaseModel):
    """One benchmark of a preset: its first ``rows`` rows (None: all) and the answer budget."""

    model_config = ConfigDict(extra="forbid")
    rows: int | None = Field(None, ge=1)
    max_new_tokens: int = Field(ge=1)


class EvalSettings(BaseModel):
    """params ``benchmarks``: the engine, the sampling of pass@k and the presets (``{name: {benchmark: cap}}``)."""

    model_config = ConfigDict(extra="forbid")
    preset: str = "laptop"
    engine: str = "auto"            # auto | vllm | hf (stages.rollout.make_rollout_engine)
    dtype: str = "bfloat16"         # the sampler's dtype
    samples: int = Field(4, ge=0)   # k of pass@k (0: greedy only)
    temperature: float = Field(0.6, gt=0.0)
    seed: int = 0
    max_prompt_tokens: int = Field(2048, ge=1)
    timeout_s: float = Field(10.0, gt=0)   # per-answer verifier wall clock
    presets: dict[str, dict[str, BenchmarkCap]]

    def caps(self, preset: str | None = None) -> dict[str, BenchmarkCap]:
        """The benchmarks of ``preset`` (default: :attr:`preset`).

        Raises:
            ValueError: an unknown preset or benchmark, naming the params key.
        """
        name = preset or self.preset
        if name not in self.presets:
            raise ValueError(f"params benchmarks.presets has no preset {name!r} (it has {sorted(self.presets)})")
        return self.presets[name]


def summarize(block: dict[str, Any]) -> dict[str, Any]:
    """The intervals of one benchmark's :func:`~stages.evaluate.score_rows` block: ``accuracy`` (greedy pass),
    ``pass@k`` and ``pass@1@t`` (samples), each ``{mean, ci_low, ci_high, n}``."""
    scores = block.get("scores")
    if not scores:
        return {}
    out = {"accuracy": interval([float(p) for p in scores["passed"]])}
    if "sample_passed" in scores:
        k = len(scores["sample_passed"][0])
        out[f"pass@{k}"] = interval([float(any(p)) for p in scores["sample_passed"]])
        out["pass@1@t"] = interval([sum(p) / k for p in scores["sample_passed"]])
    return out


def evaluate_checkpoint(checkpoint: str | Path, settings: EvalSettings, benchmarks: dict[str, dict[str, Any]],
                        rollout: Any = None, environment: Any = None) -> dict[str, Any]:
    """Score ``checkpoint`` on ``benchmarks`` (``{name: {"rows": [RL rows], "cap": BenchmarkCap, **counts}}``:
    the rows already held out and capped, ``counts`` such as ``in_training`` / ``rejects`` copied into the
    result; :func:`curation.benchmarks.run_eval` builds it).

    ``rollout`` (an engine with a ``tokenizer``) / ``environment`` replace the engine and the verifiers (tests);
    both are built from the checkpoint and closed here otherwise.

    Returns:
        ``{"checkpoint", "settings", "wall_s", "benchmarks": {name: {"rows", "prompt_too_long",
        "max_new_tokens", "response_tokens", "truncated", "ungraded", "accuracy": {mean, ci_low, ci_high, n},
        "pass@k", "pass@1@t", "scores": {...}, "wall_s", **counts}}}``.

    Raises:
        FileNotFoundError: no model at ``checkpoint``.
    """
    from stages.environment import PromptBuilder, VerifierEnvironment
    from stages.evaluate import score_rows

    start = time.time()
    own_engine, own_env = rollout is None, environment is None
    if own_engine:
        rollout = _engine(checkpoint, settings, max(b["cap"].max_new_tokens for b in benchmarks.values()))
    environment = environment or VerifierEnvironment(timeout_s=settings.timeout_s)
    out: dict[str, Any] = {}
    try:
        builder = PromptBuilder(rollout.tokenizer, settings.max_prompt_tokens)
        for name, bench in benchmarks.items():
            t0, cap = time.time(), bench["cap"]
            block = score_rows(rollout, builder, environment, bench["rows"], cap.max_new_tokens, settings.samples,
                               settings.temperature, settings.seed)
            counts = {k: v for k, v in bench.items() if k not in ("rows", "cap")}
            out[name] = {**block, **counts, "max_new_tokens": cap.max_new_tokens, **summarize(block),
                         "wall_s": round(time.time() - t0, 1)}
            print(f"{name}: {_line(out[name])}", flush=True)
    finally:
        if own_engine:
            rollout.close()
        if own_env and hasattr(environment, "close"):
            environment.close()
    return {"checkpoint": str(checkpoint), "settings": settings.model_dump(exclude={"presets"}),
            "wall_s": round(time.time() - start, 1), "benchmarks": out}


def _engine(checkpoint: str | Path, settings: EvalSettings, max_new_tokens: int) -> Any:
    """The rollout engine serving ``checkpoint`` (vLLM needs no trainer-side model; hf loads it)."""
    from stages.checkpoints import load_checkpoint
    from stages.rollout import SamplingConfig, make_rollout_engine, resolve_engine_name

    name = resolve_engine_name(settings.engine)
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=settings.temperature,
                              batch_size=64).for_dtype(settings.dtype)
    if name == "vllm":
        from transformers import AutoTokenizer

        if not (Path(checkpoint) / "config.json").exists():
            raise FileNotFoundError(f"no model at {checkpoint} (config.json missing)")
        return make_rollout_engine(name, None, AutoTokenizer.from_pretrained(str(checkpoint)), sampling,
                                   str(checkpoint))
    model, tokenizer = load_checkpoint(checkpoint)
    return make_rollout_engine(name, model.eval(), tokenizer, sampling, str(checkpoint))


def _line(block: dict[str, Any]) -> str:
    if "accuracy" not in block:
        return f"no row scored ({block['rows']} rows, {block['prompt_too_long']} too long)"
    a = block["accuracy"]
    text = f"accuracy {a['mean']:.3f} [{a['ci_low']:.3f}, {a['ci_high']:.3f}] n={a['n']}"
    for key in block:
        if key.startswith("pass@") and isinstance(block[key], dict):
            text += f", {key} {block[key]['mean']:.3f}"
    return text + f" ({block['wall_s']} s)"

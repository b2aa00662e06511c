"""``cascade train STAGE``: run one stage of the cascade from ``params.yaml``.

The ``cascade`` section of ``params.yaml``::

    cascade:
      model: data/assets/SmolLM2-135M-Instruct   # init of the first stage in `order`
      order: [sft, if_rl, multidomain_rl]        # each later stage starts from the previous checkpoint
      defaults: {...}                            # merged (recursively) under every stage's block
      stages:
        if_rl: {runner: grpo, datasets: [...], steps: 3, ...}

A stage outside ``order`` names its ``init`` (a checkpoint dir or a stage name). A stage reads the
difficulty-filtered copy of each set the filter measured (:func:`stages.datasets.resolve_datasets`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from stages.base import StageConfig, StageResult, StageRunner, build_runner
from stages.datasets import resolve_datasets
from validators.verifiers.sandbox import SandboxParams, require_from_params


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; ``over`` wins."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def stage_settings(params: dict[str, Any], stage: str) -> tuple[dict[str, Any], Path]:
    """The merged config block of ``stage`` and its init checkpoint.

    Raises:
        ValueError: no ``cascade`` section, unknown stage, or a stage outside ``order`` without ``init``.
    """
    cascade = params.get("cascade")
    if not cascade or stage not in cascade.get("stages", {}):
        known = sorted((cascade or {}).get("stages", {}))
        raise ValueError(f"no stage {stage!r} in params.yaml cascade.stages (known: {known})")
    settings = merge(cascade.get("defaults", {}), cascade["stages"][stage])
    root = Path(settings.get("checkpoint_root", "data/checkpoints"))
    order = cascade.get("order", [])
    init = settings.pop("init", None)
    if init is None:
        if stage not in order:
            raise ValueError(f"cascade.stages.{stage}: not in cascade.order, so it needs an 'init' checkpoint")
        i = order.index(stage)
        init = cascade["model"] if i == 0 else root / order[i - 1]
    elif init in cascade["stages"]:
        init = root / init
    return settings, Path(init)


def train(stage: str, params: dict[str, Any], restart: bool = False) -> StageResult:
    """Build the stage's runner from params and run it: from the latest training state of a killed run
    of the same config and inputs (:mod:`stages.state`), or from the start with ``restart``."""
    settings, init = stage_settings(params, stage)
    # generated code runs in the verifiers' sandbox: never weaker than asked
    require_from_params(SandboxParams.from_block(params.get("sandbox")))
    runner = build_runner(stage, settings)
    if restart:
        shutil.rmtree(runner.cfg.state_dir, ignore_errors=True)
    if not runner.cfg.enabled:
        return pass_through(runner, init)
    return runner.run(resolve_datasets(settings["datasets"]), init)


def pass_through(runner: StageRunner, init: Path) -> StageResult:
    """A disabled stage (``enabled: false``): its checkpoint is ``init`` unchanged, its record keeps the
    init's validation (and per-prompt scores) and counts ``skipped: 1``, so the next stage and
    ``cascade report`` see it. An init without a record (the base model) is validated here on the
    runner's ``cfg.eval`` (with its ``environment`` when it has one), so the first trained stage has a
    baseline to be compared with."""
    from stages.checkpoints import read_record, read_scores
    from stages.evaluate import SCORES
    from stages.runtime import StageRun

    cfg, record = runner.cfg, read_record(init)
    with StageRun(cfg, [], init) as run:
        run.counts["skipped"] = 1
        if record is None and cfg.eval.datasets:
            return run.finish(_validate_base(run, cfg, runner.environment), curves=())
        validation, scores = (record or {}).get("validation", {}), read_scores(init)
        return run.finish({d: {**m, **({SCORES: scores[d]} if d in scores else {})} for d, m in validation.items()},
                          curves=())


def _validate_base(run: Any, cfg: StageConfig, environment: Any = None) -> dict[str, dict[str, Any]]:
    """Validation of the run's (untrained) policy on ``cfg.eval`` with its rollout engine, scored by
    ``environment`` (else the config's ``environment``, if it has one and it scores single answers, else
    the verifiers: :meth:`~stages.runtime.StageRun.validation_environment`)."""
    from stages.environment import PromptBuilder, grades_responses
    from stages.rollout import SamplingConfig

    sampling = getattr(cfg, "sampling", None) or SamplingConfig(batch_size=cfg.eval.batch_size)
    rollout = run.rollout_engine(cfg.rollout_engine, sampling)
    builder = PromptBuilder(run.tokenizer, getattr(cfg, "max_prompt_tokens", 1024))
    name, kwargs = getattr(cfg, "environment", "verifiers"), getattr(cfg, "environment_kwargs", {})
    if not grades_responses(name):  # never load a judge only to hand validation to the verifiers
        name, kwargs = "verifiers", {}
    return run.validate(rollout, builder, run.validation_environment(run.environment(name, kwargs, environment)))


def describe_stages(params: dict[str, Any]) -> str:
    """Every installed stage runner with its config fields (type and default), then the stages of
    ``params``' ``cascade`` block with their runner and the keys they set: what ``cascade stages`` prints."""
    from common import plugins

    lines = []
    for name in plugins.names("stages"):
        cls = plugins.load("stages", name)
        lines.append(f"runner {name} ({cls.__module__}.{cls.__name__}, config {cls.config_class.__name__}):")
        for field, info in cls.config_class.model_fields.items():
            default = "required" if info.is_required() else repr(info.get_default(call_default_factory=True))
            kind = getattr(info.annotation, "__name__", str(info.annotation))
            lines.append(f"  {field}: {kind} = {default}")
    cascade = params.get("cascade") or {}
    order = cascade.get("order", [])
    lines.append(f"stages in params.yaml (order: {' -> '.join(order)}):")
    for name, block in (cascade.get("stages") or {}).items():
        keys = ", ".join(k for k in block if k != "runner")
        lines.append(f"  {name}: runner {block.get('runner')}; sets {keys}")
    return "\n".join(lines)

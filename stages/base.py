"""The stage-runner seam: a typed config, a ``run`` method, and a registry of runners.

A runner is found by name in the entry-point group ``cascade_rl.stages`` (declared in
``pyproject.toml``), so a third party adds a stage by installing a package with

    [project.entry-points."cascade_rl.stages"]
    my_stage = "my_pkg.stage:MyStage"

``cascade train STAGE`` reads ``params.yaml``'s ``cascade.stages.STAGE`` (its ``runner``
names the entry point; every other key goes into the runner's ``config_class``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common import plugins
from stages.train_engine import OptimConfig

if TYPE_CHECKING:
    from stages.environment import Environment


class EvalConfig(BaseModel):
    """Per-domain validation on held-out RL slices (``<set>/validation.parquet``, :mod:`stages.evaluate`):
    greedy answers, plus ``samples`` answers per prompt at ``temperature`` for pass@k (``k = samples``)."""

    model_config = ConfigDict(extra="forbid")
    datasets: list[str] = Field(default_factory=list)  # RL set dirs; one metric block per domain
    rows: int = Field(8, ge=0)                          # first rows of each validation split
    # or {domain: tokens} (the set's directory name)
    max_new_tokens: Annotated[int, Field(ge=1)] | dict[str, Annotated[int, Field(ge=1)]] = 64
    batch_size: int = Field(8, ge=1)
    samples: int = Field(0, ge=0)                       # k of pass@k (0: greedy answers only)
    temperature: float = Field(1.0, gt=0.0)             # of the sampled answers
    seed: int = 0                                       # sample j of row i draws seed + i * k + j, on every checkpoint
    max_prompt_tokens: int | None = Field(None, ge=1)   # longer prompts are not scored (None: the stage's budget);
                                                        # set it so every stage scores the same rows


class StageConfig(BaseModel):
    """Knobs every stage shares; runners subclass it."""

    model_config = ConfigDict(extra="forbid")
    name: str
    runner: str = Field(json_schema_extra={"plugin": "stages"})
    enabled: bool = True  # False: the stage passes its init checkpoint through (stages/cli.py)
    datasets: list[str]
    seed: int = 0
    steps: int = Field(1, ge=1)  # optimizer steps
    train_engine: str = Field("torch", json_schema_extra={"plugin": "train_engines"})  # torch | deepspeed
    zero_stage: int = Field(2, ge=0, le=3)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    # multi-turn episode rows (validators.episodes; BFCL multi-turn, ToolTalk, SWE): {agent_ref: the episode
    # environment's factory kwargs} (tools: {episodes: validators.tools.environment.ToolEnvConfig fields}),
    # and the context an episode may fill (prompt, model turns, tool and user turns; past it: finish `context`)
    episodes: dict[str, dict[str, Any]] = Field(default_factory=dict)
    max_context_tokens: int = Field(4096, ge=1)
    checkpoint_root: str = "data/checkpoints"
    metrics_dir: str = "metrics/train"
    plots_dir: str = "plots"
    # torch intra-op threads (None: every core of the rank's share, stages.distributed.cpu_share; the rollout
    # engine binds the same cores and runs while the trainer waits)
    threads: int | None = Field(None, ge=1)
    # the rank's device: auto (cuda where torch sees a GPU, else cpu) | cpu | cuda (cuda:LOCAL_RANK)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # bfloat16: policy, reference and teachers run under autocast with fp32 weights (master weights,
    # AdamW state; stages.train_engine.in_precision), a vllm sampler in bf16 and
    # sampling.max_logprob_diff BF16_LOGPROB_DIFF (SamplingConfig.for_dtype); float32 by default
    dtype: Literal["float32", "bfloat16"] = "float32"
    # the trained policy's parameters: float32 (under autocast when dtype is bfloat16), or bfloat16 with dtype
    # bfloat16: bf16 forward and backward without autocast's casts, fp32 master weights and AdamW state
    # (stages.master_weights; train_engine torch)
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    # the trainer's attention kernel for the policy, reference and teachers (transformers' attn_implementation:
    # sdpa | eager | flash_attention_2 | ...; None: the checkpoint's default, sdpa). On CPU, sdpa runs its math
    # kernel on rows of up to 128 keys (short RL rollouts) and its flash kernel beyond (stages.sdpa)
    attn_implementation: str | None = None
    # sampler of rollouts / validation answers: auto (vllm where installed, else hf)
    rollout_engine: str = Field("auto", json_schema_extra={"plugin": "rollout_engines"})
    # partial-layer mode: train only the top N decoder layers and the final norm (None: every parameter);
    # the backward stops below them (stages.train_engine.train_top_layers)
    trainable_layers: int | None = Field(None, ge=1)
    # MoE models (stages/moe.py): coefficient of the router load-balancing loss added to the loss, a
    # token-weighted mean over the window as the loss is (None: the model config's router_aux_loss_coef,
    # 0 where it has none; must be 0 for auxiliary-loss-free routers such as NemotronH's); and DeepSeek-V3's
    # bias update rate gamma of e_score_correction_bias after every step (0: the bias stays as loaded)
    router_aux_loss_coef: float | None = Field(None, ge=0)
    router_bias_update_rate: float = Field(0.0, ge=0)
    # activation checkpointing of the trained policy's decoder layers (stages.train_engine.checkpoint_activations):
    # one more forward per backward for activations of one layer at a time; the RL losses then score
    # rollouts without sharing prompt forwards (checkpointed layers build no KV cache)
    gradient_checkpointing: bool = False
    loss_chunk_tokens: int = Field(4096, ge=1)  # tokens per LM-head chunk of the losses (stages/lm_head.py)
    save_every: int = Field(10, ge=0)  # training state every N optimizer steps and at the last (0: last only)
    keep_last: int = Field(2, ge=1)    # training states kept (stages/state.py)

    @model_validator(mode="after")
    def _bf16_params_need_bf16(self) -> StageConfig:
        if self.param_dtype == "bfloat16" and self.dtype != "bfloat16":
            raise ValueError(f"stage {self.name}: param_dtype bfloat16 needs dtype bfloat16 (got dtype {self.dtype})")
        return self

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint_root) / self.name

    @property
    def state_dir(self) -> Path:
        """Where the training states of a run live until it finishes (:mod:`stages.state`)."""
        return Path(self.checkpoint_root) / ".states" / self.name

    @property
    def live_dir(self) -> Path:
        """The live step metrics (dvclive files and ``steps.jsonl``, :class:`stages.metrics.MetricsLog`)."""
        return Path(self.metrics_dir) / self.name


@dataclass
class StageResult:
    """What a run leaves behind: the checkpoint directory and its metrics JSON."""

    checkpoint: Path
    metrics: Path
    summary: dict[str, Any]


class StageRunner(Protocol):
    """A cascade stage: ``Runner(config, environment=None).run(datasets, init_checkpoint)``.

    Attributes:
        config_class: the runner's config (a :class:`StageConfig`); a field whose value names a plugin
            says so in its metadata (``json_schema_extra={"plugin": "<kind>"}``, the entry-point group
            ``cascade_rl.<kind>``), which is how ``tests/test_dvc_deps.py`` finds a stage's code.
        cfg: the validated config of this stage (``cascade train`` reads ``enabled``, ``state_dir``, ``eval``).
        environment: the environment the runner was given (tests, benchmarks, a library caller), or
            ``None``: the runner builds its config's own, if it has one.
    """

    config_class: ClassVar[type[StageConfig]]
    cfg: StageConfig
    environment: Environment | None

    def __init__(self, config: StageConfig, environment: Environment | None = None) -> None: ...

    def run(self, datasets: list[Path], init_checkpoint: Path) -> StageResult:
        """Train from ``init_checkpoint`` (an HF model dir) on ``datasets``; write checkpoint + metrics."""


def get_runner(name: str) -> type[StageRunner]:
    """The runner class installed as ``name`` (entry-point group ``cascade_rl.stages``, :mod:`common.plugins`).

    Raises:
        ValueError: unknown name (the message lists the installed runners and how to add one).
    """
    return plugins.load("stages", name)


def build_runner(name: str, settings: dict[str, Any]) -> StageRunner:
    """The runner for stage ``name`` configured from its params block (``runner`` + config keys).

    Raises:
        ValueError: missing ``runner`` key, unknown runner, or a config error naming the field.
    """
    from pydantic import ValidationError

    if "runner" not in settings:
        raise ValueError(f"cascade.stages.{name}: missing 'runner' (one of {plugins.names('stages')})")
    cls = get_runner(settings["runner"])
    try:
        config = cls.config_class.model_validate({"name": name, **settings})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"cascade.stages.{name}.{where}: {first['msg']}") from None
    return cls(config)

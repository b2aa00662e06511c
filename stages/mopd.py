"""Multi-domain on-policy distillation (MOPD), the recipe's §MOPD (Nemotron-Cascade 2, arXiv 2603.19220).

Per optimizer step:
  1. take ``prompts_per_step`` rows (seeded shuffle of the stage's RL sets, cycled);
  2. the student samples ``rollouts_per_prompt`` responses per prompt with the rollout engine (episodes
     for multi-turn rows, :mod:`stages.episodes`: the teacher scores the whole trajectory, only the
     student's own tokens are trained); the engine's log-probs are pi^inf;
  3. each row's ``domain`` picks its teacher (:func:`resolve_teachers`); the teachers score the
     sampled tokens with an HF forward (no grad), loaded one at a time or kept within
     ``teacher_memory_mb`` (:class:`TeacherPool`);
  4. per trained token (:func:`mopd_loss`)::

         a_t = log pi_teacher(y_t) - log pi_train(y_t)              detached
         r_t = pi_train(y_t) / pi_inf(y_t)
         w_t = sg[r_t] * 1[lo <= r_t <= hi]                          ICE-POP: dropped, not clipped
         L   = -(1/N) sum_t w_t * a_t * log pi_train(y_t)            N: response tokens of the step

     one backward per micro-batch (``N`` counts the whole accumulation window), then ONE optimizer
     step. No reward, no group baseline, no KL term: the gradient is sampled-token reverse-KL
     minimisation toward each domain's teacher.

At start every teacher must share the student's vocabulary (:func:`check_vocabulary`). Validation is
the per-domain verifiable validation of the GRPO stages (``eval`` in the config).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import Field, field_validator

from common.io import write_json
from stages import distributed
from stages.base import StageConfig, StageResult
from stages.checkpoints import RECORD, CheckpointRegistry, load_checkpoint, read_record
from stages.environment import Environment, PromptBuilder
from stages.episodes import collector
from stages.logprobs import policy_batch, response_logprobs
from stages.losses import aggregate, get_distillation_loss, kl_k3
from stages.onpolicy import Experience, OnPolicyLoop, SingleTurn, train_prompts
from stages.rollout import Rollouts, SamplingConfig
from stages.runtime import StageRun
from stages.train_engine import in_precision


class MOPDConfig(StageConfig):
    """One MOPD stage (defaults: the recipe's MOPD row, scaled down for a laptop)."""

    prompts_per_step: int = Field(4, ge=1)         # paper: 128
    rollouts_per_prompt: int = Field(4, ge=1)      # paper: 4
    micro_batch_size: int = Field(8, ge=1)         # sequences per forward/backward
    max_prompt_tokens: int = Field(1024, ge=1)     # longer prompts are dropped and counted
    max_rows_per_dataset: int | None = Field(None, ge=1)  # first rows of each train set (None: all)
    loss: str = Field("mopd", json_schema_extra={"plugin": "distillation_losses"})
    is_bounds: tuple[float, float] = (0.5, 2.0)    # ICE-POP bounds on r = pi_train / pi_inf (2°)
    teachers: dict[str, str] = Field(default_factory=dict)  # domain -> stage name or checkpoint dir
    teacher_metric: str = "reward"                 # validation metric that ranks default teachers
    teacher_memory_mb: float = Field(0.0, ge=0)    # teachers kept loaded together (0: one at a time)
    mask_truncated: bool = False                   # a truncated response still has per-token signal
    share_prompts: bool = True  # score a prompt's rollouts from one prompt forward (stages.logprobs.response_logprobs)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)  # recipe: temperature 1, top-p 1
    # scores validation and the samples' reward curve (not trained on)
    environment: str = Field("verifiers", json_schema_extra={"plugin": "environments"})
    environment_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("is_bounds")
    @classmethod
    def _bounds(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 < v[0] <= 1.0 <= v[1]:
            raise ValueError(f"needs 0 < lo <= 1 <= hi, got {list(v)}")
        return v


def distill_advantages(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """``a_t = log pi_teacher - log pi_student`` per sampled token, detached (recipe §MOPD).

    The negative of the per-token ``k1`` estimate of the reverse KL ``KL(student || teacher)``: under
    tokens sampled from the student, ``E[-a_t]`` is the exact reverse KL (handed case DISTILL-01).
    Shapes ``[B, T]`` float (nats); returns float ``[B, T]`` without a graph.
    """
    return (teacher_logprobs - logprobs).detach()


def ice_pop_weights(logprobs: torch.Tensor, inf_logprobs: torch.Tensor, mask: torch.Tensor,
                    bounds: tuple[float, float] = (0.5, 2.0)) -> tuple[torch.Tensor, torch.Tensor]:
    """ICE-POP importance weights ``w_t = sg[r_t] * 1[lo <= r_t <= hi]``, ``r_t = pi_train / pi_inf``.

    Tokens whose ratio leaves ``[lo, hi]`` are dropped (weight 0), never clipped to the bound
    (recipe §MOPD; IcePop of the Ring-1T report). Masked positions get weight 0.

    Args:
        logprobs: float ``[B, T]`` log pi_train of the sampled tokens.
        inf_logprobs: float ``[B, T]`` log pi_inf reported by the rollout engine.
        mask: bool ``[B, T]`` response tokens.
    Returns:
        ``(weights, kept)``: float ``[B, T]`` without a graph, and bool ``[B, T]`` (in mask and in bounds).
    """
    ratio = torch.exp(logprobs.detach() - inf_logprobs)
    kept = mask.bool() & (ratio >= bounds[0]) & (ratio <= bounds[1])
    return torch.where(kept, ratio, torch.zeros_like(ratio)), kept


def mopd_loss(logprobs: torch.Tensor, inf_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
              mask: torch.Tensor, *, num_tokens: float | None = None,
              is_bounds: tuple[float, float] = (0.5, 2.0)) -> tuple[torch.Tensor, dict[str, float]]:
    """MOPD loss ``-(1/N) sum_t w_t * sg[a_t] * log pi_train(y_t)`` (recipe §MOPD).

    ``N`` is ``num_tokens`` (the response tokens of the whole accumulation window; default
    ``mask.sum()``): tokens dropped by ICE-POP contribute 0 and still count in ``N``, so summing
    the micro-batch losses of a window gives the loss of the window as one batch.

    Args:
        logprobs: float ``[B, T]`` log pi_train with a graph; inf_logprobs / teacher_logprobs: float
            ``[B, T]`` of the sampler and of the row's teacher; mask: bool ``[B, T]`` trained tokens.
    Returns:
        ``(loss, stats)``; stats (token means over ``mask``, normalized by ``N``): ``reverse_kl``
        (k1 = -a_t), ``reverse_kl_k3`` (:func:`stages.losses.kl_k3` toward the teacher),
        ``is_dropped`` (fraction of tokens outside the bounds), ``is_ratio`` (mean r_t), ``entropy``
        (mean -log pi_train of the sampled tokens: the Monte-Carlo estimate of the per-token entropy).
    """
    mask = mask.bool()
    weights, kept = ice_pop_weights(logprobs, inf_logprobs, mask, is_bounds)
    adv = torch.where(kept, distill_advantages(logprobs, teacher_logprobs), torch.zeros_like(weights))
    loss = aggregate(-(weights * adv * logprobs), mask, "token_mean", num_tokens)
    lp, ratio = logprobs.detach(), torch.exp(logprobs.detach() - inf_logprobs)

    def mean(x: torch.Tensor) -> float:
        return float(aggregate(x, mask, "token_mean", num_tokens))

    return loss, {"reverse_kl": mean(lp - teacher_logprobs), "reverse_kl_k3": mean(kl_k3(lp, teacher_logprobs)),
                  "is_dropped": mean((mask & ~kept).float()), "is_ratio": mean(ratio), "entropy": mean(-lp)}


def resolve_teachers(domains: list[str], init_checkpoint: str | Path, checkpoint_root: str | Path,
                     pinned: dict[str, str], metric: str = "reward") -> dict[str, Path]:
    """``{domain: teacher checkpoint dir}`` for every domain of the stage's prompts.

    A pinned teacher (``pinned[domain]``) is a stage name under ``checkpoint_root`` or a model dir.
    Otherwise the teacher is the recorded checkpoint with the best ``validation[domain][metric]``
    among the earlier stages of the student's lineage (``cascade_checkpoint.json`` of
    ``init_checkpoint``; ties go to the later stage, the one closest to the student).

    Raises:
        ValueError: a domain has no pinned teacher and no checkpoint of the lineage was validated on it.
    """
    root = Path(checkpoint_root)
    record = read_record(init_checkpoint)
    lineage = record["lineage"] if record else []
    registry = CheckpointRegistry(root)
    out: dict[str, Path] = {}
    for domain in domains:
        if domain in pinned:
            out[domain] = root / pinned[domain] if (root / pinned[domain] / RECORD).exists() else Path(pinned[domain])
            continue
        try:
            out[domain] = registry.best(domain, metric, stages=lineage)
        except LookupError:
            raise ValueError(f"no teacher for domain {domain!r}: no checkpoint of the student's lineage {lineage} "
                             f"under {root} has validation metric {metric!r} for it; pin one in the stage's "
                             f"'teachers' ({{{domain}: STAGE_OR_DIR}})") from None
    return out


def check_vocabulary(student: torch.nn.Module, student_tokenizer: Any, student_dir: str | Path,
                     teacher_dir: str | Path, domain: str) -> None:
    """Fail unless the teacher shares the student's vocabulary (embedding rows and token -> id map).

    Token ids are compared as ids (recipe pitfall: student and teacher ids must come from the same
    vocabulary), so a teacher with a different tokenizer would score the wrong tokens.

    Raises:
        FileNotFoundError: ``teacher_dir`` is not a model dir.
        ValueError: naming the teacher, the domain, the student and the first difference.
    """
    from transformers import AutoConfig, AutoTokenizer

    teacher_dir = Path(teacher_dir)
    if not (teacher_dir / "config.json").exists():
        raise FileNotFoundError(f"teacher {teacher_dir} for domain {domain!r}: no model there (config.json missing)")
    head = f"teacher {teacher_dir} (domain {domain!r}) and student {student_dir} do not share a vocabulary"
    weight = student.get_output_embeddings().weight
    s_size = getattr(weight, "ds_shape", weight.shape)[0]  # a ZeRO-3 parameter holds only its partition
    t_size = AutoConfig.from_pretrained(teacher_dir).get_text_config().vocab_size
    if s_size != t_size:
        raise ValueError(f"{head}: vocab_size {t_size} vs {s_size}")
    s_vocab, t_vocab = student_tokenizer.get_vocab(), AutoTokenizer.from_pretrained(teacher_dir).get_vocab()
    if s_vocab != t_vocab:
        diff = min(set(s_vocab.items()) ^ set(t_vocab.items()), key=lambda kv: kv[1])[0]
        raise ValueError(f"{head}: tokenizers have {len(t_vocab)} vs {len(s_vocab)} tokens; token {diff!r} is id "
                         f"{t_vocab.get(diff)} in the teacher and {s_vocab.get(diff)} in the student")


def _weights_mb(path: Path) -> float:
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in path.glob(pattern)) / 2**20


class TeacherPool:
    """Frozen teacher models loaded on demand (fp32 weights, ``attn_implementation`` as the stage's) and run in
    ``dtype`` (``float32`` | ``bfloat16``: :func:`~stages.train_engine.in_precision`); least recently used
    ones are freed to keep the weights of the loaded teachers within ``memory_mb`` (0: one teacher at a time).

    Attributes:
        loads: how many times a teacher was loaded from disk (a stage metric).
    """

    def __init__(self, memory_mb: float = 0.0, dtype: str = "float32", device: torch.device | str = "cpu",
                 attn_implementation: str | None = None):
        self.memory_mb, self.dtype, self.device, self.loads = memory_mb, dtype, device, 0
        self.attn_implementation = attn_implementation
        self.loaded: OrderedDict[Path, tuple[Any, float]] = OrderedDict()

    def get(self, path: Path) -> Any:
        """The teacher at ``path`` in eval mode without gradients (loaded if needed)."""
        if path in self.loaded:
            self.loaded.move_to_end(path)
            return self.loaded[path][0]
        need = _weights_mb(path)
        while self.loaded and sum(mb for _, mb in self.loaded.values()) + need > self.memory_mb:
            self.loaded.popitem(last=False)
        model, _ = load_checkpoint(path, self.attn_implementation)
        model.to(self.device).eval().requires_grad_(False)
        model = in_precision(model, model, self.dtype)
        self.loaded[path] = (model, need)
        self.loads += 1
        return model


@torch.no_grad()
def teacher_logprobs(pool: TeacherPool, teachers: list[Path], rollouts: Rollouts, micro_batch_size: int,
                     pad_id: int, temperature: float = 1.0) -> list[torch.Tensor]:
    """Per sample, float ``[len(response)]``: log pi_teacher of the sampled tokens at ``temperature``
    (the sampling temperature; the recipe samples at 1), ``teachers[i]`` scoring sample ``i``; each
    teacher is fetched once per call and scores its samples in micro-batches."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(rollouts)
    for path in dict.fromkeys(teachers):
        model = pool.get(path)
        mine = [i for i, t in enumerate(teachers) if t == path]
        for start in range(0, len(mine), micro_batch_size):
            chunk = mine[start:start + micro_batch_size]
            lp = response_logprobs(model, policy_batch(rollouts, chunk, pad_id), temperature)
            for row, i in enumerate(chunk):
                out[i] = lp[row, :len(rollouts.response_ids[i])]
    return out


def _padded(rows: list[torch.Tensor | list[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for r, values in enumerate(rows):
        out[r, :len(values)] = torch.as_tensor(values, dtype=torch.float32)
    return out


class Distillation:
    """The MOPD algorithm of the on-policy loop (:class:`stages.onpolicy.Algorithm`): each sample's
    teacher (its row's domain) scores the sampled tokens, every sample is trained (truncated ones too,
    unless ``cfg.mask_truncated``), with ``cfg.loss`` (a :class:`~stages.losses.DistillationLossFn`) of the
    student, sampler and teacher log-probs. Step metrics: ``reverse_kl/<domain>`` (k1 with the sampler's
    log-probs, over the global batch) and ``teacher_s``.

    Args:
        cfg: the stage's :class:`MOPDConfig`; teachers: ``{domain: checkpoint dir}``; pool: where they load.
        pad_id: the rollout engine's pad token.
    """

    curves = ("reward_mean", "loss", "entropy", "reverse_kl", "is_dropped", "response_tokens")

    def __init__(self, cfg: MOPDConfig, teachers: dict[str, Path], pool: TeacherPool, pad_id: int):
        self.cfg, self.teachers, self.pool, self.pad_id = cfg, teachers, pool, pad_id
        self.loss_fn = get_distillation_loss(cfg.loss)

    def prepare(self, experience: Experience) -> tuple[list[int], dict[str, float]]:
        """Teacher log-probs of every sample; the samples trained."""
        t0, ro, rows = time.perf_counter(), experience.rollouts, experience.rows
        self.rollouts = ro
        self.teacher_lps = teacher_logprobs(self.pool, [self.teachers[r["domain"]] for r in rows], ro,
                                            self.cfg.micro_batch_size, self.pad_id, self.cfg.sampling.temperature)
        indices = [i for i in range(len(ro)) if not (self.cfg.mask_truncated and ro.truncated[i])]
        # per sample: domain, trained tokens, their sum of sampler - teacher log-probs (k1); an episode's
        # tool and user turns are not the student's tokens (loss mask 0)
        masks = [torch.tensor(m, dtype=torch.float32) for m in experience.masks()]
        samples = distributed.gather([(r["domain"], float(masks[i].sum()), float(
            ((torch.tensor(ro.logprobs[i]) - self.teacher_lps[i].cpu()) * masks[i]).sum())) for i, r in enumerate(rows)])
        stats: dict[str, float] = {}
        for domain in sorted({s[0] for s in samples}):
            mine = [s for s in samples if s[0] == domain]
            stats[f"reverse_kl/{domain}"] = sum(s[2] for s in mine) / max(sum(s[1] for s in mine), 1)
        return indices, {**stats, "teacher_s": time.perf_counter() - t0}

    def loss(self, logprobs: torch.Tensor, mask: torch.Tensor, chunk: list[int], batch: dict[str, torch.Tensor],
             window: dict[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
        width, device = logprobs.shape[1], logprobs.device
        loss, stats = self.loss_fn(logprobs, _padded([self.rollouts.logprobs[i] for i in chunk], width).to(device),
                                   _padded([self.teacher_lps[i] for i in chunk], width).to(device), mask,
                                   num_tokens=int(window["tokens"]), is_bounds=self.cfg.is_bounds)
        stats.pop("entropy", None)  # the loop logs the entropy of every algorithm's trained tokens
        return loss, stats


class MOPDStage:
    """Stage runner ``mopd`` (entry point ``cascade_rl.stages``).

    Args:
        config: :class:`MOPDConfig`.
        environment: scores the per-domain validation and the samples' reward curve (default:
            ``cfg.environment`` built from ``cfg.environment_kwargs``).
    """

    config_class: ClassVar[type[MOPDConfig]] = MOPDConfig

    def __init__(self, config: MOPDConfig, environment: Environment | None = None):
        self.cfg = config
        self.environment = environment

    def run(self, datasets: list[Path], init_checkpoint: Path) -> StageResult:
        """Distil ``cfg.steps`` steps from the domains' teachers into ``init_checkpoint``.

        Raises:
            ValueError: no trainable prompt, a domain without a teacher, or a teacher whose vocabulary
                differs from the student's (all before the first rollout).
        """
        cfg = self.cfg
        with StageRun(cfg, datasets, init_checkpoint) as run:
            engine, tok = run.engine, run.tokenizer
            builder = PromptBuilder(tok, cfg.max_prompt_tokens)
            items, dropped = train_prompts(datasets, builder, cfg.name, cfg.seed, cfg.max_rows_per_dataset)
            domains = sorted({row["domain"] for row, _ in items})
            if "teachers" in run.extra:  # resumed: the teachers the run started with
                teachers = {d: Path(p) for d, p in run.extra["teachers"].items()}
            else:
                teachers = resolve_teachers(domains, init_checkpoint, cfg.checkpoint_root, cfg.teachers,
                                            cfg.teacher_metric)
                run.extra["teachers"] = {d: str(p) for d, p in teachers.items()}
            for domain, path in teachers.items():
                check_vocabulary(engine.module, tok, init_checkpoint, path, domain)
            run.counts.update(dropped, train_prompts=len(items))
            env = run.environment(cfg.environment, cfg.environment_kwargs, self.environment)
            rollout = run.rollout_engine(cfg.rollout_engine, cfg.sampling)
            pool = TeacherPool(cfg.teacher_memory_mb, cfg.dtype, run.device, cfg.attn_implementation)
            algorithm = Distillation(cfg, teachers, pool, rollout.pad)
            collect = collector(SingleTurn(rollout, env, cfg.rollouts_per_prompt, cfg.seed, cfg.prompts_per_step,
                                           engine.gathered), items, cfg, tok, builder)
            OnPolicyLoop(run, rollout, collect, algorithm).train(items)
            run.counts["teacher_loads"] = pool.loads
            validation = run.validate(rollout, builder, run.validation_environment(env))
            result = run.finish(validation, curves=algorithm.curves)
        if distributed.is_main():
            record = read_record(result.checkpoint)
            record["teachers"] = {d: str(p) for d, p in teachers.items()}
            write_json(record, result.checkpoint / RECORD)
        return result

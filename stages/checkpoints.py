"""Checkpoint registry: each stage checkpoint records where it came from and how it scores.

Every checkpoint directory (an HF model dir) holds ``cascade_checkpoint.json``:

    {"stage": "if_rl", "runner": "grpo", "init": "data/checkpoints/sft",
     "lineage": ["sft", "if_rl"],
     "datasets": {"data/filtered/rl/instruction_following": "md5:..."},
     "difficulty_filter": {"data/filtered/rl/instruction_following": {"difficulty_filter": "applied", ...}},
     "validation": {"instruction_following": {"reward": 0.31, "pass_rate": 0.25, ...}, ...},
     "train": {...final training metrics...}}

Dataset hashes are md5 over every file's relative path and bytes (the hash DVC uses for
file content), so lineage says exactly which data versions a checkpoint saw; ``difficulty_filter``
says whether each was the difficulty-filtered copy of a set (:func:`stages.datasets.describe_dataset`).
:class:`CheckpointRegistry` scans a root of such directories and picks the best
checkpoint per validation domain (the MOPD teachers, recipe §MOPD).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from common.io import write_json
from stages.datasets import describe_dataset

RECORD = "cascade_checkpoint.json"
SCORES_FILE = "validation_scores.json"  # per-prompt validation scores ({domain: scores}, stages.evaluate)


def dataset_hash(path: str | Path) -> str:
    """``md5:<hex>`` of a file, or of a directory's files (sorted relative paths + bytes).

    Raises:
        FileNotFoundError: ``path`` does not exist (names it).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset {path} not found: run the step that builds it first (dvc repro)")
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.md5()
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return f"md5:{h.hexdigest()}"


def read_record(checkpoint: str | Path) -> dict[str, Any] | None:
    """The checkpoint's record, or ``None`` for a plain model dir (e.g. the base model)."""
    p = Path(checkpoint) / RECORD
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None


def read_scores(checkpoint: str | Path) -> dict[str, Any]:
    """The checkpoint's per-prompt validation scores ``{domain: scores}`` (:func:`stages.evaluate.evaluate`),
    ``{}`` when it has none (a plain model dir, or validated before scores were kept)."""
    p = Path(checkpoint) / SCORES_FILE
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


def write_record(checkpoint: str | Path, *, stage: str, runner: str, init: str | Path,
                 datasets: list[str | Path], validation: dict[str, dict[str, float]],
                 train: dict[str, Any]) -> dict[str, Any]:
    """Write ``cascade_checkpoint.json`` into ``checkpoint`` (lineage extends the init's). Returns it."""
    parent = read_record(init)
    record = {"stage": stage, "runner": runner, "init": str(init),
              "lineage": (parent["lineage"] if parent else []) + [stage],
              "datasets": {str(d): dataset_hash(d) for d in datasets},
              "difficulty_filter": {str(d): describe_dataset(d) for d in datasets},
              "parent_datasets": {**(parent["parent_datasets"] if parent else {}),
                                  **(parent["datasets"] if parent else {})},
              "validation": validation, "train": train}
    write_json(record, Path(checkpoint) / RECORD)
    return record


class CheckpointRegistry:
    """Every recorded checkpoint under ``root`` (``<root>/<stage>/cascade_checkpoint.json``)."""

    def __init__(self, root: str | Path = "data/checkpoints"):
        self.root = Path(root)

    def records(self) -> dict[Path, dict[str, Any]]:
        """``{checkpoint dir: record}``, sorted by path."""
        return {p.parent: json.loads(p.read_text(encoding="utf-8")) for p in sorted(self.root.glob(f"*/{RECORD}"))}

    def best(self, domain: str, metric: str = "reward", stages: list[str] | None = None) -> Path:
        """The checkpoint with the highest ``validation[domain][metric]``, among those of ``stages``
        (stage names in cascade order, e.g. a student's lineage; default: every checkpoint, in path
        order). Ties go to the later one in that order (for a lineage: the stage closest to the end).

        Raises:
            LookupError: none of them was validated on ``domain``.
        """
        records = self.records()
        if stages is None:
            ordered = list(records.items())
        else:
            by_stage = {rec["stage"]: path for path, rec in records.items()}
            ordered = [(by_stage[s], records[by_stage[s]]) for s in stages if s in by_stage]
        scored = [(rec["validation"][domain][metric], i, path) for i, (path, rec) in enumerate(ordered)
                  if metric in rec.get("validation", {}).get(domain, {})]
        if not scored:
            among = f"of stages {stages} " if stages is not None else ""
            raise LookupError(f"no checkpoint {among}under {self.root} has validation metric {metric!r} for {domain!r}")
        return max(scored, key=lambda s: (s[0], s[1]))[2]

    def best_per_domain(self, metric: str = "reward") -> dict[str, Path]:
        """``{domain: best checkpoint}`` over every domain some checkpoint has ``metric`` for (a domain
        whose held-out rows were all skipped, e.g. longer than ``max_prompt_tokens``, has none)."""
        domains = sorted({d for rec in self.records().values() for d, m in rec.get("validation", {}).items()
                          if metric in m})
        return {d: self.best(d, metric) for d in domains}


def load_checkpoint(path: str | Path, attn_implementation: str | None = None):
    """``(model, tokenizer)`` of an HF model dir, fp32 (the default model, or a stage checkpoint), with
    transformers' ``attn_implementation`` (None: the checkpoint's default).

    Raises:
        FileNotFoundError: ``path`` has no ``config.json`` (names the path and how to build it).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model at {path} (config.json missing): run `dvc repro` for the stage that "
                                f"writes it (the base model comes from `cascade asset`)")
    import torch

    config = AutoConfig.from_pretrained(path)
    # a dequantized GGUF export keeps its quantization_config: drop it so no GGUF quantizer is attached
    # (its weights are plain fp32 safetensors) and saved checkpoints do not inherit it
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32,
                                                 **({"attn_implementation": attn_implementation}
                                                    if attn_implementation else {}))
    return model, AutoTokenizer.from_pretrained(path)

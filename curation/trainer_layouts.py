"""The releases in other trainers' dataset layouts: TRL's ``GRPOTrainer`` / ``SFTTrainer``, verl, NeMo-Gym.

- **TRL GRPOTrainer**: :func:`load_for_trl` loads an RL release config as a conversational ``prompt``
  dataset: every row keeps all its columns (``agent_ref``, ``ground_truth``, ``kwargs``... which
  TRL hands to :mod:`validators.rewards.trl`'s reward functions) and gains ``prompt``, the row's input
  messages (:func:`corpora.chat.trl_prompt`).
- **TRL SFTTrainer**: the SFT release loads as it is (``datasets.load_dataset``): ``messages`` plus
  ``tools`` as a JSON string, which SFTTrainer decodes. Arrow gives every message every key
  (``tool_calls: None`` on a plain turn), which templates that test a key's presence render wrongly,
  and SFTTrainer refuses ``with_transform`` datasets; :func:`load_sft_for_trl` stores each message
  with its own keys (``datasets.Json``). ``assistant_only_loss=True`` needs a chat template with
  ``{% generation %}`` markers (TRL patches Qwen3, Llama 3 and others).
- **verl**: :func:`write_verl` (``cascade verl RELEASE CONFIG OUT``) writes ``OUT/<split>.parquet`` in
  verl's RL layout: ``prompt``, ``data_source`` (the row's domain, so verl's validation metrics are
  per domain), ``ability``, ``reward_model`` ``{"style": "rule", "ground_truth"}`` and ``extra_info``
  (the rest of the row, read back by :mod:`validators.rewards.verl`).

- **NeMo-Gym / NeMo-RL**: :func:`write_nemo_gym` (``cascade nemo_gym RELEASE CONFIG OUT``) writes
  ``OUT/<config>/<split>.jsonl``, NVIDIA's own layout, which NeMo-RL's NeMo-Gym dataset reads whole
  (:func:`nemo_gym_line`): a row ingested from a NeMo-Gym release is its upstream line, byte for byte;
  any other row gets ``agent_ref`` ``{"type": "responses_api_agents", "name": <its verifier>}``, graded
  by this package's verify server (:mod:`validators.rewards.nemo_gym`).

TRL and verl render every prompt of a run with one set of tools (TRL: the trainer's ``tools``), not
a row's own, so a row's tool schemas go into its system turn (:func:`corpora.chat.trl_prompt`, the
text this package's own runners give templates that do not render tools).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from corpora.chat import trl_prompt
from curation.release_loader import drop_absent_keys

VERL_SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string()), ("uuid", pa.string()),
                              ("agent_ref", pa.string()), ("instruction_id_list", pa.list_(pa.string())),
                              ("kwargs", pa.string()), ("metadata", pa.string()), ("tools", pa.string())])),
])


def _first(ds: Any) -> Any:
    """``ds``'s first split (``ds`` itself when it is one ``datasets.Dataset``)."""
    from datasets import DatasetDict

    return next(iter(ds.values())) if isinstance(ds, DatasetDict) else ds


def _rl_only(ds: Any, path: str | Path, config: str) -> Any:
    """``ds`` when it holds RL rows. Raises ValueError naming the release otherwise."""
    if "responses_create_params" not in _first(ds).column_names:
        raise ValueError(f"{path} config {config!r} has no responses_create_params column: not an RL release")
    return ds


def trl_columns(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """``datasets`` transform of an RL release batch: :func:`drop_absent_keys`, plus ``prompt``."""
    batch = drop_absent_keys(batch)
    batch["prompt"] = [trl_prompt(p) for p in batch["responses_create_params"]]
    return batch


def load_for_trl(path: str | Path, config: str, split: str | None = "train") -> Any:
    """An RL release config as TRL ``GRPOTrainer``'s conversational prompt dataset.

    Args:
        path: a release directory (``release/rl``) or a Hub dataset id.
        config: an RL set (``math``, ``multi_domain``...).
        split: one split (a ``datasets.Dataset``), or None for all (a ``DatasetDict``).

    Returns:
        The release rows, every column kept, plus ``prompt`` (:func:`corpora.chat.trl_prompt`),
        computed on access (a ``with_transform``), so nothing is copied or padded.

    Raises:
        ValueError: not an RL release; ValueError / FileNotFoundError from ``datasets.load_dataset``
            (unknown config, split, path).
    """
    from datasets import load_dataset

    return _rl_only(load_dataset(str(path), config, split=split), path, config).with_transform(trl_columns)


def load_sft_for_trl(path: str | Path, config: str, split: str | None = "train") -> Any:
    """An SFT release config for TRL's ``SFTTrainer``, each message with exactly its source keys.

    Args:
        path, config, split: as :func:`curation.release_loader.load_release`.

    Returns:
        A ``datasets.Dataset`` (``DatasetDict`` when ``split`` is None) whose ``messages`` column is a
        list of ``datasets.Json`` values: :func:`drop_absent_keys` applied and stored, not a transform.

    Raises:
        ValueError / FileNotFoundError: from ``datasets.load_dataset``.
    """
    from datasets import Json, List, load_dataset

    ds = load_dataset(str(path), config, split=split)
    features = _first(ds).features.copy()
    features["messages"] = List(Json())
    return ds.map(drop_absent_keys, batched=True, features=features)


def verl_row(row: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """One canonical RL row in verl's layout (:data:`VERL_SCHEMA`).

    Raises:
        ValueError: naming the row and message when a prompt message carries more than ``role`` and
            ``content`` (tool calls in the prompt have no column in verl's layout).
    """
    prompt = trl_prompt(row["responses_create_params"])
    for k, message in enumerate(prompt):
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise ValueError(f"row {row.get('uuid')!r}: responses_create_params.input[{k}] has {', '.join(extra)}: "
                             "verl's prompt holds role and content only")
    return {"data_source": row["domain"], "prompt": prompt, "ability": row["domain"],
            "reward_model": {"style": "rule", "ground_truth": row.get("ground_truth")},
            "extra_info": {"index": index, "split": split, "uuid": row["uuid"], "agent_ref": row["agent_ref"],
                           "instruction_id_list": row.get("instruction_id_list"), "kwargs": row.get("kwargs"),
                           "metadata": row.get("metadata"), "tools": row["responses_create_params"].get("tools")}}


PASS_RATES = ("pass_rate", "pass_rate_total", "pass_rate_passed")


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def nemo_gym_line(row: dict[str, Any]) -> str:
    """One canonical RL row as a NeMo-Gym JSON line (no newline).

    A row with ``metadata.nemo_gym_row`` (ingested from NVIDIA's release, ``options.json_lines``) is
    that line unchanged, unless this package changed its pass rates (a measured difficulty): then the
    upstream object with those three fields replaced, as ``json.dumps`` writes it. Any other row:
    ``uuid``, ``domain``, ``responses_create_params`` ``{input, tools}`` (messages without absent keys,
    tools decoded), ``agent_ref`` ``{"type": "responses_api_agents", "name": <agent_ref>}``,
    ``ground_truth``, ``instruction_id_list``, ``kwargs``, the pass rates and ``metadata`` (decoded),
    null fields left out.
    """
    from corpora.nemo_gym import UPSTREAM_ROW_KEY

    meta = _decoded(row.get("metadata")) or {}
    line = meta.get(UPSTREAM_ROW_KEY)
    if line is not None:
        upstream = json.loads(line)
        changed = {k: row.get(k) for k in PASS_RATES if row.get(k) != upstream.get(k)}
        return line if not changed else json.dumps({**upstream, **changed})
    params = row["responses_create_params"]
    out = {"uuid": row["uuid"], "domain": row["domain"],
           "responses_create_params": {"input": [{k: v for k, v in m.items() if v is not None} for m in params["input"]],
                                       "tools": _decoded(params.get("tools")) or []},
           "agent_ref": {"type": "responses_api_agents", "name": row["agent_ref"]},
           "ground_truth": _decoded(row.get("ground_truth")), "instruction_id_list": row.get("instruction_id_list"),
           "kwargs": _decoded(row.get("kwargs")), **{k: row.get(k) for k in PASS_RATES}, "metadata": meta}
    return json.dumps({k: v for k, v in out.items() if v is not None})


def write_nemo_gym(path: str | Path, config: str, out_dir: str | Path) -> dict[str, int]:
    """Write every split of an RL release config as ``out_dir/<config>/<split>.jsonl`` of
    :func:`nemo_gym_line` lines (atomically). The command ``cascade nemo_gym PATH CONFIG OUT``.

    Returns:
        ``{split: rows written}``.

    Raises:
        ValueError: not an RL release; ValueError / FileNotFoundError from ``datasets`` for an unknown
            config or path.
    """
    from common.io import atomic_path
    from curation.release_loader import load_release

    counts = {}
    for split, ds in _rl_only(load_release(path, config), path, config).items():
        with atomic_path(Path(out_dir) / config / f"{split}.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(nemo_gym_line(row) + "\n" for row in ds)
        counts[split] = len(ds)
    return counts


def write_verl(path: str | Path, config: str, out_dir: str | Path) -> dict[str, int]:
    """Write every split of an RL release config as ``out_dir/<split>.parquet`` in verl's layout
    (atomically, :func:`common.io.write_parquet`). The command ``cascade verl PATH CONFIG OUT``.

    Returns:
        ``{split: rows written}`` (every row of the release: a row that cannot be written raises).

    Raises:
        ValueError: not an RL release, or from :func:`verl_row`; ValueError / FileNotFoundError from
            ``datasets`` for an unknown config or path.
    """
    from common.io import write_parquet
    from curation.release_loader import load_release

    counts = {}
    for split, ds in _rl_only(load_release(path, config), path, config).items():
        table = pa.Table.from_pylist([verl_row(row, split, i) for i, row in enumerate(ds)], schema=VERL_SCHEMA)
        write_parquet(table, Path(out_dir) / f"{split}.parquet")
        counts[split] = table.num_rows
    return counts

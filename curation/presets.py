"""Params presets: a YAML file of overrides, turned into ``dvc exp run -S`` arguments.

A preset (``presets/*.yaml``) is a partial ``params.yaml``: every key it sets replaces the value at the
same dotted path, everything else stays. ``cascade preset FILE`` prints one Hydra override per line
(DVC's ``-S`` grammar; ``++`` adds or replaces), so ``dvc exp run`` records the experiment with exactly
those params::

    mapfile -t sets < <(cascade preset presets/learning.yaml)
    dvc exp run -n learning "${sets[@]/#/-S}" report

A mapping is split into its keys where ``params.yaml`` holds a mapping at that path (so its other keys
stay), and passed whole where it holds a scalar or nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_WORDS = {"true", "false", "null", "none", "inf", "nan", "yes", "no", "on", "off"}  # Hydra/YAML read them as non-strings


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar: ``true``/``null``, numbers as Python writes them,
    strings quoted unless plain (a letter or ``_``, then letters, digits, ``_./-``; not a bool/null/inf
    word), lists
    ``[a,b]``, mappings ``{k:v}``.

    Raises:
        TypeError: a value YAML cannot hold (names its type).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        plain = _BARE.fullmatch(value) and value.lower() not in _WORDS
        if plain:
            return value
        # Hydra's quoted strings: a backslash is literal unless it precedes a quote or ends the string
        quoted = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, quoted) + "'"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"a preset value must be YAML data, got {type(value).__name__}: {value!r}")


def overrides(preset: dict[str, Any], params: dict[str, Any], prefix: str = "") -> list[str]:
    """``["++a.b=v", ...]``: the preset's leaves (see the module doc for where mappings split)."""
    out = []
    for key, value in preset.items():
        path = f"{prefix}{key}"
        base = params.get(key) if isinstance(params, dict) else None
        if isinstance(value, dict) and isinstance(base, dict):
            out.extend(overrides(value, base, path + "."))
        else:
            out.append(f"++{path}={hydra_value(value)}")
    return out


def preset_overrides(preset_file: str | Path, params_file: str | Path = "params.yaml") -> list[str]:
    """The ``-S`` overrides of ``preset_file`` against ``params_file``.

    Raises:
        FileNotFoundError: either file is missing (names it).
        ValueError: the preset is not a mapping.
    """
    for f in (preset_file, params_file):
        if not Path(f).exists():
            raise FileNotFoundError(f"{f} not found")
    preset = yaml.safe_load(Path(preset_file).read_text(encoding="utf-8"))
    if not isinstance(preset, dict):
        raise ValueError(f"{preset_file}: a preset is a mapping of params keys, got {type(preset).__name__}")
    return overrides(preset, yaml.safe_load(Path(params_file).read_text(encoding="utf-8")) or {})

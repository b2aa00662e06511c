"""NVIDIA's Cascade-2 releases as local Hub-layout fixtures (``tests/fixtures/nvidia``): where they are,
the registry's sources pointed at them, their upstream lines, the correct / wrong response of each RL
row, a Responses API object of a response, and the git mirror the SWE-RL rows name. Used by
``tests/test_nvidia_release.py`` and ``benchmarks/nvidia_release.py``.

The fixtures reproduce ``nvidia/Nemotron-Cascade-2-RL-data`` (NeMo-Gym JSON lines per config: nested
``responses_create_params``, ``agent_ref`` objects, ``kwargs`` entries null / objects / JSON strings,
workplace ``arguments`` as JSON strings and objects, MCQA ``options`` lists, ``schema_str``, SWE rows
with the instance under ``responses_create_params.metadata``, rows with nothing to verify against) and
``nvidia/Nemotron-Cascade-2-SFT-Data`` (one folder per config; ``messages`` a JSON string in ``swe``, an
empty system turn in ``chat``). ``responses.json`` holds a correct and a wrong response per RL row
(SWE rows: graded by their own ``patch``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from corpora.registry import load_registry

ROOT = Path(__file__).resolve().parents[1]
FX = Path(__file__).parent / "fixtures" / "nvidia"
RL_DIR, SFT_DIR = FX / "Nemotron-Cascade-2-RL-data", FX / "Nemotron-Cascade-2-SFT-Data"
RESPONSES: dict[str, dict[str, str]] = json.loads((FX / "responses.json").read_text(encoding="utf-8"))


def hub_specs(output: str):
    """``sources-hub.yaml``'s sources of ``output``, reading the local fixture instead of the Hub."""
    local = {"rl": RL_DIR, "sft": SFT_DIR}[output]
    return [s.model_copy(update={"path": str(local)}) for s in load_registry(ROOT / "corpora" / "sources-hub.yaml")
            if s.output == output and s.role == "train"]


def ingest(output: str) -> dict[str, tuple[list[dict[str, Any]], Any]]:
    """``{source: (canonical rows, Rejects)}`` of every fixture source of ``output`` through real ingest."""
    from common.io import Rejects
    from curation.ingest import ingest_source

    out = {}
    for spec in hub_specs(output):
        rejects = Rejects("ingest")
        out[spec.name] = (ingest_source(spec, ROOT, rejects).rows, rejects)
    return out


def upstream_uuid(row: dict[str, Any]) -> str:
    """The ``uuid`` an ingested row had upstream (``metadata.upstream_uuid``)."""
    return json.loads(row["metadata"])["upstream_uuid"]


def upstream_lines(config: str) -> dict[str, str]:
    """``{upstream uuid: its exact line}`` of an RL config."""
    lines = (RL_DIR / config / "train.jsonl").read_text(encoding="utf-8").splitlines()
    return {json.loads(line)["uuid"]: line for line in lines}


def responses_api(text: str) -> dict:
    """A Responses API object whose output is ``text`` (tool-call blocks as ``function_call`` items)."""
    items = []
    for part in text.split("<tool_call>"):
        call, _, rest = part.partition("</tool_call>")
        if rest or part.endswith("</tool_call>"):
            obj = json.loads(call)
            items.append({"type": "function_call", "name": obj["name"], "arguments": json.dumps(obj["arguments"]),
                          "call_id": f"c{len(items)}"})
            part = rest
        if part.strip():
            items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": part}]})
    return {"output": items}


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True, env=env).stdout.strip()


def calc_mirror(root: Path) -> Path:
    """The git mirror of ``cascade-fixtures/calc`` whose commit the SWE-RL fixture rows name (deterministic)."""
    src = root / "calc-src"
    (src / "calc").mkdir(parents=True)
    (src / "tests").mkdir()
    (src / "calc" / "__init__.py").write_text(
        'def mean(xs):\n    """The arithmetic mean of a non-empty list."""\n    return sum(xs) / (len(xs) + 1)\n')
    (src / "tests" / "test_calc.py").write_text(
        "from calc import mean\n\n\ndef test_one():\n    assert mean([2]) in (1, 2)\n")
    _git(src, "init", "-q", "-b", "main")
    _git(src, "add", ".")
    _git(src, "commit", "-qm", "base")
    _git(root, "clone", "-q", "--mirror", str(src), str(root / "mirrors" / "cascade-fixtures__calc"))
    return root / "mirrors"

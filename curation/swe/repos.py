"""Repositories that SWE tasks are made from: tiny ones laid out from code problems, and real
packages of the registry (``corpora/sources.yaml``, section ``repositories``).

* MBPP (``mbpp_problems`` RL rows + the reference code of the ``mbpp_solutions`` SFT rows, joined
  on ``metadata.task_id``): ``solution.py`` holds the reference solution and
  ``tests/test_solution.py`` one ``test_<i>`` function per assert of ``ground_truth.tests``.
* HumanEval (``humaneval`` rows, a benchmark: opt-in): ``solution.py`` is the prompt plus the
  ``canonical_solution``; the test file runs ``check(<entry_point>)`` as ``test_check``.
* A registered package: the files of one exact PyPI release whose own test suite ships in it,
  fetched with ``pip download --no-deps`` (:func:`corpora.fetch.fetch_package`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from corpora.registry import DEFAULT_REGISTRY, load_section, package_dir
from validators.verifiers.code import extract_code


@dataclass
class Repo:
    """A repository snapshot that tests pass on.

    Attributes:
        name: unique, path-safe (``mbpp-11``, ``toolz-1.2.0``).
        files: ``{relative path: text}`` of every file.
        source_files: files bugs are injected into.
        test_files: pytest targets (files relative to the root).
        pythonpath: directories put first on ``sys.path`` when testing (``["."]``, ``["src"]``).
        source, source_version, license: provenance of the code (copied into the task rows).
        origin: extra provenance (``task_id``...).
    """

    name: str
    files: dict[str, str]
    source_files: list[str]
    test_files: list[str]
    pythonpath: list[str]
    source: str
    source_version: str
    license: str
    origin: dict[str, Any] = field(default_factory=dict)


class RepoSpec(BaseModel):
    """One entry of the registry's ``repositories`` section (a real package with its tests)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    kind: Literal["pypi"]
    package: str
    version: str
    path: list[str]              # glob patterns of the files extracted from the release
    source_files: list[str]      # where bugs are injected
    test_files: list[str]        # the test suite of the tasks
    pythonpath: list[str] = ["."]
    license: str
    notes: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def load_repositories(path: str | Path = DEFAULT_REGISTRY) -> list[RepoSpec]:
    """The ``repositories`` section of the registry (:func:`corpora.registry.load_section`).

    Raises:
        ValueError: naming the entry and field that is wrong.
    """
    return load_section("repositories", RepoSpec, path)


def package_repo(spec: RepoSpec, cache: str | Path) -> Repo:
    """The registered package as a :class:`Repo`, fetched into ``cache`` when missing.

    Raises:
        RuntimeError: the download fails or a pattern matches no file (:func:`fetch_package`).
        FileNotFoundError: a ``source_files`` / ``test_files`` entry is not among the fetched files.
    """
    from corpora.fetch import fetch_package

    cache = Path(cache)
    root = package_dir(cache, spec.requirement)
    if not root.is_dir() or any(not list(root.glob(p)) for p in spec.path):
        cache.mkdir(parents=True, exist_ok=True)
        fetch_package(spec.requirement, spec.path, cache)
    files = {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*"))
             if p.is_file() and any(p.match(pat) or p.relative_to(root).match(pat) for pat in spec.path)}
    missing = [f for f in spec.source_files + spec.test_files if f not in files]
    if missing:
        raise FileNotFoundError(f"repository {spec.name!r}: {missing} not among the files of {spec.requirement}")
    return Repo(f"{spec.name}-{spec.version}", files, spec.source_files, spec.test_files, spec.pythonpath,
                spec.name, spec.version, spec.license, {"package": spec.package})


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def mbpp_repo(problem: dict[str, Any], solution: dict[str, Any]) -> Repo:
    """A tiny repository from an MBPP RL row and its reference-solution SFT row.

    Raises:
        ValueError: naming the row when the solution has no code or the ground truth no tests.
    """
    gt, meta = _json(problem["ground_truth"]), _json(problem["metadata"]) or {}
    messages = _json(solution["messages"])
    code = extract_code(messages[-1]["content"]) if messages else None
    if not code:
        raise ValueError(f"row {solution.get('uuid')!r}: the reference solution has no Python code")
    if not gt.get("tests"):
        raise ValueError(f"row {problem.get('uuid')!r}: ground_truth.tests is empty")
    tests = "".join(f"\n\ndef test_{i}():\n    {t.strip()}\n" for i, t in enumerate(gt["tests"]))
    setup = (gt.get("setup_code") or "").strip()
    test_file = "from solution import *  # noqa: F401,F403\n" + (f"\n{setup}\n" if setup else "") + tests
    return Repo(f"mbpp-{meta.get('task_id')}", {"solution.py": code.rstrip() + "\n", "tests/test_solution.py": test_file},
                ["solution.py"], ["tests/test_solution.py"], ["."], problem["source"], problem["source_version"],
                problem["license"], {"task_id": meta.get("task_id"), "row": problem["uuid"]})


def humaneval_repo(row: dict[str, Any]) -> Repo:
    """A tiny repository from a HumanEval row (``metadata.canonical_solution`` completes the prompt).

    Raises:
        ValueError: naming the row when a field is missing.
    """
    gt, meta = _json(row["ground_truth"]), _json(row["metadata"]) or {}
    if not (gt.get("prompt") and gt.get("test") and gt.get("entry_point") and meta.get("canonical_solution")):
        raise ValueError(f"row {row.get('uuid')!r}: needs ground_truth prompt/test/entry_point and "
                         f"metadata.canonical_solution")
    test_file = (f"from solution import *  # noqa: F401,F403\n{gt['test']}\n\n"
                 f"def test_check():\n    check({gt['entry_point']})\n")
    name = str(meta.get("task_id", row["uuid"])).replace("/", "-").lower()
    return Repo(name, {"solution.py": gt["prompt"] + meta["canonical_solution"], "tests/test_solution.py": test_file},
                ["solution.py"], ["tests/test_solution.py"], ["."], row["source"], row["source_version"],
                row["license"], {"task_id": meta.get("task_id"), "row": row["uuid"]})

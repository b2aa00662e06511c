"""Math adapters: MATH solutions (SFT), MATH / MATH-500 / GSM8K problems (RL), reasoning-gym generators.

RL rows are checked by the ``math`` verifier against ``ground_truth.answer``
(``reasoning_gym`` rows by the generator's own ``score_answer``).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

from common.answers import last_boxed
from corpora.adapters._common import jsonable, require, text, user
from corpora.registry import SourceSpec
from corpora.schema import RecordError

#: The instruction NVIDIA's math RL prompts carry (OpenMathReasoning / Nemotron convention).
BOXED_INSTRUCTION = "Solve the following math problem. Make sure to put the answer (and only answer) inside \\boxed{}."


def math_prompt(problem: str) -> str:
    """The user prompt of a math RL row: the boxed-answer instruction, then the problem."""
    return f"{BOXED_INSTRUCTION}\n\n{problem}"


def _level(value: Any) -> Any:
    """MATH ``level`` as an int: MATH has ``"Level 3"``, MATH-500 ``3``; anything else unchanged."""
    if isinstance(value, str) and (m := re.fullmatch(r"Level (\d)", value.strip())):
        return int(m.group(1))
    return value


def _math_meta(doc: dict[str, Any]) -> dict[str, Any]:
    return {"level": _level(doc.get("level")), "type": doc.get("type"), "index": doc.get("index")}


def math_solution(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """oe-eval MATH doc ``{problem, solution, level, type, index}`` -> SFT row
    (problem as the user turn, the reference solution as the assistant turn)."""
    problem, solution = require(raw, "problem", "solution")
    return {"messages": [{"role": "user", "content": text(problem, "problem")},
                         {"role": "assistant", "content": text(solution, "solution")}],
            "metadata": _math_meta(raw)}


def math_problem(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """oe-eval MATH / MATH-500 doc ``{problem, solution, answer, level, type, index}`` -> RL row.

    Both shapes are accepted (MATH: ``level`` "Level 3", ``type`` the subject;
    MATH-500: ``level`` 3, ``type`` null). ``ground_truth.answer`` is the last
    ``\\boxed{}`` of the reference solution, NOT the doc's ``answer`` field:
    oe-eval stores a Minerva-normalised answer that is damaged for ~10 % of
    items (``\\left(`` -> ``\\le(``, ``\\infty`` -> ``\\iny`` because the
    normaliser strips the unit "ft"; ``4x-5y=-50`` -> ``-50``). The doc's value is
    kept as ``metadata.normalized_answer``, the reference solution as ``metadata.solution``
    (decontamination indexes it).
    """
    problem, solution = require(raw, "problem", "solution")
    answer = last_boxed(text(solution, "solution"))
    if not answer:
        raise RecordError("solution: no \\boxed{} answer")
    return {"responses_create_params": {"input": user(math_prompt(text(problem, "problem")))},
            "agent_ref": "math", "ground_truth": {"answer": answer},
            "metadata": {**_math_meta(raw), "normalized_answer": raw.get("answer"), "question": problem,
                         "solution": solution}}


def gsm8k(raw: dict[str, Any], spec: SourceSpec, root: Path) -> dict[str, Any]:
    """oe-eval GSM8K doc ``{id, question, answer, short_answer}`` -> RL row;
    ``ground_truth.answer`` is ``short_answer`` (the number after ``####``), the worked
    ``answer`` is kept as ``metadata.solution`` (decontamination indexes it)."""
    question, short = require(raw, "question", "short_answer")
    return {"responses_create_params": {"input": user(math_prompt(text(question, "question")))},
            "agent_ref": "math", "ground_truth": {"answer": str(short)},
            "metadata": {"id": raw.get("id"), "question": question, "solution": raw.get("answer")}}


def reasoning_gym(raw: dict[str, Any], spec: SourceSpec, root: Path) -> list[dict[str, Any]]:
    """reasoning-gym generators; ``raw`` is ``spec.options`` ``{generators, count, seed}``.

    Each generator ``name`` yields ``count`` items from
    ``reasoning_gym.create_dataset(name, size=count, seed=seed)``: one RL row per
    item ``{question, answer, metadata}``, ``ground_truth`` holding what rebuilds
    and scores it (answer, generator, seed, index, version). The installed
    ``reasoning-gym`` must be exactly ``spec.version`` (generators change between
    releases). Item metadata is kept, with non-JSON values (``Fraction``) as strings.
    The six default generators x 200 items take ~4 s (``polynomial_equations``,
    sympy-based, is most of it).
    """
    generators, count, seed = require(raw, "generators", "count", "seed")
    try:
        installed = importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        raise RecordError("reasoning-gym: not installed (pip install reasoning-gym)") from None
    if installed != spec.version:
        raise RecordError(f"version: reasoning-gym {installed} is installed, the registry pins {spec.version}")
    import reasoning_gym as rg

    rows = []
    for name in generators:
        try:
            items = list(rg.create_dataset(name, size=count, seed=seed))
        except (ValueError, KeyError) as exc:
            raise RecordError(f"generators: {name!r} failed: {exc}") from None
        for i, item in enumerate(items):
            rows.append({
                "responses_create_params": {"input": user(text(item["question"], f"{name}[{i}].question"))},
                "agent_ref": "reasoning_gym",
                "ground_truth": jsonable({"answer": item["answer"], "generator": name, "seed": seed,
                                          "index": i, "version": installed}),
                "metadata": {"generator": name, "item": jsonable(item.get("metadata", {}))},
            })
    return rows

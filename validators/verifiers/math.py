"""Math verifiers: ``math`` (math-verify, gold first) and ``reasoning_gym`` (the generator's own scorer).

``math`` (ground_truth ``{"answer": LaTeX}``), binary reward:

* The predicted answer is the content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` of the final
  answer, braces balanced (:func:`last_boxed`); the space form ``\\boxed 4`` counts as a box whose
  answer is the next token. An unterminated last box gives no answer (reward 0), never a truncated
  one. A final answer with no box at all is handed whole to math-verify's own extraction (its
  LaTeX and plain-expression extractors, e.g. ``3/4``), then, if that finds nothing, wrapped in
  ``$...$`` (a bare ``\\dfrac{3}{4}``).
* Gold and prediction are parsed by ``math_verify.parse`` (the box content wrapped in ``$...$``)
  and compared by ``math_verify.verify(gold, pred)``, gold first (the comparison is asymmetric).
  math-verify's ``signal.alarm`` timeouts are disabled (``parsing_timeout=None``,
  ``timeout_seconds=None``): they only work in a main thread; the batch runner's process-level
  wall clock bounds every call instead.
* Conventions (math-verify 0.9's, checked in tests): ``3/4`` = ``0.75`` = ``\\dfrac{3}{4}``; the
  LaTeX mixed number ``3\\frac{1}{4}`` is 3 1/4 = 3.25 (competition-math reading, not 3 x 1/4);
  plain-text mixed numbers such as ``1 1/4`` are not supported; ``\\text{}`` and unit words are
  dropped (``10\\text{ cm}`` = ``10``); percent: ``50\\%`` = ``50`` = ``50 percent`` but not ``0.5``.

``reasoning_gym`` (ground_truth ``{answer, generator, seed, index, version}``): the entry is rebuilt
with ``reasoning_gym.create_dataset(generator, size=index + 1, seed=seed)[index]`` (the installed
release must be ``version``, and the rebuilt answer must equal the stored one) and scored by the
dataset's own ``score_answer`` (reward in [0, 1]; passed when 1). The answer handed to it is the
last ``\\boxed{}`` if any, else the last ``<answer>...</answer>`` (reasoning-gym's tag), else the
stripped final answer.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
from typing import Any

from validators.verifiers.registry import Verdict, Verifier, fail, ground_truth, register_verifier

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" warning on every call


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed X``) in ``text``.

    Nested braces are balanced (``\\boxed{\\frac{2}{7}}`` -> ``\\frac{2}{7}``). Returns None when
    there is no box or the last box is unterminated.
    """
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    i = matches[-1].end()
    rest = text[i:]
    if not rest.lstrip(" ").startswith("{"):
        token = re.match(r"\s+([^\s$]+)", rest)
        return token.group(1) if token else None
    i += len(rest) - len(rest.lstrip(" "))
    depth = 0
    for k in range(i, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:k].strip()
    return None


def _parse(text: str) -> list[Any]:
    from math_verify import parse

    return parse(text, parsing_timeout=None)


@register_verifier("math")
class MathVerifier(Verifier):
    """math-verify against ``ground_truth.answer`` (see the module doc)."""

    def check(self, row: dict[str, Any]) -> None:
        gt = ground_truth(row, "answer")
        if not isinstance(gt["answer"], str) or not gt["answer"].strip():
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth.answer must be a non-empty string")

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        from math_verify import verify

        gold = ground_truth(row, "answer")["answer"]
        gold_parsed = _parse(gold if gold.lstrip().startswith("$") else f"${gold}$")
        if not gold_parsed:
            return fail(f"gold answer {gold!r} does not parse", gold=gold)
        if _BOX.search(answer):
            pred = last_boxed(answer)
            if pred is None:
                return fail("last \\boxed{} is unterminated", gold=gold)
            parsed = _parse(f"${pred}$")
        else:
            pred, parsed = None, _parse(answer) or _parse(f"${answer.strip()}$")
        details = {"gold": gold, "extracted": pred if pred is not None else (parsed[-1] if parsed else None)}
        if not parsed:
            return fail("no answer found", **details)
        if verify(gold_parsed, parsed, timeout_seconds=None):
            return Verdict(1.0, True, "equivalent", details)
        return fail("not equivalent", **details)


@functools.lru_cache(maxsize=4096)
def _rg_entry(generator: str, seed: int, index: int) -> tuple[Any, dict[str, Any]]:
    import reasoning_gym

    ds = reasoning_gym.create_dataset(generator, size=index + 1, seed=seed)
    return ds, ds[index]


@register_verifier("reasoning_gym")
class ReasoningGymVerifier(Verifier):
    """reasoning-gym's ``score_answer`` on the rebuilt entry (see the module doc)."""

    def check(self, row: dict[str, Any]) -> None:
        gt = ground_truth(row, "answer", "generator", "seed", "index", "version")
        installed = importlib.metadata.version("reasoning-gym")
        if gt["version"] != installed:
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth.version {gt['version']} != installed "
                             f"reasoning-gym {installed} (generators change between releases)")

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        from reasoning_gym.utils import extract_answer

        gt = ground_truth(row)
        ds, entry = _rg_entry(gt["generator"], int(gt["seed"]), int(gt["index"]))
        if str(entry["answer"]) != str(gt["answer"]):
            raise ValueError(f"row {row.get('uuid')!r}: rebuilt {gt['generator']}[{gt['index']}] has answer "
                             f"{entry['answer']!r}, ground truth {gt['answer']!r}")
        pred = last_boxed(answer) or extract_answer(answer) or answer.strip()
        reward = float(ds.score_answer(pred, entry))
        reward = min(1.0, max(0.0, reward))
        return Verdict(reward, reward == 1.0, "score_answer", {"extracted": pred, "gold": gt["answer"]})

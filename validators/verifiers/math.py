"""Math verifiers: ``math`` (math-verify, gold first) and ``reasoning_gym`` (the generator's own scorer).

``math`` (ground_truth ``{"answer": LaTeX}``), binary reward:

* The predicted answer is the content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` of the final
  answer, braces balanced (:func:`last_boxed`); the space form ``\\boxed 4`` counts as a box whose
  answer is the next token. An unterminated last box gives no answer (reward 0), never a truncated
  one. A final answer with no box at all is handed whole to math-verify's own extraction (its
  LaTeX and plain-expression extractors, e.g. ``3/4``), then, if that finds nothing, wrapped in
  ``$...$`` (a bare ``\\dfrac{3}{4}``).
* Several boxes: only the LAST counts (a self-correction is graded by its final box), so hedging
  over several boxed answers earns exactly what its last box alone earns.
* Scientific notation (``1.5e-18``, ``2E+3``) is read as a number, ``1.5\\times 10^{-18}``, in the
  prediction and the gold before parsing (math-verify reads ``1.5e-18`` as ``1.5 e - 18``); in an
  unboxed answer written without ``$`` it becomes inline math, so the whole number is extracted, not
  its mantissa (``The answer is 3e5`` is 300000, never 3).
* Gold and prediction are parsed by ``math_verify.parse`` (the box content wrapped in ``$...$``)
  and compared by ``math_verify.verify(gold, pred)``, gold first (the comparison is asymmetric),
  except when both are finite real numbers: then :func:`numbers_equal` decides, relatively (math-verify
  compares to a fixed number of decimals, so ``2^{-60}`` and ``2^{-59}`` were equal).
  math-verify's ``signal.alarm`` timeouts are disabled (``parsing_timeout=None``,
  ``timeout_seconds=None``): they only work in a main thread; the batch runner's process-level
  wall clock bounds every call instead.
* Size bound (:func:`size_problem`), checked on the gold and the prediction text before either is
  parsed: numbers above :data:`MAX_DIGITS` digits (a literal, a power such as ``10^{10^{10}}`` or a
  power tower, ``1e999999999`` once rewritten, ``2**99999999``, a factorial or binomial), and powers
  of a non-numeric group above :data:`MAX_SYMBOLIC_EXPONENT` (``(x+1)^{1000}``) are never handed to
  math-verify or sympy: such an answer equals only the identical text (spaces and ``$`` aside), so
  every answer grades in well under a second. While grading, Python's int <-> str digit limit is
  raised to :data:`INT_STR_DIGITS` (a 6000-digit gold is compared exactly) and restored after.
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

import ast
import contextlib
import functools
import importlib.metadata
import logging
import math
import re
import sys
from collections.abc import Iterator
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

from common.answers import has_box, last_boxed
from validators.verifiers.registry import (
    Verdict,
    Verifier,
    fail,
    ground_truth,
)

logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" warning on every call


_SCI = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
_LITERAL = re.compile(r"\s*([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:(?:\\times|\\cdot|\*)\s*10\s*\^\s*"
                      r"(?:\{\s*([+-]?\d+)\s*\}|([+-]?\d))\s*)?")
MIN_DIGITS = 6


#: Size bounds checked on the text before math-verify or sympy sees it (:func:`size_problem`):
#: a number (literal, power, factorial, binomial) may have at most MAX_DIGITS digits; a power of
#: a non-numeric group (``(x+1)^{n}``, which sympy expands) at most MAX_SYMBOLIC_EXPONENT.
MAX_DIGITS = 10_000
MAX_SYMBOLIC_EXPONENT = 100
MAX_NESTING = 50  # {, ( and [ levels: answers nest a handful; the LaTeX parser recurses on each
#: Python's int <-> str digit limit while grading (default 4300 would refuse a 6000-digit gold).
INT_STR_DIGITS = 100_000
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_CMD = re.compile(r"\\[A-Za-z]+")
_POWER = re.compile(r"\^|\*\*")


def _group_after(text: str, i: int, plain: bool) -> tuple[str, int]:
    """The operand starting at ``text[i]`` (spaces skipped): a balanced ``{...}`` / ``(...)`` group's
    content, a command, a number (``plain``: ``**`` takes a whole number, optionally signed; LaTeX
    ``^`` one character), or one character; and the index after it."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return "", i
    if text[i] in "{(":
        close, depth = {"{": "}", "(": ")"}[text[i]], 0
        for k in range(i, len(text)):
            depth += (text[k] == text[i]) - (text[k] == close)
            if depth == 0:
                return text[i + 1:k], k + 1
        return text[i + 1:], len(text)
    m = _CMD.match(text, i) or (re.compile(r"[+-]?" + _NUMBER.pattern).match(text, i) if plain else None)
    return (m.group(), m.end()) if m else (text[i], i + 1)


def _group_before(text: str, j: int) -> str:
    """The operand ending just before ``text[j]``: a balanced group's content, a number, a command
    or one character."""
    while j > 0 and text[j - 1] == " ":
        j -= 1
    if j == 0:
        return ""
    if text[j - 1] in "})":
        close, open_, depth = text[j - 1], {"}": "{", ")": "("}[text[j - 1]], 0
        for k in range(j - 1, -1, -1):
            depth += (text[k] == close) - (text[k] == open_)
            if depth == 0:
                return text[k + 1:j - 1]
        return text[:j - 1]
    m = re.search(r"(?:\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|.)$", text[:j])
    return m.group() if m else ""


def _to_python(tex: str, symbols: float | None) -> str:
    """A LaTeX/plain expression as Python arithmetic for :func:`_magnitude`; letters and commands
    become ``symbols`` (or stay names, which then do not evaluate, when None)."""
    s = re.sub(r"\\(?:left|right|displaystyle|[,;!: ]|quad|qquad)", " ", tex)
    s = re.sub(r"\\binom\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"C((\1),(\2))", s)
    s = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"((\1)/(\2))", s)
    s = re.sub(r"\\(?:times|cdot)", "*", s)
    s = re.sub(r"\\sqrt\b", "", s)
    fill = f"({symbols!r})" if symbols is not None else r" \g<0> "
    s = re.sub(r"\\[A-Za-z]+|[A-Za-z]", fill if symbols is not None else lambda m: f" _{m.group().lstrip(chr(92))} ", s)
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    for _ in range(8):
        s = re.sub(r"(\d+(?:\.\d*)?|\([^()]*\))\s*!", r"F(\1)", s)
    s = re.sub(r"(?<=[\d)])\s*(?=[(_F])", "*", s)
    return re.sub(r"(?<=\))\s*(?=[\d.])", "*", s)


def _magnitude(tex: str, symbols: float | None = None) -> float | None:
    """An upper bound of ``|value|`` of ``tex`` as a float (``inf`` when it passes 1e300), or None
    when it is not plain arithmetic (see :func:`_to_python`)."""
    try:
        tree = ast.parse(_to_python(tex, symbols).strip() or "x", mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return None
    inf = math.inf

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return abs(float(node.value)) if len(str(node.value)) < 300 else inf
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
            return ev(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add | ast.Sub):
                return a + b
            if isinstance(node.op, ast.Mult):
                return 0.0 if 0.0 in (a, b) else a * b
            if isinstance(node.op, ast.Div):
                return inf if b == 0 or a == inf else a / b
            if isinstance(node.op, ast.Pow):
                if a in (0.0, 1.0) or b == 0.0:
                    return 1.0
                if b == inf or a == inf:
                    return inf
                return inf if b * abs(math.log10(a)) > 300 else a ** b if a > 1 else max(a ** b, a ** -b)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in "FC":
            n = ev(node.args[0])
            return inf if n > 170 else float(math.factorial(int(n))) if node.func.id == "F" else 2.0 ** n
        raise ValueError(f"not plain arithmetic: {ast.dump(node)[:60]}")

    try:
        return ev(tree)
    except (ValueError, OverflowError, RecursionError):
        return None


def _digits(base: float, exponent: float, base_text: str) -> float:
    """Digits of ``base ** exponent`` (``base`` a number >= 0), counting both parts of a fraction."""
    if base in (0.0, 1.0) or exponent == 0.0:
        return 1.0
    if exponent == math.inf or base == math.inf:
        return math.inf
    if re.fullmatch(r"\s*\d+\s*", base_text):
        return exponent * math.log10(base)
    return exponent * max(1.0, len(re.sub(r"\D", "", base_text)))


def size_problem(text: str) -> str | None:
    """Why grading ``text`` could take unbounded time or memory, or None: a number literal of more
    than :data:`MAX_DIGITS` digits, a power whose value would have more (``10^{10^{10}}``, a power
    tower, ``1e999999999`` once rewritten, ``2**99999999``), a power of a non-numeric group above
    :data:`MAX_SYMBOLIC_EXPONENT` (``(x+1)^{1000}``; a lone symbol may go to MAX_DIGITS), a
    factorial or binomial coefficient of more than MAX_DIGITS digits, brackets nested more than
    :data:`MAX_NESTING` deep (the parser recurses per level). Cheap: string scanning and float
    arithmetic only."""
    depth = deepest = 0
    for ch in text:
        depth += (ch in "{([") - (ch in "})]")
        deepest = max(deepest, depth)
    if deepest > MAX_NESTING:
        return f"groups nested {deepest} deep (over {MAX_NESTING})"
    longest = max((len(m.group()) for m in re.finditer(r"\d+", text)), default=0)
    if longest > MAX_DIGITS:
        return f"a number of {longest} digits (over {MAX_DIGITS})"
    if re.search(r"\\uparrow|\\underbrace", text):
        return "arrow notation"
    for m in _POWER.finditer(text):
        exp_text, _ = _group_after(text, m.end(), plain=m.group() == "**")
        base_text = _group_before(text, m.start())
        exponent = _magnitude(exp_text, symbols=1.0)
        if exponent is None:
            exponent = max((float(n) for n in _NUMBER.findall(exp_text)), default=0.0)
        base = _magnitude(base_text)
        if base is not None:
            if _digits(base, exponent, base_text) > MAX_DIGITS:
                return f"a power {base_text}^({exp_text}) of more than {MAX_DIGITS} digits"
        elif exponent > (MAX_DIGITS if re.fullmatch(r"\s*(?:\\[A-Za-z]+|[A-Za-z])\s*", base_text)
                         else MAX_SYMBOLIC_EXPONENT):
            return f"a power ({base_text})^({exp_text}) with a huge exponent"
    for m in re.finditer(r"(?<!\\)!(?!=)", text):
        n = _magnitude(_group_before(text, m.start()), symbols=1.0)
        if n is not None and n > 1 and n * math.log10(n) > MAX_DIGITS:
            return f"a factorial of {n:.3g}"
    for m in re.finditer(r"\\binom", text):
        top, _ = _group_after(text, m.end(), plain=False)
        n = _magnitude(top, symbols=1.0)
        if n is not None and n * math.log10(2) > MAX_DIGITS:
            return f"a binomial coefficient of {n:.3g}"
    return None


@contextlib.contextmanager
def int_str_digits(limit: int = INT_STR_DIGITS) -> Iterator[None]:
    """Python's int <-> str digit limit raised to ``limit`` (never lowered) inside the block."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0 if old == 0 else max(old, limit))
    try:
        yield
    finally:
        sys.set_int_max_str_digits(old)


def scientific_to_latex(text: str, math_mode: bool = False) -> str:
    """``1.5e-18`` -> ``1.5\\times 10^{-18}`` wherever a number in scientific notation stands alone;
    with ``math_mode`` as inline math, ``$1.5\\times 10^{-18}$``: in prose (an unboxed answer without
    ``$``) math-verify's extractor would otherwise read the mantissa alone (``3e5`` as 3)."""
    wrap = "$" if math_mode else ""
    return _SCI.sub(lambda m: f"{wrap}{m.group(1)}\\times 10^{{{m.group(2)}}}{wrap}", text)


def _decimal_literal(text: str) -> tuple[Fraction, int] | None:
    """``(exact value, significant digits)`` when ``text`` is a decimal number written with a point
    or a power of ten (``0.3330``, ``1.0\\times 10^{3}``); None for integers and anything else."""
    m = _LITERAL.fullmatch(text)
    if not m or ("." not in m.group(2) and m.group(3) is None and m.group(4) is None):
        return None
    exp = int(m.group(3) or m.group(4) or 0)
    if abs(exp) > MAX_DIGITS:
        return None
    digits = m.group(2).replace(".", "").lstrip("0") or "0"
    value = Fraction(Decimal(m.group(1) + m.group(2))) * Fraction(10) ** exp
    return value, len(digits)


def _value(text: str, expr: Any) -> tuple[Fraction | Decimal, int | None] | None:
    """The number ``text``/``expr`` stands for: ``(value, significant digits)`` for a decimal
    literal, ``(exact Fraction, None)`` for a rational, ``(60-digit Decimal, None)`` for another
    finite real constant (``\\sqrt{2}``, ``\\pi``); None when it is not a finite real number."""
    import sympy

    literal = _decimal_literal(text.strip().strip("$"))
    if literal:
        return literal
    if not isinstance(expr, sympy.Basic) or not expr.is_number or expr.free_symbols:
        return None
    if expr.is_Rational:
        return Fraction(int(expr.p), int(expr.q)), None
    if isinstance(expr, sympy.Float):
        return _decimal_literal(str(expr)) or (Fraction(Decimal(str(expr))), None)
    if not (expr.is_real and expr.is_finite):
        return None
    return Decimal(str(sympy.N(expr, 60))), None


def _digits_needed(value: Fraction | Decimal, digits: int | None) -> int:
    """Significant digits a rounded decimal must keep to stand for ``value``: its own when it is a
    decimal with at most :data:`MIN_DIGITS`, else :data:`MIN_DIGITS`."""
    if digits is not None:
        return min(digits, MIN_DIGITS)
    if isinstance(value, Fraction):
        for k in range(1, MIN_DIGITS):
            if _half_ulp(value, k) and value == _round(value, k):
                return k
    return MIN_DIGITS


def _round(value: Fraction, digits: int) -> Fraction:
    with localcontext() as ctx:
        ctx.prec = digits
        return Fraction(+Decimal(value.numerator) / Decimal(value.denominator))


def _half_ulp(value: Fraction | Decimal, digits: int) -> Fraction:
    """Half a unit in the last of ``digits`` significant places of ``value``."""
    with localcontext() as ctx:
        ctx.prec = 80
        lead = (Decimal(value.numerator) / Decimal(value.denominator) if isinstance(value, Fraction)
                else value).adjusted()
    return Fraction(5) * Fraction(10) ** (lead - digits)


def numbers_equal(gold: tuple[Fraction | Decimal, int | None], pred: tuple[Fraction | Decimal, int | None]) -> bool:
    """Relative equality of two numbers from :func:`_value` (``(value, significant digits or None)``).

    * both exact (integers, fractions, radicals): equal values (``2^{-60} != 2^{-59}``; constants
      evaluated to 60 digits, equal within a relative 1e-40);
    * the prediction is a decimal no more precise than the gold: it must be the gold correctly
      rounded to the prediction's significant digits (within half a unit of the gold's last place at
      that many digits, so ``1.`` is not ``0.6`` and ``1.0`` is not ``0.96``; ``1.000`` is ``0.99996``), with
      at least as many digits as the gold has, up to :data:`MIN_DIGITS` (``1/3`` = ``0.333333``,
      ``0.33`` is not; ``2^{-60}`` = ``8.67362\\times 10^{-19}``; ``12`` != ``1\\times 10^{1}``);
    * the gold is a decimal less precise than the prediction: the prediction rounds to it.

    Zero equals only zero. Units: none (plain numbers).
    """
    (g, gd), (p, pd) = gold, pred
    g, p = (x if isinstance(x, Fraction) else Fraction(x) for x in (g, p))
    if g == 0 or p == 0:
        return g == p
    if pd is not None and (gd is None or pd <= gd):
        # places counted from the gold's leading digit: ``1.`` is not 0.6 to one digit, nor ``1.0`` 0.96
        return pd >= _digits_needed(g, gd) and abs(g - p) <= _half_ulp(g, pd)
    if gd is not None:
        return abs(g - p) <= _half_ulp(g, gd)
    exact = isinstance(gold[0], Fraction) and isinstance(pred[0], Fraction)
    return g == p if exact else abs(g - p) <= Fraction(1, 10 ** 40) * max(abs(g), abs(p))


def _parse(text: str) -> list[Any]:
    from math_verify import parse

    return parse(text, parsing_timeout=None)


class MathVerifier(Verifier):
    """math-verify against ``ground_truth.answer`` (see the module doc)."""

    sft_domain = "math"

    def check(self, row: dict[str, Any]) -> None:
        gt = ground_truth(row, "answer")
        if not isinstance(gt["answer"], str) or not gt["answer"].strip():
            raise ValueError(f"row {row.get('uuid')!r}: ground_truth.answer must be a non-empty string")

    def warmup(self) -> None:
        """Grade one trivial answer: math-verify and sympy import their parsers on first use (seconds on
        a loaded machine), which a worker must not count against a sample's time limit."""
        self.score(r"\boxed{\frac{1}{2}}", {"uuid": "warmup", "ground_truth": '{"answer": "0.5"}'})

    def score(self, answer: str, row: dict[str, Any]) -> Verdict:
        with int_str_digits():
            return self._score(answer, row)

    def _score(self, answer: str, row: dict[str, Any]) -> Verdict:
        from math_verify import verify

        gold = scientific_to_latex(ground_truth(row, "answer")["answer"])
        if has_box(answer):
            pred = last_boxed(answer)
            if pred is None:
                return fail("last \\boxed{} is unterminated", gold=gold)
            pred = scientific_to_latex(pred)
            text = pred
        else:
            answer = scientific_to_latex(answer, math_mode="$" not in answer)
            pred, text = None, answer
        too_big = size_problem(gold) or size_problem(text)
        if too_big:  # never handed to math-verify / sympy: only the same text is the same answer
            same = _plain(gold) == _plain(text)
            return Verdict(1.0, True, f"identical (too large to evaluate: {too_big})", {"gold": gold}) if same \
                else fail(f"too large to evaluate: {too_big}", gold=gold, extracted=pred)
        gold_parsed = _parse(gold if gold.lstrip().startswith("$") else f"${gold}$")
        if not gold_parsed:
            return fail(f"gold answer {gold!r} does not parse", gold=gold)
        parsed = _parse(f"${pred}$") if pred is not None else _parse(answer) or _parse(f"${answer.strip()}$")
        details = {"gold": gold, "extracted": pred if pred is not None else (parsed[-1] if parsed else None)}
        if not parsed:
            return fail("no answer found", **details)
        try:
            gold_value = _value(gold_parsed[-1], gold_parsed[0])
            pred_value = _value(str(details["extracted"]), parsed[0])
            same = numbers_equal(gold_value, pred_value) if gold_value is not None and pred_value is not None \
                else None
        except ArithmeticError:  # decimal overflow / invalid operation: let math-verify decide
            same = None
        if same is None:
            same = verify(gold_parsed, parsed, timeout_seconds=None)
        if same:
            return Verdict(1.0, True, "equivalent", details)
        return fail("not equivalent", **details)


def _plain(text: str) -> str:
    """``text`` without spaces, ``$`` and LaTeX spacing, for the identical-text comparison."""
    return re.sub(r"\\[,;!: ]|[\s$]", "", text)


@functools.lru_cache(maxsize=4096)
def _rg_entry(generator: str, seed: int, index: int) -> tuple[Any, dict[str, Any]]:
    import reasoning_gym

    ds = reasoning_gym.create_dataset(generator, size=index + 1, seed=seed)
    return ds, ds[index]


class ReasoningGymVerifier(Verifier):
    """reasoning-gym's ``score_answer`` on the rebuilt entry (see the module doc), binary: 1 only for
    a full score (its partial credit, e.g. 0.01 for any wrong answer, is 0 here), 0 when it raises."""

    sft_domain = "math"

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
        details = {"extracted": pred, "gold": gt["answer"]}
        try:
            score = float(ds.score_answer(pred, entry))
        except Exception as exc:  # noqa: BLE001 (a generator's checker tripping over the answer is its 0)
            return fail(f"score_answer refused the answer: {type(exc).__name__}: {exc}"[:300], **details)
        # binary, as every RLVR reward here: generators give partial credit (0.01 for any wrong answer
        # in the right format, 0.5 for a near miss) that a policy earns without solving the task
        details["score_answer"] = score
        if score < 1.0:
            return fail(f"score_answer {score:g} < 1", **details)
        return Verdict(1.0, True, "score_answer", details)

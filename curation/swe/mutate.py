"""Bug injection by program transformation (the mutation operators of synthesized SWE datasets,
e.g. SWE-smith's procedural modifications; mutation testing's classic operators).

:func:`mutants` walks a module's ``ast`` and yields every single-site mutant of four kinds:

* ``operator_swap``: a binary / boolean / equality / membership operator replaced by its
  counterpart (``+``<->``-``, ``*``->``+``, ``//``->``/``... ``and``<->``or``, ``==``<->``!=``,
  ``in``<->``not in``, ``is``<->``is not``);
* ``off_by_one``: an ordering comparison loosened or tightened (``<``<->``<=``, ``>``<->``>=``)
  or an integer literal ``n`` replaced by ``n + 1``;
* ``removed_branch``: an ``if`` statement without ``else`` deleted from a block that keeps other
  statements;
* ``wrong_return``: a ``return`` value replaced by ``None`` (a boolean literal is negated).

Edits are made on the source text at the node's position (only the operator token, literal or
statement changes), so the rest of the file keeps its formatting and the fix is a one-hunk
diff. Every mutant parses and differs from the original; whether a test notices it is decided
by running the tests (:mod:`curation.swe.tasks`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

BINOP_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "+"), ast.FloorDiv: ("//", "/"),
              ast.Div: ("/", "//"), ast.Mod: ("%", "//"), ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&")}
CMP_SWAP = {ast.Eq: ("==", "!=", "operator_swap"), ast.NotEq: ("!=", "==", "operator_swap"),
            ast.Lt: ("<", "<=", "off_by_one"), ast.LtE: ("<=", "<", "off_by_one"),
            ast.Gt: (">", ">=", "off_by_one"), ast.GtE: (">=", ">", "off_by_one")}
WORD_SWAP = {ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"),
             ast.IsNot: ("is not", "is"), ast.And: ("and", "or"), ast.Or: ("or", "and")}
KINDS = ("operator_swap", "off_by_one", "removed_branch", "wrong_return")


@dataclass(frozen=True)
class Mutant:
    """One injected bug: ``kind`` (one of :data:`KINDS`), 1-based ``line`` of the change, a
    readable ``description`` and the whole mutated file ``source``."""

    kind: str
    line: int
    description: str
    source: str


class _Text:
    """Source text addressed by ``ast`` positions (1-based lines, UTF-8 byte columns)."""

    def __init__(self, source: str):
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for ln in self.lines:
            self.starts.append(self.starts[-1] + len(ln))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + len(self.lines[line - 1].encode("utf-8")[:col].decode("utf-8", "replace"))

    def replace(self, start: int, end: int, new: str) -> str:
        return self.source[:start] + new + self.source[end:]


def _gap_swap(text: _Text, left: ast.AST, right: ast.AST, old: str, new: str) -> str | None:
    """Replace operator ``old`` between ``left`` and ``right`` (same line) by ``new``."""
    if left.end_lineno != right.lineno:
        return None
    a, b = text.offset(left.end_lineno, left.end_col_offset), text.offset(right.lineno, right.col_offset)
    gap = text.source[a:b]
    core = gap.strip(" ()\t")
    if core != old:
        return None
    i = a + gap.index(old)
    return text.replace(i, i + len(old), new)


def _sites(tree: ast.Module, text: _Text) -> Iterator[tuple[str, int, str, str | None]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in BINOP_SWAP:
            old, new = BINOP_SWAP[type(node.op)]
            yield "operator_swap", node.lineno, f"{old} -> {new}", _gap_swap(text, node.left, node.right, old, new)
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            old, new = WORD_SWAP[type(node.op)]
            yield "operator_swap", node.lineno, f"{old} -> {new}", _gap_swap(text, *node.values, old, new)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            op = type(node.ops[0])
            if op in CMP_SWAP:
                old, new, kind = CMP_SWAP[op]
            elif op in WORD_SWAP:
                (old, new), kind = WORD_SWAP[op], "operator_swap"
            else:
                continue
            yield kind, node.lineno, f"{old} -> {new}", _gap_swap(text, node.left, node.comparators[0], old, new)
        elif isinstance(node, ast.Constant) and type(node.value) is int and node.lineno == node.end_lineno:
            a, b = text.offset(node.lineno, node.col_offset), text.offset(node.end_lineno, node.end_col_offset)
            if text.source[a:b].isdigit():
                yield "off_by_one", node.lineno, f"{node.value} -> {node.value + 1}", text.replace(a, b, str(node.value + 1))
        elif isinstance(node, ast.Return) and node.value is not None and node.lineno == node.end_lineno:
            v = node.value
            new = ("False" if v.value else "True") if isinstance(v, ast.Constant) and type(v.value) is bool else "None"
            if isinstance(v, ast.Constant) and v.value is None:
                continue
            a, b = text.offset(v.lineno, v.col_offset), text.offset(v.end_lineno, v.end_col_offset)
            yield "wrong_return", node.lineno, f"return {text.source[a:b]} -> return {new}", text.replace(a, b, new)
        for block in ("body", "orelse", "finalbody"):
            stmts = getattr(node, block, None)
            if not isinstance(stmts, list) or len(stmts) < 2 or (isinstance(node, ast.If) and block == "orelse"):
                continue
            for st in stmts:
                if isinstance(st, ast.If) and not st.orelse:
                    a, b = text.starts[st.lineno - 1], text.starts[st.end_lineno]
                    yield "removed_branch", st.lineno, f"removed `if` at line {st.lineno}", text.replace(a, b, "")


def mutants(source: str) -> list[Mutant]:
    """Every single-site mutant of ``source`` (a Python module), in ``ast.walk`` order; each one
    parses and differs from ``source``.

    Raises:
        SyntaxError: ``source`` itself does not parse.
    """
    tree = ast.parse(source)
    text = _Text(source)
    out, seen = [], set()
    for kind, line, description, mutated in _sites(tree, text):
        if mutated is None or mutated == source or mutated in seen:
            continue
        try:
            ast.parse(mutated)
        except SyntaxError:
            continue
        seen.add(mutated)
        out.append(Mutant(kind, line, description, mutated))
    return out

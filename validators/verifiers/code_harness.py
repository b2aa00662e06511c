"""Test harness that runs INSIDE the sandbox (standard library only; shipped as a file, never imported
by the grader).

Usage: ``python -I code_harness.py`` in a directory holding ``solution.py`` (the untrusted program)
and ``spec.json`` (``{mode, tests, setup_code, test, entry_point}``). It writes one JSON record per
test to ``results.jsonl``: ``{"test": i, "passed": bool, "value": JSON text or null, "error": str or null}``.

Modes:
    ``assert`` (MBPP): ``setup_code`` then each assert statement of ``tests``, one record each.
    ``check_candidate`` (HumanEval): ``test`` defines ``check(candidate)``; one record for
        ``check(<entry_point>)``.
    ``function_call``: each test ``{args, kwargs?}`` calls ``<entry_point>(*args)``; the record's
        ``value`` is the result as JSON, compared by the grader (never by objects the solution made).

Defences against programs that game the tests: every comparison (``==``, ``<``, ``in``...) and every
``assert`` condition in the test code is rewritten (``ast``) to go through :func:`_compare` /
:func:`_truth`, which answer False unless every operand is *trusted* data: builtin scalars,
containers of trusted data, or objects whose class has no method written by the solution
(``co_filename == "solution.py"``). An object whose ``__eq__`` is always True therefore fails.
Exiting before or during the tests leaves records missing, which the grader counts as failures.
"""

import ast
import json
import operator
import os
import sys

SOLUTION_FILE = "solution.py"
SCALARS = (int, float, complex, str, bytes, bool, type(None))
OPS = {"Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt,
       "GtE": operator.ge, "Is": operator.is_, "IsNot": operator.is_not,
       "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b}


def _solution_class(cls):
    for klass in cls.__mro__:
        if klass.__module__ == "solution":
            return True
        for value in vars(klass).values():
            code = getattr(getattr(value, "__func__", value), "__code__", None)
            if code is not None and code.co_filename == SOLUTION_FILE:
                return True
    return False


def _trusted(x, depth=0):
    t = type(x)
    if t in SCALARS:
        return True
    if depth > 50 or _solution_class(t):
        return False
    if isinstance(x, dict):
        return all(_trusted(k, depth + 1) and _trusted(v, depth + 1) for k, v in x.items())
    if isinstance(x, (list, tuple, set, frozenset)):
        return all(_trusted(v, depth + 1) for v in x)
    return True


def _compare(ops, *operands):
    for op, a, b in zip(ops, operands, operands[1:]):
        if op not in ("Is", "IsNot") and not (_trusted(a) and _trusted(b)):
            return False
        result = OPS[op](a, b)
        if not (_trusted(result) and bool(result)):
            return False
    return True


def _truth(x):
    return _trusted(x) and bool(x)


class _Guard(ast.NodeTransformer):
    def visit_Compare(self, node):
        self.generic_visit(node)
        ops = ast.Constant(tuple(type(op).__name__ for op in node.ops))
        call = ast.Call(ast.Name("__cascade_compare__", ast.Load()), [ops, node.left, *node.comparators], [])
        return ast.copy_location(call, node)

    def visit_Assert(self, node):
        self.generic_visit(node)
        node.test = ast.copy_location(ast.Call(ast.Name("__cascade_truth__", ast.Load()), [node.test], []), node.test)
        return node


def _guarded(source, name):
    tree = ast.fix_missing_locations(_Guard().visit(ast.parse(source)))
    return compile(tree, name, "exec")


def main():
    with open("spec.json", encoding="utf-8") as f:
        spec = json.load(f)
    out = open("results.jsonl", "w", encoding="utf-8")

    def record(i, passed, value=None, error=None):
        out.write(json.dumps({"test": i, "passed": passed, "value": value, "error": error}) + "\n")
        out.flush()

    mode = spec["mode"]
    n = 1 if mode == "check_candidate" else len(spec["tests"])
    ns = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        with open(SOLUTION_FILE, encoding="utf-8") as f:
            exec(compile(f.read(), SOLUTION_FILE, "exec"), ns)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: a load that exits is a failure
        for i in range(n):
            record(i, False, error=f"solution failed to load: {type(exc).__name__}: {exc}"[:500])
        return
    tns = dict(ns, __name__="__cascade_tests__", __cascade_compare__=_compare, __cascade_truth__=_truth)
    try:
        if spec.get("setup_code"):
            exec(_guarded(spec["setup_code"], "<setup_code>"), tns)
        if mode == "check_candidate":
            exec(_guarded(spec["test"], "<test>"), tns)
    except BaseException as exc:
        for i in range(n):
            record(i, False, error=f"test setup failed: {type(exc).__name__}: {exc}"[:500])
        return
    for i in range(n):
        try:
            if mode == "assert":
                exec(_guarded(spec["tests"][i], f"<test {i}>"), tns)
                record(i, True)
            elif mode == "check_candidate":
                tns["check"](tns[spec["entry_point"]])
                record(i, True)
            else:
                test = spec["tests"][i]
                value = tns[spec["entry_point"]](*test.get("args", []), **test.get("kwargs", {}))
                if not _trusted(value):
                    record(i, False, error=f"result of type {type(value).__name__} is not plain data")
                else:
                    record(i, True, value=json.dumps(value))
        except BaseException as exc:
            record(i, False, error=f"{type(exc).__name__}: {exc}"[:500])


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)

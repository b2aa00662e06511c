"""The grader side of the code verifier, run in ITS OWN sandbox, apart from the solution (standard
library only; shipped as a file with ``code_wire.py``; never imported by the host).

Usage: ``python -I -S code_grader.py TO_SOLUTION_FD FROM_SOLUTION_FD`` with the test spec
(``{mode, tests, setup_code, test, prompt, entry_point}``) as JSON on stdin. It writes JSON lines
on stdout for the host: ``{"grader": "started"}``, then ``{"solution": "started" | "missing"}``,
then one ``{"test": i, "passed": bool, "error": str | null}`` per test, then ``{"done": true}``.

The tests run here, in this process; the solution's names are proxies that call into the solution
process (:mod:`code_server`) with plain-data arguments and get plain data back (:mod:`code_wire`):

* ``assert`` (MBPP): each assert statement of ``tests`` is executed here; every name it uses that
  the solution defines is a proxy (functions, classes) or a copied value (handles for objects
  that are not plain data); ``setup_code`` runs in the solution process (it builds inputs from the
  solution's classes).
* ``check_candidate`` (HumanEval): ``prompt`` (its helpers, e.g. ``poly``) and ``test`` are
  executed here and ``check(candidate)`` is called with ``candidate`` the entry point's proxy; a
  name the test uses that the prompt does not define (the entry point itself) is the solution's.
  So a solution that redefines the prompt's ``poly`` cannot change how ``check`` judges it.

In both test modes the names Python provides stay Python's: a builtin (``abs``, ``set``, ``len``...)
is the solution's only if it is the function under test (:func:`entry_points`: MBPP asks for a
``sum``), and a standard-library module the tests name (``math``) is imported here, never taken
from the solution. So a solution that defines ``set = lambda *a: 0`` or a fake ``math.isclose``
cannot change what the tests compute.
* ``function_call``: each ``{args, kwargs?, expected}`` calls the entry point and compares with
  :func:`values_match`.

So the tests and expected values never exist in the solution's process, on its disk or in its
environment, and every comparison is between values this process built. A solution that exits,
crashes, hangs, tampers with its own interpreter or prints claims can only fail its calls.
Mutations of list, dict and set arguments by the solution are copied back into the caller's
objects (tests that check an in-place sort still work).
"""

import ast
import builtins
import importlib
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import code_wire as wire  # noqa: E402

MAX_MESSAGE = 16 << 20
BUILTINS = frozenset(dir(builtins))


class SolutionError(Exception):
    """The solution raised, returned something that cannot cross, or its process is gone."""


class SolutionGone(SolutionError):
    """The solution process closed its side (exited, crashed or was killed)."""


def values_match(got, expected):
    """JSON values equal with strict types (``"3" != 3``, ``True != 1``), lists and dicts
    recursively, floats within ``math.isclose(rel_tol=1e-6, abs_tol=1e-9)`` (NaN equals NaN); an int
    result matches a float expectation of the same value. (``function_call`` mode.)"""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, float) and type(got) in (int, float):
        if math.isnan(expected) or math.isnan(got):
            return math.isnan(expected) and math.isnan(got)
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
    if type(got) is not type(expected):
        return False
    if isinstance(expected, list):
        return len(got) == len(expected) and all(values_match(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in expected)
    return got == expected


class Channel:
    """Requests to the solution process and its replies, one JSON line each."""

    def __init__(self, to_fd, from_fd):
        self.out, self.inp = os.fdopen(to_fd, "wb"), os.fdopen(from_fd, "rb")

    def read(self):
        line = self.inp.readline(MAX_MESSAGE)
        if not line:
            raise SolutionGone("the solution process ended")
        if not line.endswith(b"\n"):
            raise SolutionError(f"reply over {MAX_MESSAGE} bytes")
        try:
            msg = json.loads(line)
        except ValueError:
            raise SolutionError("malformed reply") from None
        if not isinstance(msg, dict):
            raise SolutionError("malformed reply")
        return msg

    def request(self, msg):
        try:
            self.out.write((json.dumps(msg, separators=(",", ":"), allow_nan=False) + "\n").encode())
            self.out.flush()
        except (BrokenPipeError, OSError):
            raise SolutionGone("the solution process ended") from None
        reply = self.read()
        if "error" in reply:
            raise SolutionError(str(reply["error"])[:500])
        try:
            return wire.from_json(reply["value"]), reply.get("mutated", [])
        except (KeyError, wire.WireError) as exc:
            raise SolutionError(f"malformed reply: {exc}") from None


def _copy_back(arg, new):
    """Put the solution's post-call state ``new`` of argument ``arg`` into ``arg`` itself."""
    if type(arg) is list and type(new) is list:
        arg[:] = new
    elif type(arg) is dict and type(new) is dict:
        arg.clear()
        arg.update(new)
    elif type(arg) is set and type(new) is set:
        arg.clear()
        arg.update(new)


class Proxy:
    """A callable of the solution process (a function, a class, or a handle's object)."""

    def __init__(self, channel, target):
        self._channel, self._target = channel, target

    def __call__(self, *args, **kwargs):
        try:
            msg = {"call": wire.to_json(self._target), "args": wire.to_json(list(args)),
                   "kwargs": wire.to_json(dict(kwargs))}
        except wire.WireError as exc:
            raise SolutionError(f"argument cannot be sent: {exc}") from None
        value, mutated = self._channel.request(msg)
        for item in mutated:
            try:
                i, state = item
                if type(i) is int and 0 <= i < len(args):
                    _copy_back(args[i], wire.from_json(state))
            except (TypeError, ValueError):
                raise SolutionError("malformed reply") from None
        return value


def _names(sources):
    """Every name loaded in ``sources`` (Python code)."""
    found = set()
    for src in sources:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Name):
                found.add(node.id)
    return found


def _called(sources):
    """Names called as functions in ``sources``, in order of appearance."""
    found = []
    for src in sources:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in found:
                found.append(node.func.id)
    return found


def entry_points(spec):
    """The names of an ``assert`` spec that are the solution's even if Python has a builtin of that
    name: ``spec["entry_point"]`` when given, else the functions its tests call that are not builtins,
    else (every call a builtin's name: MBPP's own ``sum``) the first one called."""
    if spec.get("entry_point"):
        return {spec["entry_point"]}
    called = _called(spec["tests"])
    own = {n for n in called if n not in BUILTINS}
    return own or set(called[:1])


def _own_modules(ns, used):
    """Import here the standard-library modules the tests use by name (``math.isclose``), so that a
    solution's object of that name never stands in for them."""
    for name in sorted(used & set(getattr(sys, "stdlib_module_names", ()))):
        try:
            ns[name] = importlib.import_module(name)
        except ImportError:
            continue
    return used - set(ns)


def _prompt_code(prompt):
    """The HumanEval prompt compiled (its imports and helpers): as it is, or with ``pass`` ending
    the entry point's unfinished body, or else its import lines alone."""
    for source in (prompt, prompt.rstrip() + "\n    pass\n"):
        try:
            return compile(source, "<prompt>", "exec")
        except SyntaxError:
            continue
    imports = [ln for ln in prompt.splitlines() if ln.startswith(("import ", "from "))]
    return compile("\n".join(imports), "<prompt>", "exec")


def main():
    to_fd, from_fd = int(sys.argv[1]), int(sys.argv[2])
    try:  # no other process of this uid may read this one's memory (non-bubblewrap isolations)
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except (OSError, AttributeError):
        pass

    def emit(msg):
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    emit({"grader": "started"})
    spec = json.loads(sys.stdin.read())
    mode = spec["mode"]
    n = 1 if mode == "check_candidate" else len(spec["tests"])
    channel = Channel(to_fd, from_fd)

    def fail_all(start, error):
        for i in range(start, n):
            emit({"test": i, "passed": False, "error": error[:500]})
        emit({"done": True})

    try:
        started = channel.read()
    except SolutionError:
        started = {}
    if started.get("started") is not True:
        emit({"solution": "missing"})
        return
    emit({"solution": "started"})
    try:
        loaded = channel.read()
    except SolutionError as exc:
        return fail_all(0, f"solution failed to load: {exc}")
    if "load_error" in loaded or not isinstance(loaded.get("loaded"), dict):
        return fail_all(0, f"solution failed to load: {loaded.get('load_error', 'no report')}")
    defined = loaded["loaded"]
    ns = {"__name__": "__cascade_tests__"}
    try:
        if mode == "check_candidate":
            exec(_prompt_code(spec.get("prompt", "")), ns)
            exec(compile(spec["test"], "<test>", "exec"), ns)
            if spec["entry_point"] not in defined:
                return fail_all(0, f"the solution defines no {spec['entry_point']!r}")
            ns.pop(spec["entry_point"], None)  # the prompt's stub: the test means the solution's
            # the prompt's helpers (poly...) stay the reference's, builtins and standard modules are
            # Python's; the test's other names are the solution's
            used = _own_modules(ns, _names([spec["test"]]) - set(ns) - BUILTINS) | {spec["entry_point"]}
        elif mode == "assert":
            used = _own_modules(ns, _names(spec["tests"]) - BUILTINS) | entry_points(spec)
        else:
            used = {spec["entry_point"]}
        for name in sorted(used & set(defined)):
            if defined[name] == "callable":
                ns[name] = Proxy(channel, name)
            else:
                ns[name] = channel.request({"get": name})[0]
        if mode == "check_candidate":
            ns["candidate"] = ns[spec["entry_point"]]
    except SolutionGone as exc:
        return fail_all(0, str(exc))
    except BaseException as exc:
        return fail_all(0, f"test setup failed: {type(exc).__name__}: {exc}")
    for i in range(n):
        try:
            if mode == "assert":
                exec(compile(spec["tests"][i], f"<test {i}>", "exec"), ns)
            elif mode == "check_candidate":
                ns["check"](ns["candidate"])
            else:
                test = spec["tests"][i]
                if spec["entry_point"] not in ns:
                    raise SolutionError(f"the solution defines no {spec['entry_point']!r}")
                got = ns[spec["entry_point"]](*test.get("args", []), **test.get("kwargs", {}))
                if not values_match(got, test["expected"]):
                    raise AssertionError("wrong value")
            emit({"test": i, "passed": True, "error": None})
        except SolutionGone as exc:
            return fail_all(i, str(exc))
        except BaseException as exc:
            emit({"test": i, "passed": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
    emit({"done": True})


if __name__ == "__main__":
    main()

"""Agent tools and the test runner, executed INSIDE the sandbox (standard library only; shipped as a
read-only file, never imported by the host).

Usage (working directory = the episode's repository copy)::

    python -I harness.py view PATH [START [END]]     numbered lines START..END (1-based, inclusive)
    python -I harness.py search PATTERN [PATH]        regex matches as PATH:LINE: TEXT (at most 50)
    python -I harness.py edit PATH                    stdin: {"old": ..., "new": ...}; ``old`` must occur once
    python -I harness.py pytest SITE PYTHONPATH... -- TEST...
        imports pytest from SITE (before the repository is on sys.path, so a ``pytest.py`` written by
        the agent cannot shadow it), puts each PYTHONPATH entry (relative to the repository) first on
        sys.path, and runs ``pytest -rA`` on TEST...; the exit status is pytest's.

Every path must stay inside the repository (``..`` and absolute paths are refused). Errors are one
line on stderr with exit status 2.
"""

import json
import os
import re
import sys

MAX_MATCHES = 50
MAX_VIEW_LINES = 200


def fail(message):
    sys.stderr.write(message + "\n")
    sys.exit(2)


def inside(path):
    real = os.path.realpath(path)
    root = os.path.realpath(".")
    if os.path.isabs(path) or (real != root and not real.startswith(root + os.sep)):
        fail(f"path {path!r} is outside the repository")
    return path


def read(path):
    try:
        with open(inside(path), encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {path}: {exc}")


def view(path, start="1", end=None):
    lines = read(path).splitlines()
    first = max(int(start), 1)
    last = min(int(end) if end else first + MAX_VIEW_LINES - 1, len(lines), first + MAX_VIEW_LINES - 1)
    for i in range(first, last + 1):
        print(f"{i:5d}  {lines[i - 1]}")
    if last < len(lines):
        print(f"... ({len(lines)} lines; view {path} {last + 1} {min(last + MAX_VIEW_LINES, len(lines))} for more)")


def search(pattern, path="."):
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        fail(f"bad pattern: {exc}")
    files = [inside(path)] if os.path.isfile(inside(path)) else sorted(
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
        if f.endswith((".py", ".txt", ".cfg", ".toml", ".md", ".rst")))
    n = 0
    for name in files:
        try:
            with open(name, encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    if rx.search(line):
                        print(f"{os.path.relpath(name)}:{i}: {line.rstrip()}")
                        n += 1
                        if n >= MAX_MATCHES:
                            print(f"... (stopped at {MAX_MATCHES} matches)")
                            return
        except (OSError, UnicodeDecodeError):
            continue
    if not n:
        print("no match")


def edit(path):
    args = json.loads(sys.stdin.read())
    text = read(path)
    count = text.count(args["old"]) if args["old"] else 0
    if count != 1:
        fail(f"old text occurs {count} times in {path}; it must occur exactly once")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(args["old"], args["new"], 1))
    print(f"edited {path}")


def run_pytest(site, *rest):
    sep = rest.index("--")
    paths, tests = rest[:sep], rest[sep + 1:]
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only pytest itself, no third-party plugins
    sys.path.append(site)
    import pytest

    sys.path[:0] = [os.path.abspath(p) for p in paths]
    sys.exit(int(pytest.main(["-rA", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests])))


if __name__ == "__main__":
    sys.dont_write_bytecode = True  # -I ignores PYTHONDONTWRITEBYTECODE; keep the repository clean
    command, *argv = sys.argv[1:]
    {"view": view, "search": search, "edit": edit, "pytest": run_pytest}.get(
        command, lambda *a: fail(f"unknown command {command!r}"))(*argv)

"""The tool server, run INSIDE an episode's sandbox (standard library only; shipped as a file next to
a world module, ``bfcl_world.py`` or ``tooltalk_world.py``; never imported by the host).

Usage: ``python -I server.py WORLD IN_FD OUT_FD [SITE]`` (``SITE``: a read-only site-packages put last on
``sys.path``, for a backend's third-party imports such as BFCL's ``mpmath``). Standard output and error go
to ``/dev/null`` first (a backend that prints cannot fill a pipe nobody reads), then ``{"started": true}`` is written on
``OUT_FD``. Requests arrive one JSON line each on ``IN_FD``; each gets one JSON line back:

- ``{"op": "load", "modules": {dotted name: source}, "packages": [dotted names]}``: the backend's
  sources, importable from now on by their names (a finder serves them from memory; nothing is
  written to disk) -> ``{"ok": true}``;
- ``{"op": "reset", "world": W, "config": {...}}``: a fresh state for world ``W`` (``model`` or
  ``reference``), built by the world module's ``World(config)`` -> ``{"ok": true}``;
- ``{"op": "call", "world": W, "name": N, "args": [...], "kwargs": {...}}`` -> ``{"output": text}``:
  the tool's result as text, cut to ``max_output_chars`` (``World.call``; a call the world refuses or
  that raises becomes an error text, never a crash);
- ``{"op": "compare"}`` -> the world module's ``compare(model, reference)`` (JSON);
- ``{"op": "state", "world": W}`` -> ``{"state": ...}`` (``World.state()``, for logs).

A request the server cannot parse, or an exception outside a tool call, is answered
``{"error": "..."}``. The process ends when ``IN_FD`` closes.
"""

import importlib
import importlib.abc
import importlib.util
import json
import os
import sys

MAX_OUTPUT_CHARS = 4000


class SourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports modules from sources held in memory (``{dotted name: source}``)."""

    def __init__(self):
        self.sources, self.packages = {}, set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.sources or fullname in self.packages:
            return importlib.util.spec_from_loader(fullname, self, is_package=fullname in self.packages)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if module.__name__ in self.packages:
            module.__path__ = []
        source = self.sources.get(module.__name__, "")
        exec(compile(source, f"<{module.__name__}>", "exec"), module.__dict__)


def clip(text, limit=MAX_OUTPUT_CHARS):
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... ({len(text) - limit} characters cut) ...\n{text[-half:]}"


def main():
    world_module, in_fd, out_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sys.path.extend(sys.argv[4:])
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    outbox = os.fdopen(out_fd, "wb")

    def send(msg):
        outbox.write((json.dumps(msg, default=str) + "\n").encode())
        outbox.flush()

    send({"started": True})
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    finder = SourceFinder()
    sys.meta_path.insert(0, finder)
    world = importlib.import_module(world_module)
    worlds = {}
    for line in os.fdopen(in_fd, "rb"):
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "load":
                finder.sources.update(req["modules"])
                finder.packages.update(req.get("packages", []))
                send({"ok": True})
            elif op == "reset":
                worlds[req["world"]] = world.World(req["config"])
                send({"ok": True})
            elif op == "call":
                try:
                    out = worlds[req["world"]].call(req["name"], req.get("args", []), req.get("kwargs", {}))
                except Exception as exc:  # a tool that raises: its error is the model's observation
                    out = f"Error during execution: {type(exc).__name__}: {exc}"
                send({"output": clip(out if isinstance(out, str) else str(out),
                                     int(req.get("max_output_chars", MAX_OUTPUT_CHARS)))})
            elif op == "compare":
                send(world.compare(worlds["model"], worlds["reference"]))
            elif op == "state":
                send({"state": worlds[req["world"]].state()})
            else:
                send({"error": f"unknown op {op!r}"})
        except Exception as exc:
            send({"error": f"{type(exc).__name__}: {exc}"[:2000]})


if __name__ == "__main__":
    main()

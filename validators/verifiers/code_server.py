"""The solution side of the code grader, run INSIDE the solution's sandbox (standard library only;
shipped as a file next to ``solution.py`` and ``code_wire.py``, never imported by the host).

Usage: ``python -I code_server.py main OUT_FD`` or ``python -I code_server.py serve IN_FD OUT_FD``.
It first writes ``{"started": true}`` on ``OUT_FD`` (proof that the sandbox started, written before
any untrusted code runs), then:

* ``main``: closes ``OUT_FD`` and runs ``solution.py`` as ``__main__`` (stdin/stdout tests);
* ``serve``: loads ``solution.py`` as module ``solution``, runs ``setup.py`` if present (test
  fixtures, e.g. MBPP's trees built from the solution's own ``Node`` class: inputs, never expected
  values), reports ``{"loaded": {name: "callable" | "value"}}`` (or ``{"load_error": ...}``), then
  answers requests from the grader, one JSON line each, until ``IN_FD`` closes:

  - ``{"call": name | {"$h": n}, "args": [...], "kwargs": {...}}`` -> ``{"value": v, "mutated":
    [[i, arg_i after the call], ...]}`` or ``{"error": "Type: message"}``;
  - ``{"get": name}`` -> ``{"value": v}``.

Values are :mod:`code_wire` plain data; an object that is not plain data is kept here and sent as
a handle. Nothing of the tests or the expected values ever reaches this process: whatever it
writes is only its claim of a return value, compared by the grader in another process.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import code_wire as wire  # noqa: E402

MUTABLE = (list, dict, set, bytearray)


def main():
    mode, out_fd = sys.argv[1], int(sys.argv[-1])
    os.write(out_fd, b'{"started": true}\n')
    if mode == "main":
        os.close(out_fd)
        sys.argv = ["solution.py"]
        with open("solution.py", encoding="utf-8") as f:
            source = f.read()
        exec(compile(source, "solution.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        return
    inbox, outbox = os.fdopen(int(sys.argv[2]), "rb"), os.fdopen(out_fd, "wb")

    def send(msg):
        outbox.write((json.dumps(msg, separators=(",", ":"), allow_nan=False) + "\n").encode())
        outbox.flush()

    ns = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        for name in ("solution.py", "setup.py"):
            if os.path.exists(name):
                with open(name, encoding="utf-8") as f:
                    exec(compile(f.read(), name, "exec"), ns)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: a load that exits fails
        send({"load_error": f"{type(exc).__name__}: {exc}"[:500]})
        return
    send({"loaded": {k: "callable" if callable(v) else "value" for k, v in list(ns.items())
                     if not k.startswith("__")}})
    handles = []

    def real(v):
        if isinstance(v, wire.Handle):
            return handles[v.ref]
        if type(v) is list:
            return [real(x) for x in v]
        if type(v) is tuple:
            return tuple(real(x) for x in v)
        if type(v) is dict:
            return {k: real(x) for k, x in v.items()}
        return v

    for line in inbox:
        try:
            req = json.loads(line)
            if "get" in req:
                send({"value": wire.to_json(ns[req["get"]], handles)})
                continue
            target = wire.from_json(req["call"])
            fn = handles[target.ref] if isinstance(target, wire.Handle) else ns[target]
            args = real(wire.from_json(req["args"]))
            kwargs = real(wire.from_json(req["kwargs"]))
            value = fn(*args, **kwargs)
            mutated = [[i, wire.to_json(a, handles)] for i, a in enumerate(args) if isinstance(a, MUTABLE)]
            send({"value": wire.to_json(value, handles), "mutated": mutated})
        except BaseException as exc:  # the solution's error is a reply, never the end of the server
            send({"error": f"{type(exc).__name__}: {exc}"[:500]})


if __name__ == "__main__":
    main()

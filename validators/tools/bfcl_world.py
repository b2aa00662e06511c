"""BFCL multi-turn backends, run INSIDE the episode's sandbox (standard library only; loaded by
``server.py``, never imported by the host).

A world is one set of BFCL backend instances (``GorillaFileSystem``, ``TradingBot``...), built as BFCL's
``execute_multi_turn_func_call`` builds them (``bfcl_eval/eval_checker/multi_turn_eval/multi_turn_utils.py``
of bfcl-eval 2026.3.23): one instance per involved class, ``_load_scenario(deepcopy(initial_config[class]),
long_context=...)`` for every class but the stateless ``MathAPI``, and each public method name mapped to
its instance (a later class wins a name clash). Results become text as BFCL makes them: ``str`` as is, a
``dict`` as JSON (``str`` if that fails), anything else ``str``; an exception is
``Error during execution: ...``.

Unlike BFCL, which ``eval``s the model's call strings, a call here is a method NAME and plain JSON
arguments: only the public methods of the involved classes can be reached.

:func:`compare` is BFCL's ``state_checker``: for every class, every public attribute of the reference
instance must equal (``==``) the model instance's.
"""

import copy
import importlib
import inspect
import json

PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
#: BFCL's CLASS_FILE_PATH_MAPPING for the multi-turn categories (bfcl_eval/constants/executable_backend_config.py)
CLASS_MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS = {"MathAPI"}


class World:
    """Config ``{"classes": [...], "initial_config": {class: {...}}, "long_context": bool}``."""

    def __init__(self, config):
        self.instances, self.methods = {}, {}
        for name in config["classes"]:
            if name not in CLASS_MODULES:
                raise ValueError(f"unknown BFCL class {name!r}")
            cls = getattr(importlib.import_module(f"{PACKAGE}.{CLASS_MODULES[name]}"), name)
            inst = cls()
            if name not in STATELESS:
                inst._load_scenario(copy.deepcopy(config["initial_config"].get(name, {})),
                                    long_context=bool(config.get("long_context")))
            self.instances[name] = inst
            for method, fn in inspect.getmembers(inst, predicate=inspect.ismethod):
                if not method.startswith("_"):
                    self.methods[method] = fn

    def call(self, name, args, kwargs):
        fn = self.methods.get(name)
        if fn is None:
            return f"Error during execution: no tool named {name!r}"
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            return f"Error during execution: {exc}"
        if isinstance(result, str):
            return result
        if isinstance(result, dict):
            try:
                return json.dumps(result)
            except Exception:
                return str(result)
        return str(result)

    def state(self):
        return {name: {k: repr(v)[:2000] for k, v in vars(inst).items() if not k.startswith("_")}
                for name, inst in self.instances.items()}


def compare(model, reference):
    """``{"equal": bool, "differences": {class: [attribute, ...]}}`` (BFCL's state_checker)."""
    differences = {}
    for name, ref in reference.instances.items():
        mine = model.instances.get(name)
        bad = [k for k in vars(ref) if not k.startswith("_")
               and (mine is None or not hasattr(mine, k) or getattr(mine, k) != getattr(ref, k))]
        if bad:
            differences[name] = bad
    return {"equal": not differences, "differences": differences}

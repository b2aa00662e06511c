"""DVC knows every input: each stage of ``dvc.yaml`` declares every in-repo module its command runs.

The walk is static (``ast``). A command ``cascade X`` starts at its entry function (a data step:
``curation.pipeline.STEPS[X]``; ``train STAGE``: ``stages.cli.train``; ``report``:
``stages.report.run_report``). The entry function's file is an input (a step's own code), but the
function is walked alone: the imports in its body and the module-level names it uses (helpers,
constants, imported names), so the dispatch module (which every command loads) does not make every
stage depend on every step's imports. The ``cascade`` argument parsing (``curation/cli.py``) and the
timing wrapper (``run_step``) are not walked: they change no output. Every module reached
from there is walked whole (imports at any depth, lazy ones included), transitively. Objects loaded
by name through the entry-point groups (``common.plugins``) are added from the stage's config: the
runner, environment, advantage, loss, rollout and train engines a training stage names, and the
verifiers of every RL domain it trains or validates on; a data step's verifiers, rollout engines
and adapters likewise. A module is covered by a dependency that is its file or a directory above it.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("corpora", "curation", "packing", "validators", "stages", "common")


def plugin_fields(cfg: Any) -> dict[str, str]:
    """Config field of a stage runner -> the entry-point kind that resolves its value, as the field's
    metadata declares it (``json_schema_extra={"plugin": kind}``, :class:`stages.base.StageRunner`)."""
    return {f: (info.json_schema_extra or {})["plugin"] for f, info in type(cfg).model_fields.items()
            if isinstance(info.json_schema_extra, dict) and "plugin" in info.json_schema_extra}


def module_file(name: str) -> Path | None:
    """The repo file of dotted module ``name`` (``None``: not a module of the repo's packages)."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = REPO.joinpath(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _with_parents(names: set[str]) -> set[str]:
    """``a.b.c`` imports ``a``, ``a.b`` and ``a.b.c``: the names that are repo modules."""
    parts = {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 2)}
    return {n for n in parts if module_file(n)}


def _imports(node: ast.AST, package: str) -> set[str]:
    """Dotted names a node imports anywhere inside it (``from m import x``: ``m`` and ``m.x``), except
    in ``if TYPE_CHECKING:`` blocks (imports for annotations, never run)."""
    names = set()
    typing_only = {id(x) for n in ast.walk(node) if isinstance(n, ast.If) and isinstance(n.test, ast.Name)
                   and n.test.id == "TYPE_CHECKING" for stmt in n.body for x in ast.walk(stmt)}
    for n in ast.walk(node):
        if id(n) in typing_only:
            continue
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - n.level + 1] + [base]).strip(".")
            names |= {base} | {f"{base}.{a.name}" for a in n.names}
    return _with_parents(names)


@cache
def _parse(name: str) -> tuple[ast.Module, str]:
    path = module_file(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return ast.parse(path.read_text(encoding="utf-8")), package


def _has_code(name: str) -> bool:
    """False for a package ``__init__`` holding a docstring only (nothing runs on import)."""
    body = _parse(name)[0].body
    return any(not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in body)


def function_imports(module: str, func: str) -> set[str]:
    """Modules ``module.func`` imports: in its body, and through the module-level names it uses."""
    tree, package = _parse(module)
    bound: dict[str, ast.AST] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0]: stmt for a in stmt.names}
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            bound |= {t.id: stmt for t in targets if isinstance(t, ast.Name)}
    found, todo, seen = set(), [func], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in bound:
            continue
        seen.add(name)
        node = bound[name]
        found |= _imports(node, package)
        if not isinstance(node, ast.Import | ast.ImportFrom):
            todo += [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in _annotation_names(node)]
    return found


def _annotation_names(node: ast.AST) -> set[int]:
    """ids of the Name nodes inside ``node``'s annotations: never evaluated (every module has
    ``from __future__ import annotations``), so a name used only as a type imports nothing at run time."""
    notes = [a.annotation for n in ast.walk(node) if isinstance(n, ast.arguments)
             for a in (*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg) if a is not None and a.annotation]
    notes += [n.returns for n in ast.walk(node) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.returns]
    notes += [n.annotation for n in ast.walk(node) if isinstance(n, ast.AnnAssign)]
    return {id(x) for note in notes for x in ast.walk(note) if isinstance(x, ast.Name)}


def closure(modules: set[str]) -> set[str]:
    """``modules`` and every repo module they import, transitively (each walked whole)."""
    done, todo = set(), list(modules)
    while todo:
        name = todo.pop()
        if name not in done:
            done.add(name)
            todo += _imports(*_parse(name)) - done
    return done


def plugin_module(kind: str, name: str) -> str:
    """The module of entry point ``name`` in group ``cascade_rl.<kind>``."""
    (ep,) = entry_points(group=f"cascade_rl.{kind}", name=name)
    return ep.module


def plugin_modules(kind: str) -> set[str]:
    return {ep.module for ep in entry_points(group=f"cascade_rl.{kind}")}


def set_domains(dataset: str, params: dict[str, Any]) -> set[str]:
    """RL domains whose rows a dataset holds: a domain set, a stage mix (its weights), the SWE tasks."""
    name = Path(dataset).name
    mixes = params["build"].get("mixes") or {}
    if name in mixes:
        return set(mixes[name]["weights"])
    if Path(dataset) == Path("data/swe"):
        return {"swe"}
    return {name} & {ep.name for ep in entry_points(group="cascade_rl.domains")}


def verifiers(domains: set[str]) -> set[str]:
    return {plugin_module("domains", d) for d in domains}


def engines(name: str) -> set[str]:
    return plugin_modules("rollout_engines") if name == "auto" else {plugin_module("rollout_engines", name)}


def entry_modules(cmd: str, params: dict[str, Any]) -> set[str]:
    """The modules a stage command runs before the transitive walk (entry function + plugins).

    Raises:
        ValueError: a command this walk does not know (map it to its entry function here).
    """
    from curation.pipeline import STEPS
    from stages.base import build_runner
    from stages.cli import stage_settings

    argv = shlex.split(cmd)
    if argv[0] != "cascade":
        raise ValueError(f"not a cascade command: {cmd!r}")
    if argv[1] == "train":
        cfg = build_runner(argv[2], stage_settings(params, argv[2])[0]).cfg
        found = function_imports("stages.cli", "train")
        found |= {plugin_module(kind, getattr(cfg, f)) for f, kind in plugin_fields(cfg).items()
                  if f != "rollout_engine"}
        found |= engines(cfg.rollout_engine)
        return found | verifiers({d for ds in [*cfg.datasets, *cfg.eval.datasets] for d in set_domains(ds, params)})
    if argv[1] == "report":
        return function_imports("stages.report", "run_report")
    if argv[1] not in STEPS:
        raise ValueError(f"unknown command {cmd!r}: map it to its entry function in tests/test_dvc_deps.py")
    fn = STEPS[argv[1]]
    found = function_imports(fn.__module__, fn.__name__)
    p = params.get(argv[1]) or {}
    if argv[1] == "difficulty":
        found |= engines(p["engine"]) | verifiers({d for s in p["sets"] for d in set_domains(s, params)})
    if argv[1] == "synthesize":
        found |= engines(p["engine"]) | verifiers(set(p["domains"]))
    if argv[1] == "ingest":
        found |= plugin_modules("adapters")
    return found


def interpolate(value: Any, params: dict[str, Any]) -> Any:
    """``${a.b}`` templates of dvc.yaml filled from params.yaml."""
    def lookup(m: re.Match) -> str:
        out: Any = params
        for key in m.group(1).split("."):
            out = out[key]
        return str(out)

    return re.sub(r"\$\{\s*([\w.]+)\s*\}", lookup, value) if isinstance(value, str) else value


def entry_file(cmd: str) -> Path:
    """The repo file (relative) holding a command's entry function: its own code is an input too."""
    from curation.pipeline import STEPS

    argv = shlex.split(cmd)
    module = {"train": "stages.cli", "report": "stages.report"}.get(argv[1]) or STEPS[argv[1]].__module__
    return module_file(module).relative_to(REPO)


def uncovered(stage: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """Repo files (relative) the stage's command runs that none of its deps covers, sorted."""
    deps = [Path(interpolate(next(iter(d)) if isinstance(d, dict) else d, params)) for d in stage.get("deps", [])]
    files = {module_file(m).relative_to(REPO) for m in closure(entry_modules(stage["cmd"], params))
             if module_file(m).name != "__init__.py" or _has_code(m)} | {entry_file(stage["cmd"])}
    return sorted(str(f) for f in files if not any(f == d or d in f.parents for d in deps))


def _load() -> tuple[dict[str, Any], dict[str, Any]]:
    return (yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"],
            yaml.safe_load((REPO / "params.yaml").read_text()))


def _generator():
    """``scripts/dvc_stages.py``, which writes the training stages and ``report`` of dvc.yaml from params."""
    spec = importlib.util.spec_from_file_location("dvc_stages", REPO / "scripts/dvc_stages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _generated(params: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load("stages:\n" + _generator().render(params))["stages"]


def test_every_stage_declares_every_module_its_command_runs():
    stages, params = _load()
    missing = {name: uncovered(stage, params) for name, stage in stages.items()}
    assert {k: v for k, v in missing.items() if v} == {}


def test_a_removed_dependency_is_caught():
    stages, params = _load()
    doctored = {**stages["if_rl"], "deps": [d for d in stages["if_rl"]["deps"] if d != "validators/verifiers"]}
    missing = uncovered(doctored, params)
    # the rewards (GRPO's verifier environment) and the validation of every domain
    assert {"validators/verifiers/ifeval.py", "validators/verifiers/code.py", "validators/verifiers/registry.py",
            "validators/verifiers/__init__.py"} <= set(missing)
    sft = {**stages["sft"], "deps": [d for d in stages["sft"]["deps"] if not str(d).startswith("packing")]}
    assert "packing/dataset.py" in uncovered(sft, params)


def test_the_walk_follows_a_step_function_not_its_whole_module():
    # step_dedup's module imports every step lazily; dedup itself reaches neither build nor release
    found = closure(function_imports("curation.pipeline", "step_dedup"))
    assert "curation.dedup" in found and "curation.minhash" in found
    assert not {"curation.build", "curation.release", "curation.difficulty", "stages.grpo"} & found


def test_training_stages_use_the_model_param_and_swe_rl_follows_code_rl():
    stages, params = _load()
    text = (REPO / "dvc.yaml").read_text()
    assert params["cascade"]["model"] not in text  # ${cascade.model}, never the path itself
    assert stages["swe_rl"]["cmd"] == "cascade train swe_rl"
    assert "data/checkpoints/code_rl" in stages["swe_rl"]["deps"] and "data/swe" in stages["swe_rl"]["deps"]
    for name in params["cascade"]["order"][1:]:
        if any(str(d).startswith("data/sets/rl") for d in params["cascade"]["stages"][name]["datasets"]):
            assert "data/filtered" in stages[name]["deps"], name


def test_the_training_stages_are_generated_from_params():
    text = (REPO / "dvc.yaml").read_text(encoding="utf-8")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert _generator().update(text, params) == text, "dvc.yaml is stale: run `python scripts/dvc_stages.py`"
    stages = _load()[0]
    cascade = params["cascade"]
    assert [s for s in stages if s in cascade["stages"]] == [*cascade["order"], "swe_rl"]  # order, then the rest
    # each stage starts from the previous one in `order` (the first from the model), swe_rl from its init
    assert stages["sft"]["deps"][0] == "${cascade.model}" and "data/packed" in stages["sft"]["deps"]
    for prev, name in zip(cascade["order"], cascade["order"][1:]):
        assert stages[name]["deps"][0] == f"data/checkpoints/{prev}", name
    assert stages["swe_rl"]["deps"][0] == "data/checkpoints/code_rl"
    assert {"data/swe", "validators/swe", "corpora/swe_tools.py"} <= set(stages["swe_rl"]["deps"])
    # MOPD may take a teacher from any earlier checkpoint; rlhf's judge is a model dir
    assert {f"data/checkpoints/{s}" for s in cascade["order"][:3]} <= set(stages["mopd"]["deps"])
    assert "${cascade.stages.rlhf.environment_kwargs.judge_model}" in stages["rlhf"]["deps"]
    assert stages["report"]["deps"][:len(cascade["order"])] == [f"data/checkpoints/{s}" for s in cascade["order"]]
    assert [next(iter(p.values()))["y"] for s in ("sft", "if_rl", "mopd") for p in stages[s]["plots"]
            if next(iter(p)).endswith(".csv")] == ["loss", "reward_mean", "reverse_kl"]


def test_a_new_stage_is_a_params_block():
    """A block in ``cascade.stages`` (and ``order``) gives a complete DVC stage: no hand-written dvc.yaml."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    cascade = params["cascade"]
    last = cascade["order"][-1]
    cascade["stages"]["new_rl"] = {"runner": "grpo", "datasets": ["data/sets/rl/math"], "steps": 1}
    cascade["stages"]["new_mopd"] = {"runner": "mopd", "datasets": ["data/sets/rl/mopd"], "init": "new_rl"}
    cascade["order"].append("new_rl")
    stages = _generated(params)
    assert list(stages) == [*cascade["order"], *(s for s in cascade["stages"] if s not in cascade["order"]), "report"]
    assert stages["new_rl"]["deps"][:3] == [f"data/checkpoints/{last}", "data/sets/rl", "data/filtered"]
    assert "cascade.order" in stages["new_rl"]["params"] and "cascade.order" not in stages["new_mopd"]["params"]
    assert "data/checkpoints/new_rl" in stages["report"]["deps"]
    assert {f"data/checkpoints/{s}" for s in cascade["order"]} <= set(stages["new_mopd"]["deps"])
    assert {name: uncovered(stages[name], params) for name in ("new_rl", "new_mopd")} == {"new_rl": [], "new_mopd": []}

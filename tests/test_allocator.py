"""The trainer's allocator (common/allocator.py): which library ``cascade train`` preloads, and the re-exec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import allocator
from common.allocator import ENV, find_tcmalloc, preload_env

REPO = Path(__file__).resolve().parents[1]
TCMALLOC = find_tcmalloc()
needs_tcmalloc = pytest.mark.skipif(TCMALLOC is None, reason="no TCMalloc here (scripts/setup.sh installs "
                                    "libtcmalloc-minimal4 when it runs as root)")


def test_choices(tmp_path):
    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"")
    assert preload_env({ENV: "system"}) is None
    assert preload_env({ENV: str(lib)}, platform="darwin") is None
    assert preload_env({ENV: str(lib)}) == {ENV: str(lib), "LD_PRELOAD": str(lib)}
    # first, before what was there; and not twice (the re-executed process goes on)
    env = preload_env({ENV: str(lib), "LD_PRELOAD": "/x/libgomp.so.1 /y/libz.so"})
    assert env["LD_PRELOAD"] == f"{lib}:/x/libgomp.so.1:/y/libz.so"
    assert preload_env(env) is None
    with pytest.raises(FileNotFoundError, match=f"{ENV}='/nonexistent/libtc.so'"):
        preload_env({ENV: "/nonexistent/libtc.so"})


@needs_tcmalloc
def test_tcmalloc_by_default():
    assert preload_env({})["LD_PRELOAD"] == str(TCMALLOC)
    assert preload_env({"LD_PRELOAD": f"/other/{TCMALLOC.name}"}) is None  # the same library from another path


def test_none_found_runs_as_is(monkeypatch):
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: None)
    assert preload_env({}) is None


@needs_tcmalloc
def test_reexec_loads_the_library_once(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('start', flush=True)\nfrom common.allocator import reexec_with_allocator\n"
                      "reexec_with_allocator()\nmaps = open('/proc/self/maps').read()\n"
                      f"print('mapped' if {TCMALLOC.name!r} in maps else 'not mapped', sys.argv[1:])\n")
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "LD_PRELOAD")}
    out = subprocess.run([sys.executable, str(script), "a", "--b"], capture_output=True, text=True, cwd=REPO,
                         env={**env, "PYTHONPATH": str(REPO)}, timeout=120, check=True).stdout.split("\n")
    assert out[:3] == ["start", "start", "mapped ['a', '--b']"]  # re-executed once, same arguments
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**env, "PYTHONPATH": str(REPO), ENV: "system"}, check=True).stdout.split("\n")
    assert out[:2] == ["start", "not mapped []"]


def test_cascade_train_reexecs_only_from_the_command_line(monkeypatch, tmp_path, capsys):
    from curation import cli

    calls = []

    def reexec():
        calls.append(1)
        raise SystemExit(7)

    monkeypatch.setattr(allocator, "reexec_with_allocator", reexec)
    monkeypatch.setattr(sys, "argv", ["cascade", "train", "if_rl"])
    with pytest.raises(SystemExit, match="7"):
        cli.main()
    assert calls == [1]
    params = tmp_path / "params.yaml"
    params.write_text("cascade: {model: m, order: [], stages: {}}\n")
    assert cli.main(["--params", str(params), "train", "if_rl"]) == 1  # a call from Python: trains in place
    assert calls == [1] and "no stage 'if_rl'" in capsys.readouterr().err

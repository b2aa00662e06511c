#!/usr/bin/env bash
# The learning preset (presets/learning.yaml, docs/learning/README.md): SmolLM2-135M-Instruct through IF-RL,
# multi-domain RL and MOPD, every checkpoint evaluated on held-out prompts; then the report with 95 %
# paired bootstrap CIs under docs/learning/. Needs the data release first (the README's first command).
# About 60 minutes on 2 CPU cores. The experiment stays in DVC: `dvc exp show`, `dvc plots show`.
set -euo pipefail
cd "$(dirname "$0")/.."
source .venv/bin/activate
export HF_HUB_OFFLINE=1 DVC_NO_ANALYTICS=1
start=$(date +%s)
mapfile -t sets < <(cascade preset presets/learning.yaml)
dvc exp run -n "${EXP_NAME:-learning-$(date +%Y%m%d-%H%M)}" "${sets[@]/#/-S}" report
cascade report --docs "${DOCS_DIR:-docs/learning}" --wall-s $(( $(date +%s) - start ))
for stage in if_rl multidomain_rl mopd; do   # each stage's curves (also `dvc plots show`)
  cp "plots/$stage.png" "${DOCS_DIR:-docs/learning}/curves_$stage.png"
done

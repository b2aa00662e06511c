#!/usr/bin/env bash
# The recovery experiment (presets/recovery.yaml, docs/recovery/README.md): STEM RL, then IF-RL, then from
# the IF-RL checkpoint MOPD (per-domain teachers) and continued GRPO on the same budget of sampled tokens;
# every checkpoint validated on held-out prompts and scored on the laptop benchmark preset. Needs the data
# release first (the README's first command). About 2 hours on 2 CPU cores (docs/recovery/README.md).
#
#   bash scripts/recovery.sh                  # everything
#   STAGES="mopd grpo_more" bash scripts/recovery.sh   # some stages again (each resumes a killed run)
#
# The preset's data (160 held-out rows per domain, its difficulty filter) is a `dvc exp run` up to
# `difficulty`, in the workspace as scripts/learning.sh runs: `git checkout params.yaml dvc.lock && dvc checkout`
# returns the default pipeline's data afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
source .venv/bin/activate
export HF_HUB_OFFLINE=1 DVC_NO_ANALYTICS=1
DOCS=${DOCS_DIR:-docs/recovery}
PARAMS=${RECOVERY_PARAMS:-data/recovery_params.yaml}
mkdir -p "$DOCS" logs
start=$(date +%s)
timed() {  # timed NAME CMD...: run, append {"NAME": seconds} to logs/recovery_timings.jsonl
  local t0; t0=$(date +%s); "${@:2}"; echo "{\"$1\": $(( $(date +%s) - t0 ))}" >> logs/recovery_timings.jsonl
}
if [[ -z "${STAGES:-}" ]]; then
  mapfile -t sets < <(cascade preset presets/recovery.yaml | grep -E '^\+\+(build|difficulty)\.')
  timed data dvc exp run -n "recovery-data-$(date +%Y%m%d-%H%M)" "${sets[@]/#/-S}" difficulty
fi
python - "$PARAMS" <<'EOF'
import sys, yaml
from stages.cli import merge
params = merge(yaml.safe_load(open("params.yaml")), yaml.safe_load(open("presets/recovery.yaml")))
with open(sys.argv[1], "w") as f:
    yaml.safe_dump(params, f, sort_keys=False)
EOF
for stage in ${STAGES:-sft multidomain_rl if_rl mopd grpo_more}; do
  timed "$stage" cascade --params "$PARAMS" train "$stage"
done
for stage in ${STAGES:-sft multidomain_rl if_rl mopd grpo_more}; do   # the laptop benchmark preset
  timed "eval_$stage" cascade --params "$PARAMS" eval "data/checkpoints/recovery/$stage" --label "$stage" \
    --out metrics/recovery/benchmarks
done
cascade --params "$PARAMS" report --docs "$DOCS" --wall-s $(( $(date +%s) - start ))

#!/usr/bin/env bash
# dvc.lock is stable: `dvc repro export`, then every step again (--force, DVC's run cache off), and
# dvc.lock must equal the committed one both times. Run it in a fresh clone after `bash scripts/setup.sh`
# (or the README's first command) to check another machine builds the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" DVC_NO_ANALYTICS=1
git diff --quiet HEAD -- dvc.lock || { echo "dvc.lock differs from HEAD before the check: commit or restore it" >&2; exit 2; }
status=0
for run in "dvc repro export" "dvc repro --force --no-run-cache export"; do
  $run > /dev/null
  if git diff --quiet HEAD -- dvc.lock; then
    echo "after '$run': dvc.lock identical to the committed one"
  else
    echo "after '$run': dvc.lock differs from the committed one:" >&2
    git diff --stat HEAD -- dvc.lock >&2
    git diff HEAD -- dvc.lock | grep -E '^[-+]|^@@' | head -40 >&2
    status=1
  fi
done
exit $status

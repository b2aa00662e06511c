#!/usr/bin/env bash
# Install if needed, then run the default test suite (slow tests: add `-m slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 DVC_NO_ANALYTICS=1
exec .venv/bin/python -m pytest "$@"

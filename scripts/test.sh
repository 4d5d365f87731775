#!/usr/bin/env bash
# The test command: set up from nothing, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh
export HF_HUB_OFFLINE=1
# Two workers: most tests wait on subprocesses (torchrun ranks, fresh interpreters), so two
# keep both cores busy; tests pick free ports, so they do not collide.
python -m pytest -q -ra --timeout=1800 --durations=30 -n 2 "$@"

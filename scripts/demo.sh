#!/usr/bin/env bash
# The main job: set up from nothing, then run the demo on the simulated trn2.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
neuron-ls
torch-neuronx demo "$@"

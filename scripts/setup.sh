#!/usr/bin/env bash
# Installs everything on a fresh machine (idempotent): torch first, pinned, so
# pip never picks a CUDA build; then this package (builds the C++ core) with the
# Hugging Face versions whose neuron paths we target, and the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python -m pip install --quiet --disable-pip-version-check setuptools wheel ninja
python -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[hf,test]"
# (The package ships neuronsim-nki.pth itself, the start-up file behind `import nki` without
# torch.) Older checkouts wrote torch_neuronx_nki.pth here by hand; no install owns it, so drop it.
python -c "import os, sysconfig; p = os.path.join(sysconfig.get_paths()['purelib'], 'torch_neuronx_nki.pth'); os.path.exists(p) and os.remove(p)"
python -c "import torch; assert torch.neuron.is_available(); print('torch', torch.__version__, '| neuron devices:', torch.neuron.device_count())"

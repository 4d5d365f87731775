#!/usr/bin/env bash
# Installs everything on a fresh machine (idempotent): torch first, pinned, so
# pip never picks a CUDA build; then this package (builds the C++ core) with the
# Hugging Face versions whose neuron paths we target, and the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python -m pip install --quiet --disable-pip-version-check setuptools wheel ninja
python -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[hf,test]"
# `import nki` / `import neuronxcc.nki` without torch (NumPy-only NKI kernels): a start-up
# file installs the alias finder in every interpreter (it defers to a real AWS NKI).
python -c "import torch_neuronx.nki._alias as a; print('nki alias:', a.write_pth())"
python -c "import torch; assert torch.neuron.is_available(); print('torch', torch.__version__, '| neuron devices:', torch.neuron.device_count())"

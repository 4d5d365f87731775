#!/usr/bin/env bash
# Installs everything on a fresh machine: torch first, pinned, so pip never picks a CUDA
# build; then this package (builds the C++ core) with the Hugging Face versions whose
# neuron paths we target, and the test tools.
# Run again, it does only what changed (scripts/setup_state.py decides; its stamps are in
# build/): nothing but the final check when every pin is installed and csrc/ is as last
# built; the C++ core alone (ninja, only the changed files) after an edit under csrc/;
# the full install after a change to pyproject.toml or setup.py, in another environment,
# or when a package is missing or at another version. SETUP_FORCE=1 always does the full install.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() { python -m pip install --quiet --disable-pip-version-check "$@"; }
if [[ "${SETUP_FORCE:-0}" != 1 ]] && python scripts/setup_state.py installed; then
    if python scripts/setup_state.py built; then
        echo "setup: pinned packages installed and the C++ core up to date; nothing to install"
    else
        echo "setup: csrc/ changed since the last build; rebuilding the C++ core"
        TORCH_DEVICE_BACKEND_AUTOLOAD=0 python setup.py --quiet build_ext --inplace
        python scripts/setup_state.py stamp built || true
    fi
else
    pip_install "torch==2.13.0"
    pip_install setuptools wheel ninja
    pip_install --no-build-isolation -e ".[hf,test]"
    python scripts/setup_state.py stamp installed || true
    python scripts/setup_state.py stamp built || true
fi
# (The package ships neuronsim-nki.pth itself, the start-up file behind `import nki` without
# torch.) Older checkouts wrote torch_neuronx_nki.pth here by hand; no install owns it, so drop it.
python -c "import os, sysconfig; p = os.path.join(sysconfig.get_paths()['purelib'], 'torch_neuronx_nki.pth'); os.path.exists(p) and os.remove(p)"
python -c "import torch; assert torch.neuron.is_available(); print('torch', torch.__version__, '| neuron devices:', torch.neuron.device_count())"

#!/usr/bin/env bash
# GPU checks of tallow's core Triton kernels, then their micro-benchmark.
# Run from anywhere on a CUDA machine with tallow installed (pip install -e .).
set -euo pipefail
cd "$(dirname "$0")/../.."
python -c "import torch, triton; assert torch.cuda.is_available(), 'needs a CUDA GPU'; \
print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python -m pytest -q -m gpu tests/kernels "$@"
python bench/kernels_micro.py

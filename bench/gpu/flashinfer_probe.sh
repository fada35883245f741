#!/usr/bin/env bash
# Does flashinfer run on the GPU machine? Installs the carried wheels (bench/gpu/flashinfer_wheels.sh
# builds them into ./.whl) and runs bench/gpu/flashinfer_probe.py: versions, JIT compile times,
# decode/prefill against the torch reference, CUDA-graph replay; ~3 minutes at most.
# Usage (GPU machine, project root, .whl carried): bash bench/gpu/flashinfer_probe.sh OUTDIR
# Writes OUTDIR/probe.log and OUTDIR/jit/flashinfer-aot-sm90a.tar.gz (the compiled modules).
set -uo pipefail
OUT=${1:-/tmp/fi-probe}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
timeout 170 python3 bench/gpu/flashinfer_probe.py "$OUT" --budget 140 2>&1 | tee "$OUT/probe.log"

#!/usr/bin/env bash
# The triton attention backend on a CUDA GPU: its GPU tests, the small kernel cases run
# natively, then the micro-benchmark. Run from anywhere; extra args go to the benchmark
# (e.g. --json bench/attention_micro.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
# Works with the plugin installed (make install) or straight from the source tree.
export PYTHONPATH="$PWD/framework:$PWD/plugins/attention/triton${PYTHONPATH:+:$PYTHONPATH}"
tests=plugins/attention/triton/tests
python -m pytest -q -m gpu -rs "$tests"
python -m pytest -q -rs "$tests/kernel_cases.py"
python bench/attention_micro.py "$@"

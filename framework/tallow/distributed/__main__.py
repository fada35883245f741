"""``python -m tallow.distributed SPEC``: a worker rank spawned by a tallow launch (SPEC is the
JSON of :class:`tallow.distributed.launch.WorkerSpec`). Not meant to be run by hand.

The process's entry point, so it sits above the engine it runs (docs/architecture.md,
"Layers"): it hands the engine's worker loop (:mod:`tallow.engine.worker`) the builder of the
model runner."""

import sys

from tallow.distributed.launch import WorkerSpec
from tallow.engine.builder import build_runner
from tallow.engine.worker import spawned_main

if len(sys.argv) != 2:
    sys.exit("usage: python -m tallow.distributed SPEC (spawned by a tallow launch)")
spawned_main(WorkerSpec.from_json(sys.argv[1]), build_runner)

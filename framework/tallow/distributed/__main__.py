"""``python -m tallow.distributed SPEC``: a worker rank spawned by a tallow launch (SPEC is the
JSON of :class:`tallow.distributed.launch.WorkerSpec`). Not meant to be run by hand."""

import sys

from tallow.distributed.launch import WorkerSpec
from tallow.distributed.worker import spawned_main

if len(sys.argv) != 2:
    sys.exit("usage: python -m tallow.distributed SPEC (spawned by a tallow launch)")
spawned_main(WorkerSpec.from_json(sys.argv[1]))

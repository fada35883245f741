"""Run a ``tallow`` command with the grammar masks' fill arranged otherwise, for A/B runs of
where the fill's cost lands without a code change.

Usage: python bench/gpu/grammar_overlap_ab.py ARRANGEMENT bench throughput ... --json-schema F

ARRANGEMENT:
  ``thread``      as built: the grammar thread fills a step's masks while the engine thread
                  plans and builds the next step
  ``serial``      the engine thread waits for each fill as soon as it starts it (no overlap):
                  what the masks cost when nothing hides them
  ``switch=S``    as built, with Python's thread switch interval set to S seconds (default
                  0.005): how much of the overlap's cost is the two threads handing the GIL
                  to each other
"""

from __future__ import annotations

import sys


def main() -> int:
    arrangement = sys.argv[1]
    if arrangement == "serial":
        from tallow.engine.sampling.grammar import StructuredOutputs

        start_fill = StructuredOutputs.start_fill

        def serial_start_fill(self, states):
            job = start_fill(self, states)
            job.future.result()
            return job

        StructuredOutputs.start_fill = serial_start_fill
    elif arrangement.startswith("switch="):
        sys.setswitchinterval(float(arrangement.split("=", 1)[1]))
    elif arrangement != "thread":
        raise SystemExit(f"unknown arrangement {arrangement!r}: thread, serial or switch=S")
    from tallow.cli import main as tallow_main
    return tallow_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

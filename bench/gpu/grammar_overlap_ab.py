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
  ``profile``     as built, with the engine thread under cProfile during the timed
                  constrained run and, separately, the unconstrained one: prints each one's
                  40 functions of most own time (what a constrained step adds, by function)
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
    elif arrangement == "profile":
        _profile_timed_runs()
    elif arrangement != "thread":
        raise SystemExit(f"unknown arrangement {arrangement!r}: thread, serial, switch=S or "
                         "profile")
    from tallow.cli import main as tallow_main
    return tallow_main(sys.argv[2:])


def _profile_timed_runs() -> None:
    """Profile the constrained and the unconstrained timed runs of ``bench throughput
    --json-schema`` (not the warm-ups), each into its own profile printed at exit."""
    import atexit
    import cProfile
    import pstats

    from tallow.bench import constrained

    timed = constrained._timed
    profiles = {"constrained": cProfile.Profile(), "unconstrained": cProfile.Profile()}

    def profiled_timed(engine, prompts, params):
        if len(prompts) <= 4:  # a warm-up
            return timed(engine, prompts, params)
        kind = "constrained" if params[0].structured_outputs is not None else "unconstrained"
        profiles[kind].enable()
        try:
            return timed(engine, prompts, params)
        finally:
            profiles[kind].disable()

    def report() -> None:
        for kind, profile in profiles.items():
            print(f"== engine thread, {kind} run: functions by own time", file=sys.stderr)
            pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(40)

    constrained._timed = profiled_timed
    atexit.register(report)


if __name__ == "__main__":
    sys.exit(main())

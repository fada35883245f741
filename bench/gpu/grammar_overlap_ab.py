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
  ``nohandoff``   as built, but the engine thread does not hand the GIL to the grammar
                  thread when it starts a fill (the fill begins when the engine thread next
                  blocks or the switch interval runs out)
  ``xgthreads=N`` xgrammar's fills on N threads (the plugin's ``max_threads``)
  ``timers``      as built, with the host-side parts of a step timed by wall clock (no
                  profiler: each call of a listed method adds its time to its total): prints
                  milliseconds per step for each part, constrained and unconstrained runs
  ``gputrace``    as built, with the device's own timeline traced (CUPTI, no host-side
                  events) over 60 steps in the middle of each timed run: prints per step the
                  device's busy and idle time, its idle gaps, its copies and its kernels by
                  total time (what a constrained step adds on the device, and how long the
                  device waits for the host)

Arrangements combine with commas (``serial,timers``).
"""

from __future__ import annotations

import sys


def main() -> int:
    for arrangement in sys.argv[1].split(","):
        _arrange(arrangement)
    from tallow.cli import main as tallow_main

    return tallow_main(sys.argv[2:])


def _arrange(arrangement: str) -> None:
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
    elif arrangement == "nohandoff":
        from tallow.engine.sampling.grammar import MaskFill

        init = MaskFill.__init__

        def began_at_once(self, rows):
            init(self, rows)
            self.began.set()  # start_fill's wait returns at once

        MaskFill.__init__ = began_at_once
    elif arrangement.startswith("xgthreads="):
        import tallow_grammar_xgrammar.backend as xgrammar_backend

        threads = int(arrangement.split("=", 1)[1])
        settings_of = xgrammar_backend.plugin_settings
        xgrammar_backend.plugin_settings = lambda cls, config, name: settings_of(
            cls, config, name
        ).model_copy(update={"max_threads": threads})
    elif arrangement == "timers":
        _time_parts()
    elif arrangement == "gputrace":
        _trace_device()
    elif arrangement != "thread":
        raise SystemExit(
            f"unknown arrangement {arrangement!r}: thread, serial, switch=S, "
            "nohandoff, xgthreads=N, profile, timers or gputrace"
        )


#: the host-side parts of a step timed by ``timers`` (inclusive: a part called inside another
#: counts in both)
_PARTS = {
    "tallow.engine.core:EngineCore": ["_schedule_and_launch", "_collect", "_check_stop"],
    "tallow.engine.scheduler:Scheduler": ["schedule", "advance", "commit"],
    "tallow.engine.model_runner:ModelRunner": [
        "launch",
        "run_batch",
        "sample_constrained",
        "start_masks",
        "_sample",
        "_queue_readback",
        "collect",
    ],
    "tallow.engine.batch_inputs:BatchInputs": ["fill_host", "upload"],
    "tallow.engine.sampling.grammar:StructuredOutputs": ["advance", "start_fill", "take"],
    "tallow.engine.output_processor:OutputProcessor": ["process"],
}


def _time_parts() -> None:
    """Wrap each of ``_PARTS`` with a wall-clock total per timed run (not the warm-ups);
    print milliseconds per engine step at exit."""
    import atexit
    import importlib
    import time
    from collections import Counter

    totals = {"constrained": Counter(), "unconstrained": Counter()}
    steps = {"constrained": 0, "unconstrained": 0}
    current: list[str | None] = [None]

    def timer(key: str, method):
        def timed_method(*args, **kwargs):
            kind = current[0]
            if kind is None:
                return method(*args, **kwargs)
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                totals[kind][key] += time.perf_counter() - started

        return timed_method

    for where, names in _PARTS.items():
        module, cls_name = where.split(":")
        cls = getattr(importlib.import_module(module), cls_name)
        for name in names:
            setattr(cls, name, timer(f"{cls_name}.{name}", getattr(cls, name)))

    def timed_run(kind, run):
        current[0] = kind
        try:
            result = run()
        finally:
            current[0] = None
        steps[kind] = result["steps"]
        return result

    def report() -> None:
        print(
            "== host-side parts, ms per step (inclusive): constrained / unconstrained",
            file=sys.stderr,
        )
        keys = sorted(set(totals["constrained"]) | set(totals["unconstrained"]))
        for key in keys:
            c, u = (
                1e3 * totals[k][key] / max(1, steps[k]) for k in ("constrained", "unconstrained")
            )
            print(f"{key:40s} {c:7.3f} {u:7.3f} {c - u:+7.3f}", file=sys.stderr)

    _around_timed_runs(timed_run)
    atexit.register(report)


def _trace_device(first: int = 150, count: int = 60) -> None:
    """Trace the device's work over steps ``first``..``first + count`` of each timed run
    (torch.profiler, CUDA activity only, so the host runs as it does untraced); print a
    summary of each at exit."""
    import atexit
    import json
    import os
    import tempfile

    import torch
    from tallow.engine.core import EngineCore

    summaries: dict[str, str] = {}
    current: list[str | None] = [None]
    state = {"step": 0, "prof": None}
    step = EngineCore.step

    def traced_step(self, *args, **kwargs):
        kind = current[0]
        if kind is not None:
            state["step"] += 1
            if state["step"] == first:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
                prof.__enter__()
                state["prof"] = prof
            elif state["step"] == first + count and state["prof"] is not None:
                torch.cuda.synchronize()
                prof, state["prof"] = state["prof"], None
                prof.__exit__(None, None, None)
                with tempfile.TemporaryDirectory() as scratch:
                    path = os.path.join(scratch, "trace.json")
                    prof.export_chrome_trace(path)
                    with open(path) as f:
                        trace = json.load(f)
                summaries[kind] = _device_summary(trace, count)
        return step(self, *args, **kwargs)

    EngineCore.step = traced_step

    def traced_run(kind, run):
        current[0], state["step"] = kind, 0
        try:
            return run()
        finally:
            current[0] = None

    def report() -> None:
        for kind, text in summaries.items():
            print(f"== device timeline, {kind} run, per step over {count} steps", file=sys.stderr)
            print(text, file=sys.stderr)

    _around_timed_runs(traced_run)
    atexit.register(report)


def _device_summary(trace: dict, steps: int) -> str:
    """Busy time, idle gaps, copies and kernels per step of a chrome trace's device events."""
    from collections import defaultdict

    events = [
        e
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    if not events:
        return "  (no device events)"
    events.sort(key=lambda e: e["ts"])
    start, end = events[0]["ts"], max(e["ts"] + e["dur"] for e in events)
    busy, gaps = 0.0, []
    reach = start
    for e in events:
        if e["ts"] > reach:
            gaps.append(e["ts"] - reach)
        busy += max(0.0, e["ts"] + e["dur"] - max(reach, e["ts"]))
        reach = max(reach, e["ts"] + e["dur"])
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for e in events:
        name = e["name"][:70]
        item = by_name[name]
        item[0] += 1
        item[1] += e["dur"]
        item[2] += float((e.get("args") or {}).get("bytes", 0) or 0)
    lines = [
        f"  span {(end - start) / steps / 1e3:.3f} ms, busy {busy / steps / 1e3:.3f} ms, "
        f"idle {(end - start - busy) / steps / 1e3:.3f} ms per step"
    ]
    big = sorted(g for g in gaps if g >= 20)
    lines.append(
        f"  idle gaps >= 20 us: {len(big) / steps:.1f} per step, "
        f"{sum(big) / steps / 1e3:.3f} ms per step; largest "
        + ", ".join(f"{g / 1e3:.3f}" for g in big[-8:])
        + " ms"
    )
    for name, (n, dur, nbytes) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:16]:
        extra = f", {nbytes / n / 1e6:.2f} MB each" if nbytes else ""
        lines.append(f"  {dur / steps / 1e3:7.3f} ms  {n / steps:5.1f}x  {name}{extra}")
    return "\n".join(lines)


def _profile_timed_runs() -> None:
    """Profile the constrained and the unconstrained timed runs of ``bench throughput
    --json-schema`` (not the warm-ups), each into its own profile printed at exit."""
    import atexit
    import cProfile
    import pstats

    profiles = {"constrained": cProfile.Profile(), "unconstrained": cProfile.Profile()}

    def profiled_timed(kind, run):
        profiles[kind].enable()
        try:
            return run()
        finally:
            profiles[kind].disable()

    def report() -> None:
        for kind, profile in profiles.items():
            print(f"== engine thread, {kind} run: functions by own time", file=sys.stderr)
            pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(40)

    _around_timed_runs(profiled_timed)
    atexit.register(report)


def _around_timed_runs(around) -> None:
    """Run each timed run of ``bench throughput --json-schema`` (not the warm-ups) as
    ``around(kind, run)``: ``kind`` "constrained" or "unconstrained", ``run()`` the run
    itself, returning its result. Wrappers stack (``profile,timers``)."""
    from tallow.bench import constrained

    timed = constrained._timed

    def timed_by_kind(engine, prompts, params):
        if len(prompts) <= 4:  # a warm-up
            return timed(engine, prompts, params)
        kind = "constrained" if params[0].structured_outputs is not None else "unconstrained"
        return around(kind, lambda: timed(engine, prompts, params))

    constrained._timed = timed_by_kind


if __name__ == "__main__":
    sys.exit(main())

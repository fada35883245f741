"""Where an engine step's wall time goes: the tracer that :class:`~tallow.engine.core.EngineCore`
reports its phases to.

The core runs each verb of a step (schedule, launch, the caller's overlapped work, the wait for
the device, the bookkeeping afterwards, the grammar masks) inside ``tracer.phase(name)`` and
tells the tracer which host phases ran while the device was still busy with earlier work
(:meth:`StepTracer.hide_while_busy`). At the end of a call the tracer writes what it saw into the
call's output (:meth:`StepTracer.stamp`: ``step_time``, ``timings``, ``hidden``).

Timing is off by default: an engine holds :data:`NO_TRACER`, whose calls do nothing (not even
query the device), so a step pays a few empty method calls for it. Whoever reads the timings
turns it on with :meth:`EngineCore.trace_steps <tallow.engine.core.EngineCore.trace_steps>`:
``tallow bench``, the profiling scripts, and the server, whose ``host_seconds_total`` and
``step_seconds_total`` metrics add them up.
"""

from __future__ import annotations

import contextlib
import time
from typing import ContextManager, Protocol


class DeviceWork(Protocol):
    """Work queued on the device (a launched step)."""

    def is_done(self) -> bool:
        """Whether the device has finished it (never waits)."""
        ...


class TracedOutput(Protocol):
    """What a step call returns, as far as its timing goes."""

    step_time: float
    timings: dict[str, float]
    hidden: set[str]


class StepTracer:
    """Times the phases of one step call at a time."""

    #: whether the tracer records anything (the engine asks nothing of the device for it if not)
    enabled = True

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.hidden: set[str] = set()
        self._started = self._ended = time.perf_counter()
        self._phase = _Phase(self)  # one object for every phase: they run one at a time

    def start(self) -> None:
        """Begin a step call: forget the previous call's phases."""
        self.timings = {}
        self.hidden = set()
        self._started = self._ended = time.perf_counter()

    def phase(self, name: str) -> ContextManager[None]:
        """Add the wall time of the ``with`` block to phase ``name`` (a phase may run more
        than once in a call: its times add up; phases do not nest)."""
        self._phase.name = name
        return self._phase

    def hide_while_busy(self, work: DeviceWork, *phases: str) -> None:
        """Mark those of ``phases`` that ran in this call as hidden if the device is still
        running ``work`` now: it had queued work while they ran, so it did not wait for them."""
        if not work.is_done():
            timings, hidden = self.timings, self.hidden
            for phase in phases:
                if phase in timings:
                    hidden.add(phase)

    def unhide(self) -> None:
        """Nothing of this call was hidden after all (the device ran dry within it: a step
        launched after the one in flight was read back)."""
        self.hidden.clear()

    def stamp(self, out: TracedOutput) -> None:
        """Write the call's wall time (start to the end of its last phase), phases and hidden
        phases into ``out``."""
        out.step_time = self._ended - self._started
        out.timings = dict(self.timings)
        out.hidden = set(self.hidden)


class _Phase:
    """The running phase of a :class:`StepTracer`: a plain context manager, reused (a step
    enters several phases per call; a generator-based one costs several times more)."""

    __slots__ = ("tracer", "name", "began")

    def __init__(self, tracer: StepTracer) -> None:
        self.tracer = tracer
        self.name = ""
        self.began = 0.0

    def __enter__(self) -> None:
        self.began = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        now = time.perf_counter()
        tracer, name = self.tracer, self.name
        tracer._ended = now
        tracer.timings[name] = tracer.timings.get(name, 0.0) + now - self.began


class _NoTracer(StepTracer):
    """The tracer that records nothing (the default)."""

    enabled = False

    def __init__(self) -> None:
        super().__init__()
        self._no_phase: ContextManager[None] = contextlib.nullcontext()

    def start(self) -> None:
        pass

    def phase(self, name: str) -> ContextManager[None]:
        return self._no_phase

    def hide_while_busy(self, work: DeviceWork, *phases: str) -> None:
        pass

    def unhide(self) -> None:
        pass

    def stamp(self, out: TracedOutput) -> None:
        pass


#: the tracer of an engine whose steps are not timed
NO_TRACER: StepTracer = _NoTracer()

"""The step tracer: phases add up, hidden phases are those that ran while the device was busy,
the default tracer records nothing, and a constrained step reports its grammar-mask phase."""

from __future__ import annotations

import time

import pytest

from tallow import LLM, SamplingParams, StructuredOutputsParams
from tallow.engine.core import CoreOutput
from tallow.engine.step_tracer import NO_TRACER, StepTracer


class _Work:
    def __init__(self, done: bool) -> None:
        self.done = done
        self.asked = 0

    def is_done(self) -> bool:
        self.asked += 1
        return self.done


def test_phases_add_up_and_stamp_the_output():
    tracer = StepTracer()
    tracer.start()
    with tracer.phase("schedule"):
        time.sleep(0.002)
    with tracer.phase("post"):
        pass
    with tracer.phase("schedule"):  # a phase that runs twice in a call adds up
        time.sleep(0.002)
    out = CoreOutput()
    tracer.stamp(out)
    assert set(out.timings) == {"schedule", "post"}
    assert out.timings["schedule"] >= 0.004
    assert out.step_time >= sum(out.timings.values())
    # the next call starts afresh
    tracer.start()
    tracer.stamp(out)
    assert out.timings == {} and out.step_time == pytest.approx(0.0, abs=1e-3)


def test_only_phases_that_ran_while_the_device_was_busy_are_hidden():
    tracer = StepTracer()
    tracer.start()
    with tracer.phase("schedule"):
        pass
    tracer.hide_while_busy(_Work(done=True), "schedule")
    assert tracer.hidden == set()
    tracer.hide_while_busy(_Work(done=False), "schedule", "launch")  # launch never ran
    assert tracer.hidden == {"schedule"}
    out = CoreOutput()
    tracer.stamp(out)
    assert out.hidden == {"schedule"} and out.host_time == 0.0
    tracer.unhide()
    tracer.stamp(out)
    assert out.host_time == pytest.approx(out.timings["schedule"])


def test_the_default_tracer_records_nothing_and_never_asks_the_device():
    work = _Work(done=False)
    NO_TRACER.start()
    with NO_TRACER.phase("schedule"):
        pass
    NO_TRACER.hide_while_busy(work, "schedule")
    out = CoreOutput(step_time=0.0)
    NO_TRACER.stamp(out)
    assert not NO_TRACER.enabled and work.asked == 0
    assert out.timings == {} and out.hidden == set() and out.step_time == 0.0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_constrained_step_times_its_masks(tiny_llama, async_scheduling):
    llm = LLM(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        async_scheduling=async_scheduling,
    )
    engine = llm.engine
    engine.core.trace_steps()
    engine.add_request(
        "j",
        "The quick brown fox",
        SamplingParams(
            temperature=0.0,
            max_tokens=12,
            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]),
        ),
    )
    phases: set[str] = set()
    while engine.has_unfinished():
        engine.step()
        assert engine.last_step is not None
        phases |= set(engine.last_step.timings)
    assert "mask" in phases and {"schedule", "launch", "wait", "post"} <= phases

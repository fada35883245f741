"""A worker rank: build the engine the driver describes, then run each step it sends.

A worker owns its shard of the model and its KV cache (the KV heads of its query heads) and
nothing else: no scheduler, no sampler state, no requests. Per engine the driver sends the
configuration and plugin list (the worker loads exactly those plugins, at the driver's
versions, and builds the same model runner, so start-up collectives such as agreeing on the
KV cache's size and capturing CUDA graphs pair up), then one message per step
(:mod:`tallow.distributed.step_message`): the worker copies the KV blocks it names, uploads
its batch, runs the forward (its collectives meet the driver's) and computes the logits the
driver computes, and keeps the step's sampled token ids when the next step feeds on them.
It sends nothing back except through those collectives.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, cast

import torch

from tallow.config import TallowConfig
from tallow.distributed import launch
from tallow.distributed.collectives import broadcast_from_driver
from tallow.distributed.launch import WorkerSpec
from tallow.distributed.state import ParallelState
from tallow.distributed.step_message import (
    RELEASE,
    STOP,
    TOKENS_ARGMAX,
    TOKENS_BROADCAST,
    StepMessage,
)
from tallow.distributed.watchdog import die_with_parent, report_failure
from tallow.kernels import argmax_rows
from tallow.plugin.manager import load_pinned_plugins

if TYPE_CHECKING:
    from tallow.layers import CausalLM

    from .model_runner import ModelRunner

#: builds this rank's model runner as the driver builds its own
#: (:func:`tallow.engine.builder.build_runner`: config, registries, parallel state -> a
#: ``BuiltRunner``). It is handed in rather than imported because the builder, serving a rank
#: started by torchrun, calls into this module.
BuildRunner = Callable[[TallowConfig, Any, ParallelState], Any]

log = logging.getLogger("tallow.distributed")


class _Stopped(Exception):
    """The driver ended the group."""


def spawned_main(spec: WorkerSpec, build_runner: BuildRunner) -> None:
    """Entry point of a worker process spawned by :func:`tallow.distributed.launch.start`
    (``python -m tallow.distributed SPEC``)."""
    if spec.die_with_parent:
        die_with_parent()
    if os.getppid() != spec.parent_pid:  # the parent died before the line above took effect
        raise SystemExit(1)
    # Ctrl-C and a service manager's SIGTERM reach every process of the group: the driver
    # ends its workers (and if it dies, they die with it)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = spec.topology.rank
    logging.basicConfig(
        level=spec.log_level,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s %(name)s [rank {rank}]: %(message)s",
    )
    parallel = launch.join(spec)
    serve(parallel, build_runner)


def serve(parallel: ParallelState, build_runner: BuildRunner) -> None:
    """Serve the driver's engines until it stops the group; exits the process with status 1
    (after telling the driver why) when this rank cannot go on."""
    try:  # Ctrl-C reaches every rank started from the terminal: the driver ends the workers
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave the process's handlers as they are
        pass
    try:
        while True:
            startup = parallel.control.receive_object()
            if startup is None:
                break
            _serve_engine(parallel, startup, build_runner)
    except _Stopped:
        pass
    except BaseException as exc:
        watchdog = parallel.watchdog
        if watchdog is not None and (watchdog.stopping or watchdog.failure is not None):
            raise SystemExit(1) from None
        reason = f"tensor-parallel rank {parallel.rank} failed: {type(exc).__name__}: {exc}"
        log.debug("rank %d failed", parallel.rank, exc_info=True)
        if watchdog is not None:
            report_failure(watchdog.store, reason)
        print(f"tallow: {reason}", file=sys.stderr, flush=True)
        launch.shutdown()
        raise SystemExit(1) from None
    launch.shutdown()


def _serve_engine(
    parallel: ParallelState, startup: dict[str, Any], build_runner: BuildRunner
) -> None:
    config = TallowConfig.model_validate(startup["config"])
    plugins = load_pinned_plugins(startup["plugins"])
    plugins.hook.tallow_configure(config=config)
    runner = build_runner(config, plugins.registries, parallel).runner
    fed: torch.Tensor | None = None
    expected = 0
    try:
        while True:
            message = parallel.control.receive()
            if message.kind == STOP:
                raise _Stopped
            if message.kind == RELEASE:
                return
            if message.number != expected:
                raise RuntimeError(
                    f"expected step #{expected} of the driver, got {message.describe()}"
                )
            expected += 1
            fed = run_step(runner, message, fed)
    finally:
        del runner
        gc.collect()
        if parallel.device.type == "cuda":
            torch.cuda.empty_cache()


@torch.inference_mode()
def run_step(
    runner: ModelRunner, message: StepMessage, fed: torch.Tensor | None
) -> torch.Tensor | None:
    """Run the driver's step ``message`` on this rank's shard; returns the step's sampled token
    ids when the next step may feed on them (else None). ``fed`` are the previous step's."""
    runner.copy_blocks(message.copies)
    host = message.host
    if host is None:
        return None
    batch = runner.inputs.upload(runner.inputs.stage(host))
    hidden = runner.run_batch(batch, fed)
    model = cast("CausalLM", runner.model)  # an nn.Module to the runner
    for start, end in message.logit_rows:  # the driver's prompt logprobs, in its order
        model.compute_logits(hidden[start:end])
    if not host.num_sampled:
        return None
    logits = model.compute_logits(hidden.index_select(0, batch.sample_rows))
    if message.tokens == TOKENS_ARGMAX:
        return argmax_rows(logits)
    if message.tokens == TOKENS_BROADCAST:
        tokens = torch.empty(host.num_sampled, dtype=torch.int64, device=runner.device)
        return broadcast_from_driver(tokens)
    return None

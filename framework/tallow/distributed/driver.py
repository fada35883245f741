"""The driver's side of a tensor-parallel engine: hand the workers an engine, then its steps.

The scheduler runs once, on the driver (rank 0), which also runs rank 0's shard of the model.
:func:`open_engine` gives the workers the driver's configuration and plugin list (so that they
build the same engine), and returns the :class:`StepPublisher` the driver's model runner calls
each step:

- ``publish`` before the step runs: one :class:`~tallow.distributed.step_message.StepMessage`
  with the batch the runner built, sent to every worker;
- ``share_tokens`` after the driver sampled: the workers need a step's tokens only when the
  next step feeds on them on the device (async scheduling). When every row is plain greedy
  each rank takes the argmax of the same gathered logits itself (nothing is sent); otherwise
  rank 0 samples (on the full logits, with the requests' parameters, which only it knows) and
  broadcasts the token ids on the device group. The tokens the engine reports are always rank
  0's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .collectives import broadcast_from_driver
from .state import ParallelState
from .step_message import (
    RELEASE,
    STEP,
    TOKENS_ARGMAX,
    TOKENS_BROADCAST,
    TOKENS_NONE,
    StepMessage,
)

if TYPE_CHECKING:
    from tallow.config import TallowConfig
    from tallow.types import HostBatch


class GroupFailedError(RuntimeError):
    """A rank of the tensor-parallel group was lost; the engine cannot run another step."""


class StepPublisher:
    """Tells the workers each step of one engine (see the module docstring)."""

    def __init__(self, parallel: ParallelState, *, feeds_tokens: bool) -> None:
        self.parallel = parallel
        #: whether a step may feed on the previous one's tokens on the device (async
        #: scheduling): only then do the workers need them
        self.feeds_tokens = feeds_tokens
        self.steps = 0
        #: a newer engine took the group over (or it was shut down)
        self.retired = False
        self._tokens = TOKENS_NONE

    def _check(self) -> None:
        if self.retired:
            raise GroupFailedError(
                "this engine's tensor-parallel group now serves a newer "
                "engine (or was shut down); build the engine again"
            )
        failure = self.parallel.failure
        if failure is not None:
            raise GroupFailedError(failure)

    def publish(
        self,
        copies: list[tuple[int, ...]],  # (src, dst): one paged group
        host: HostBatch | None,  # None: copies only
        logit_rows: list[tuple[int, int]],
        greedy: bool,
    ) -> None:
        """Send the step the runner is about to run (``host`` None: only ``copies``)."""
        self._check()
        tokens = TOKENS_NONE
        if self.feeds_tokens and host is not None and host.num_sampled:
            tokens = TOKENS_ARGMAX if greedy else TOKENS_BROADCAST
        self._tokens = tokens
        message = StepMessage(STEP, self.steps, host, list(copies), logit_rows, tokens)
        with self.parallel.control.lock:
            self.parallel.control.send(message)
        self.steps += 1

    def share_tokens(self, token_ids: torch.Tensor) -> None:
        """After sampling: the workers' share of the step's token ids (see the module
        docstring)."""
        if self._tokens == TOKENS_BROADCAST:
            broadcast_from_driver(token_ids.contiguous())

    def release(self) -> None:
        """Free the workers from this engine (a newer one takes the group)."""
        if self.retired:
            return
        with self.parallel.control.lock:
            self.parallel.control.send(StepMessage(RELEASE, self.steps))
        self.retired = True


def open_engine(
    parallel: ParallelState, config: TallowConfig, plugins: dict[str, str], *, feeds_tokens: bool
) -> StepPublisher:
    """Make the group's workers build the engine of ``config`` with ``plugins`` (the
    driver's resolved plugin list: name → version); the caller builds its own meanwhile, in
    the same order (the start-up collectives pair up)."""
    previous = parallel.active
    if previous is not None:
        previous.release()
    with parallel.control.lock:
        parallel.control.send_object(
            {"config": config.model_dump(mode="json"), "plugins": dict(plugins)}
        )
    publisher = StepPublisher(parallel, feeds_tokens=feeds_tokens)
    parallel.active = publisher
    return publisher

"""The tensor-parallel group this process belongs to, for the code that needs to know.

One group per process at a time, set by :mod:`tallow.distributed.launch`. The model loader reads
:func:`tp_rank` and :func:`tp_size` into each layer's ``BuildContext``; the sharded layers'
collectives (:mod:`tallow.distributed.collectives`) run on :attr:`ParallelState.device_group`.
Without a group every answer is that of a single process (rank 0 of 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from .topology import Topology

if TYPE_CHECKING:
    import torch.distributed as dist

    from .step_message import ControlChannel
    from .watchdog import Watchdog, WorkerProcess


class EngineLink(Protocol):
    """What the group reads of the driver's link to the engine that uses it
    (:class:`tallow.distributed.driver.StepPublisher`, declared here by those members: the
    driver builds on this module)."""

    #: steps published so far
    steps: int
    #: a newer engine took the group over (or it was shut down)
    retired: bool

    def release(self) -> None: ...


@dataclass
class ParallelState:
    """A started group, as this process holds it."""

    topology: Topology
    device: torch.device
    #: the group of the model's collectives (NCCL on GPUs, gloo on CPUs): the default group
    device_group: dist.ProcessGroup | None
    #: driver → workers messages (tallow.distributed.step_message.ControlChannel, gloo)
    control: ControlChannel
    #: the rendezvous store (heartbeats and failure reports live under "tallow/")
    store: dist.Store
    #: watches the other ranks (tallow.distributed.watchdog.Watchdog)
    watchdog: Watchdog | None = None
    #: worker processes this process spawned
    processes: list[WorkerProcess] = field(default_factory=list)
    #: the driver's link of the engine that uses the group now (tallow.distributed.driver)
    active: EngineLink | None = None
    #: called with the reason when a rank fails (the driver's engine fails its requests)
    failure_handlers: list[Callable[[str], None]] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def is_driver(self) -> bool:
        return self.topology.is_driver

    @property
    def failure(self) -> str | None:
        """Why the group failed, once a rank was lost; else None."""
        return self.watchdog.failure if self.watchdog is not None else None

    def diagnose(self, wait: float = 1.0) -> str | None:
        """After a collective raised: the lost rank that explains it (the failure is then
        handled as the watchdog handles it), or None."""
        return self.watchdog.diagnose(wait) if self.watchdog is not None else None

    def on_failure(self, handler: Callable[[str], None]) -> None:
        """Call ``handler(reason)`` (from the watchdog's thread) when a rank fails."""
        self.failure_handlers.append(handler)


_current: ParallelState | None = None


def current() -> ParallelState | None:
    """The group of this process, or None when it runs alone."""
    return _current


def set_current(state: ParallelState | None) -> None:
    global _current
    _current = state


def tp_rank() -> int:
    return _current.rank if _current is not None else 0


def tp_size() -> int:
    return _current.world_size if _current is not None else 1

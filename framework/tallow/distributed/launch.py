"""Starting, joining and ending a tensor-parallel group.

:func:`start` is what the engine builder calls: it resolves the group from the settings and
the environment (:mod:`tallow.distributed.topology`), and

- when tallow launches the ranks, spawns this host's other ranks (one process per GPU, each a
  fresh interpreter running ``python -m tallow.distributed``: :class:`WorkerProcess`);
- when torchrun started every rank, joins them;

then initialises the process group: the rendezvous store on node 0 (which also carries
heartbeats and failure reports), the default group for the model's collectives (NCCL on
CUDA, gloo on CPU, ``parallel.collective_timeout_s``) and a gloo group for the driver's
messages (no timeout: a worker waits as long as the driver has nothing to run). NVLink
multicast is switched off in the environment first (:mod:`tallow.distributed.env`).

A process holds one group at a time. A second engine on the same group (another ``LLM`` with
the same parallel settings) reuses it: the driver releases the workers from the first engine
and hands them the second (:mod:`tallow.distributed.driver`). :func:`shutdown` (also run at
exit) stops the workers and destroys the group.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from . import state as state_mod
from .env import disable_nvlink_multicast, share_cpu_cores
from .state import ParallelState
from .step_message import ControlChannel, StepMessage, STOP
from .topology import Topology, resolve_topology
from .watchdog import (
    EXIT_GRACE_S,
    STOPPED_KEY,
    Watchdog,
    WorkerProcess,
    report_failure,
    stop_processes,
)

if TYPE_CHECKING:
    from tallow.config import TallowConfig

log = logging.getLogger("tallow.distributed")

#: the control group waits for the driver's next message for as long as it takes
_FOREVER = timedelta(days=3650)
_atexit_registered = False


@dataclass(frozen=True)
class WorkerSpec:
    """What a spawned worker needs before it can join the group (the rest comes from the
    driver once it has joined)."""

    topology: Topology
    collective_timeout_s: float
    heartbeat_timeout_s: float
    parent_pid: int
    log_level: str = "WARNING"
    #: the spawning thread was the main thread: the worker may ask the kernel to kill it when
    #: that thread ends (Linux ties PR_SET_PDEATHSIG to the thread, not the process; from
    #: another thread the parent-pid check of the watchdog does the job alone)
    die_with_parent: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "WorkerSpec":
        data = json.loads(text)
        return cls(**{**data, "topology": Topology(**data["topology"])})


def start(config: TallowConfig) -> ParallelState | None:
    """This process's group for ``config``, started or joined (see the module docstring), or
    None when the settings and the environment ask for a single process."""
    topology = resolve_topology(config.parallel, config.model.device)
    existing = state_mod.current()
    if existing is not None and (topology is None or not _same_group(existing.topology, topology)):
        shutdown()
        existing = None
    if topology is None:
        return None
    if existing is not None:
        return existing
    parallel = config.parallel
    return _start(
        topology,
        collective_timeout_s=parallel.collective_timeout_s,
        heartbeat_timeout_s=parallel.heartbeat_timeout_s,
        log_level=config.logging.level,
    )


def join(spec: WorkerSpec) -> ParallelState:
    """Join the group as the spawned worker ``spec`` describes."""
    return _start(
        spec.topology,
        collective_timeout_s=spec.collective_timeout_s,
        heartbeat_timeout_s=spec.heartbeat_timeout_s,
        log_level=spec.log_level,
        parent_pid=spec.parent_pid,
    )


def _same_group(old: Topology, new: Topology) -> bool:
    if new.master_port is None:  # "any free port": the port the old group took will do
        new = replace(new, master_port=old.master_port)
    return old == new


def _bind_device(topology: Topology) -> torch.device:
    device = torch.device(topology.device())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        share_cpu_cores(topology.local_world_size)
    return device


def _rendezvous(topology: Topology, timeout: timedelta) -> tuple[Any, Topology]:
    """The process group's store, and the topology with the port it listens on."""
    if topology.external:
        store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
        return store, topology
    store = dist.TCPStore(
        topology.master_addr,
        topology.master_port or 0,
        None,
        topology.rank == 0,
        timeout=timeout,
        wait_for_workers=False,
    )
    if topology.master_port is None:
        topology = replace(topology, master_port=store.port)
    return store, topology


def _store_client(topology: Topology, timeout_s: float) -> Any:
    """A connection of the watchdog's own to the rendezvous store."""
    return dist.TCPStore(
        topology.master_addr,
        int(topology.master_port or 0),
        None,
        False,
        timeout=timedelta(seconds=max(5.0, timeout_s)),
    )


def _spawn(
    topology: Topology, collective_timeout_s: float, heartbeat_timeout_s: float, log_level: str
) -> dict[int, WorkerProcess]:
    worker_level = "DEBUG" if log_level == "DEBUG" else "WARNING"
    children: dict[int, WorkerProcess] = {}
    for rank in topology.spawned_ranks():
        spec = WorkerSpec(
            topology.for_rank(rank),
            collective_timeout_s,
            heartbeat_timeout_s,
            parent_pid=os.getpid(),
            log_level=worker_level,
            die_with_parent=threading.current_thread() is threading.main_thread(),
        )
        popen = subprocess.Popen(
            [sys.executable, "-m", "tallow.distributed", spec.to_json()], stdin=subprocess.DEVNULL
        )
        children[rank] = WorkerProcess(rank, popen)
    if children:
        log.info(
            "tensor parallelism: spawned rank(s) %s (pids %s)",
            ", ".join(map(str, children)),
            ", ".join(str(p.pid) for p in children.values()),
        )
    return children


def _start(
    topology: Topology,
    *,
    collective_timeout_s: float,
    heartbeat_timeout_s: float,
    log_level: str,
    parent_pid: int | None = None,
) -> ParallelState:
    disable_nvlink_multicast()
    device = _bind_device(topology)
    timeout = timedelta(seconds=collective_timeout_s)
    store, topology = _rendezvous(topology, timeout)
    children = _spawn(topology, collective_timeout_s, heartbeat_timeout_s, log_level)
    if topology.is_driver:
        remote = [r for r in range(1, topology.world_size) if r not in children]
    else:
        remote = [0]
    holder: list[ParallelState] = []
    watchdog = Watchdog(
        rank=topology.rank,
        store=_store_client(topology, heartbeat_timeout_s),
        heartbeat_timeout_s=heartbeat_timeout_s,
        children=children,
        remote=remote,
        parent_pid=parent_pid,
        on_failure=lambda reason, own: _on_failure(holder, reason, own),
    )
    watchdog.start()
    try:
        dist.init_process_group(
            topology.backend,
            store=store,
            rank=topology.rank,
            world_size=topology.world_size,
            timeout=timeout,
        )
        control = ControlChannel(dist.new_group(backend="gloo", timeout=_FOREVER))
    except BaseException:
        watchdog.stop()
        stop_processes(list(children.values()), grace=1.0)
        raise
    parallel = ParallelState(
        topology, device, dist.group.WORLD, control, store, watchdog, list(children.values())
    )
    holder.append(parallel)
    state_mod.set_current(parallel)
    _register_atexit()
    log.info(
        "tensor parallelism: rank %d of %d on %s (node %d of %d, %s)",
        topology.rank,
        topology.world_size,
        device,
        topology.node_rank,
        topology.nnodes,
        topology.backend,
    )
    return parallel


def _on_failure(holder: list[ParallelState], reason: str, own_workers: bool) -> None:
    """The watchdog's verdict (see :mod:`tallow.distributed.watchdog`): the driver fails its
    engine's requests and exits after a grace period; a worker reports and exits now."""
    parallel = holder[0] if holder else None
    watchdog = parallel.watchdog if parallel is not None else None
    children = parallel.processes if parallel is not None else []
    rank = parallel.rank if parallel is not None else -1
    if parallel is None or parallel.is_driver:
        log.error("tensor-parallel group failed: %s", reason)
        for handler in list(parallel.failure_handlers if parallel is not None else []):
            try:
                handler(reason)
            except Exception:
                log.exception("a tensor-parallel failure handler failed")

        def leave() -> None:
            print(
                f"tallow: {reason}; the tensor-parallel group cannot continue, exiting",
                file=sys.stderr,
                flush=True,
            )
            stop_processes(children, grace=0.5)
            os._exit(1)

        threading.Timer(0.0 if parallel is None else EXIT_GRACE_S, leave).start()
        return
    if watchdog is not None and own_workers:
        report_failure(watchdog.store, f"{reason} (seen by rank {rank})")
    print(f"tallow: rank {rank}: {reason}; leaving", file=sys.stderr, flush=True)
    stop_processes(children, grace=0.5)
    os._exit(1)


def shutdown() -> None:
    """End this process's group: the driver tells its workers to stop, every process stops
    the workers it spawned and destroys the group. Idempotent; also run at exit."""
    parallel = state_mod.current()
    if parallel is None:
        return
    state_mod.set_current(None)
    if parallel.watchdog is not None:
        parallel.watchdog.stop()
    if parallel.is_driver and parallel.failure is None:
        if _tell_workers_to_stop(parallel):
            _wait_for_workers(parallel)
    elif not parallel.is_driver and parallel.watchdog is not None:
        try:  # tell the driver that this rank took the stop message
            parallel.watchdog.store.add(STOPPED_KEY, 1)
        except Exception:
            pass
    stop_processes(parallel.processes, grace=10.0)
    try:
        dist.destroy_process_group()
    except Exception:  # a group that failed may not tear down cleanly; the process is ending
        log.debug("destroying the process group failed", exc_info=True)


def _wait_for_workers(parallel: ParallelState, timeout: float = 5.0) -> None:
    """Wait (bounded) until every worker has taken the stop message, so that none of them
    sees the store (which this process hosts) vanish first and takes it for a failure."""
    store = parallel.watchdog.store if parallel.watchdog is not None else None
    if store is None:
        return
    deadline = time.monotonic() + timeout
    try:
        while int(store.add(STOPPED_KEY, 0)) < parallel.world_size - 1:
            if time.monotonic() > deadline:
                log.warning("tensor parallelism: not every worker acknowledged the stop")
                return
            time.sleep(0.02)
    except Exception:
        log.debug("waiting for the workers to stop failed", exc_info=True)


def _tell_workers_to_stop(parallel: ParallelState) -> bool:
    """Send the stop message; False when it could not be sent."""
    control = parallel.control
    # another thread of this process may be in the middle of a step: give it a moment, else
    # leave the workers to the parent-death and heartbeat checks
    if not control.lock.acquire(timeout=5.0):
        log.warning(
            "tensor parallelism: a step is still running; stopping the workers without telling them"
        )
        return False
    try:
        active = parallel.active
        if active is not None and not active.retired:
            control.send(StepMessage(STOP, active.steps))
            active.retired = True
        else:
            control.send_object(None)
        return True
    except Exception:
        log.debug("telling the workers to stop failed", exc_info=True)
        return False
    finally:
        control.lock.release()


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True

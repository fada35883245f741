"""Noticing a lost rank, on both sides of a tensor-parallel group.

Every rank runs a :class:`Watchdog` thread that beats its heartbeat (a counter in the
rendezvous store, ``tallow/heartbeat/<rank>``) every :func:`beat_interval` seconds.

- **The driver** watches the worker processes it spawned through their process handles (a dead
  one is seen within :data:`POLL_S`), the other ranks (other hosts, or ranks that torchrun
  started) through their heartbeats (dead when one has not moved for
  ``parallel.heartbeat_timeout_s``), and the failure reports other ranks write
  (``tallow/failure``: a host's first rank reports its own spawned workers, a worker its own
  start-up error). On the first failure it calls the group's failure handlers (the server's
  engine fails every request with a 503 naming the lost rank), logs one line, gives the
  responses :data:`EXIT_GRACE_S` to leave, stops the workers it spawned and exits the process
  with status 1: a group that lost a rank cannot run another step (an NCCL communicator
  with a dead peer hangs), so the process ends rather than leave clients waiting.
- **A worker** leaves (status 1, after stopping the workers it spawned) when the driver is
  gone: its heartbeat has not moved for the timeout, or the store it hosts cannot be reached.
  A spawned worker also dies with its parent (the parent process id checked every poll, and
  ``PR_SET_PDEATHSIG`` on Linux when the main thread spawned it), so no worker outlives its
  launch.

Bound: a spawned worker's death ends the driver within ``POLL_S + EXIT_GRACE_S`` (under 3 s); a
remote rank's within ``heartbeat_timeout_s + 1 + EXIT_GRACE_S``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch.distributed as dist

log = logging.getLogger("tallow.distributed")

#: how often the watchdog looks at processes and heartbeats
POLL_S = 0.1
#: seconds between a failure and the driver's exit (the 503 responses go out meanwhile)
EXIT_GRACE_S = 2.0
FAILURE_KEY = "tallow/failure"
#: how many workers have taken the driver's stop message
STOPPED_KEY = "tallow/stopped"


def heartbeat_key(rank: int) -> str:
    return f"tallow/heartbeat/{rank}"


def beat_interval(heartbeat_timeout_s: float) -> float:
    return max(POLL_S, min(1.0, heartbeat_timeout_s / 5))


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that started it ends (a no-op
    elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # no libc by that name: the parent-pid check still runs
        pass


class WorkerProcess:
    """A worker this process spawned (:func:`tallow.distributed.launch.start` spawns it, the
    watchdog watches it; defined here, below the launcher, which builds on this module): a fresh interpreter running ``python -m
    tallow.distributed`` (as torchrun starts its ranks), so the driver's own script is never
    imported again in the worker and needs no ``if __name__ == "__main__"`` guard."""

    def __init__(self, rank: int, popen: subprocess.Popen) -> None:
        self.rank = rank
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while it runs; its status, or minus the signal that killed it."""
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        if self.is_alive():
            self.popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self.popen.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


def describe_exit(process: WorkerProcess) -> str:
    code = process.exitcode
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def stop_processes(processes: list[WorkerProcess], grace: float = 0.0) -> None:
    """Give ``processes`` ``grace`` seconds to exit by themselves, then SIGKILL the rest and
    reap them (spawned workers ignore SIGTERM and SIGINT: their driver ends them)."""
    deadline = time.monotonic() + grace
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join(1.0)


class Watchdog(threading.Thread):
    """See the module docstring. ``store`` is a client of the rendezvous store of this
    thread's own (the process group's is never shared with it); ``children`` maps each rank
    this process spawned to its process; ``remote`` lists the ranks watched by heartbeat."""

    def __init__(
        self,
        *,
        rank: int,
        store: dist.Store,
        heartbeat_timeout_s: float,
        children: dict[int, WorkerProcess] | None = None,
        remote: list[int] | None = None,
        parent_pid: int | None = None,
        on_failure: Callable[[str, bool], None] | None = None,
    ) -> None:
        super().__init__(name=f"tallow-watchdog-{rank}", daemon=True)
        self.rank = rank
        self.store = store
        self.timeout = float(heartbeat_timeout_s)
        self.children = dict(children or {})
        self.remote = list(remote or [])
        self.parent_pid = parent_pid
        self.on_failure = on_failure
        self.failure: str | None = None
        self._failing = threading.Lock()
        self._stopping = threading.Event()
        #: rank -> (last counter value seen, when it changed)
        self._beats: dict[int, tuple[int, float]] = {}
        self._last_beat = 0.0

    def stop(self) -> None:
        """An orderly shutdown: the workers that leave now are not failures."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        interval = beat_interval(self.timeout)
        while not self._stopping.wait(POLL_S):
            try:
                now = time.monotonic()
                if now - self._last_beat >= interval:
                    self.store.add(heartbeat_key(self.rank), 1)
                    self._last_beat = now
                reason = self.check(now)
            except Exception as exc:  # the store is gone: its host (the driver) is
                if self._stopping.is_set():
                    return
                reason = (
                    f"the rendezvous store cannot be reached ({type(exc).__name__}: {exc})",
                    False,
                )
            if reason is not None and not self._stopping.is_set():
                self.fail(*reason)
                return

    def check(self, now: float) -> tuple[str, bool] | None:
        """Why the group has failed as far as this rank can tell, and whether it concerns the
        workers this process spawned (which only this process can tell the driver about);
        None while the group is whole."""
        if self.rank == 0 and self.store.check([FAILURE_KEY]):  # a rank's own account first
            return self.store.get(FAILURE_KEY).decode(errors="replace"), False
        for rank, process in self.children.items():
            if process.exitcode is not None:
                return (
                    f"tensor-parallel rank {rank} (pid {process.pid}) {describe_exit(process)}",
                    True,
                )
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            return f"the process that started rank {self.rank} has exited", False
        for rank in self.remote:
            value = int(self.store.add(heartbeat_key(rank), 0))
            seen = self._beats.get(rank)
            if seen is None or value != seen[0]:
                self._beats[rank] = (value, now)
            elif value > 0 and now - seen[1] > self.timeout:
                return (
                    f"tensor-parallel rank {rank} has sent no heartbeat for "
                    f"{now - seen[1]:.1f}s (parallel.heartbeat_timeout_s "
                    f"{self.timeout:g})",
                    False,
                )
        return None

    def diagnose(self, wait: float = 1.0) -> str | None:
        """Why the group failed, looking now rather than at the next poll (a collective has
        just raised: the lost rank may take a moment to show); None if no rank seems lost
        within ``wait`` seconds. A failure found is acted on as the watchdog would."""
        deadline = time.monotonic() + wait
        while self.failure is None:
            try:
                found = self.check(time.monotonic())
            except Exception as exc:
                found = (
                    f"the rendezvous store cannot be reached ({type(exc).__name__}: {exc})",
                    False,
                )
            if found is not None:
                self.fail(*found)
                break
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        return self.failure

    def fail(self, reason: str, own_workers: bool = False) -> None:
        """Record the group's first failure and act on it (see the module docstring);
        ``own_workers``: it concerns workers this process spawned."""
        with self._failing:
            if self.failure is not None:
                return
            self.failure = reason
        if self.on_failure is not None:
            self.on_failure(reason, own_workers)


def report_failure(store: dist.Store, reason: str) -> None:
    """Tell the driver why this rank's part of the group failed (best effort)."""
    try:
        store.set(FAILURE_KEY, reason)
    except Exception:  # the driver is gone too: nobody to tell
        pass

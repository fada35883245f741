"""Who is who in a tensor-parallel group: ranks, hosts, the rendezvous and the device of each.

Two ways to start a group, decided from the environment:

- **tallow launches it** (``--tensor-parallel-size N``, optionally ``--nnodes M --node-rank R``):
  each launch (one per host) runs ``N / M`` ranks, the launch itself taking the first of its
  host's ranks and spawning the others. Rank 0 (node 0's launch) is the driver.
- **torchrun (or another launcher) starts every rank** and sets ``WORLD_SIZE``, ``RANK``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``: each process is
  one rank and nothing is spawned.

Nothing here imports torch.distributed or starts anything; :func:`resolve_topology` only reads
the configuration and the environment and says what to do, or why it cannot be done.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from tallow.config import ParallelConfig

#: the port of the rendezvous across hosts when neither the settings nor $MASTER_PORT give one
#: (torchrun's default)
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class Topology:
    """The group as one process sees it."""

    world_size: int
    rank: int  # this process's global rank
    local_rank: int  # its index among the ranks of its host (its GPU)
    local_world_size: int  # ranks on this host
    nnodes: int
    node_rank: int
    master_addr: str
    #: the rendezvous port; None: the driver picks a free one (a single host, tallow launching)
    master_port: int | None
    #: True: a launcher (torchrun) started every rank; False: tallow spawns this host's others
    external: bool
    device_type: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo"

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def spawned_ranks(self) -> list[int]:
        """The ranks this process starts: the rest of its host's ranks when tallow launches
        (this process being the first of them), none under torchrun."""
        if self.external or self.local_rank != 0:
            return []
        return list(range(self.rank + 1, self.rank + self.local_world_size))

    def for_rank(self, rank: int) -> "Topology":
        """The topology of a rank of this host that this process spawns."""
        local = rank - (self.rank - self.local_rank)
        if not 0 <= local < self.local_world_size:
            raise ValueError(f"rank {rank} does not run on node {self.node_rank}")
        return Topology(
            self.world_size,
            rank,
            local,
            self.local_world_size,
            self.nnodes,
            self.node_rank,
            self.master_addr,
            self.master_port,
            self.external,
            self.device_type,
            self.backend,
        )

    def device(self) -> str:
        """The device of this rank: ``cuda:<local rank>`` or ``cpu``."""
        return f"cuda:{self.local_rank}" if self.device_type == "cuda" else "cpu"


class TopologyError(ValueError):
    """The settings and the environment do not describe a group that can run."""


def _env_int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise TopologyError(f"${name} is {environ[name]!r}, expected an integer") from None


def _device_type(model_device: str, cuda_available: bool) -> str:
    if model_device in ("", "auto"):
        return "cuda" if cuda_available else "cpu"
    if model_device == "cpu":
        return "cpu"
    if model_device == "cuda":
        if not cuda_available:
            raise TopologyError("model.device is 'cuda' but no CUDA device is available")
        return "cuda"
    raise TopologyError(
        f"model.device {model_device!r}: with tensor parallelism each rank takes "
        "the GPU of its local rank; expected auto, cuda or cpu"
    )


def _backend(name: str, device_type: str) -> str:
    if name == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if name == "nccl" and device_type != "cuda":
        raise TopologyError(
            "parallel.distributed_backend 'nccl' needs CUDA devices; the model "
            "runs on the CPU (use gloo or auto)"
        )
    return name


def resolve_topology(
    parallel: ParallelConfig,
    model_device: str = "auto",
    *,
    environ: Mapping[str, str] | None = None,
    cuda_devices: int | None = None,
) -> Topology | None:
    """The group that ``parallel`` (the ``parallel`` settings) and the environment describe,
    or None for a single process (no tensor parallelism). ``cuda_devices`` is how many GPUs
    this host has (asked of torch when None); raises :class:`TopologyError` naming the setting
    or variable at fault."""
    environ = os.environ if environ is None else environ
    tp = int(parallel.tensor_parallel_size)
    external = "WORLD_SIZE" in environ and "RANK" in environ
    if external:
        world = _env_int(environ, "WORLD_SIZE")
        if world == 1 and tp == 1:
            return None
        if tp not in (1, world):
            raise TopologyError(
                f"parallel.tensor_parallel_size is {tp} but the launcher started "
                f"{world} processes (WORLD_SIZE={world}); expected them to "
                "agree (or leave tensor_parallel_size at 1)"
            )
        rank = _env_int(environ, "RANK")
        local_world = (
            _env_int(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else world
        )
        local_rank = _env_int(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else rank
        if "MASTER_ADDR" not in environ or "MASTER_PORT" not in environ:
            raise TopologyError(
                "WORLD_SIZE and RANK are set but MASTER_ADDR or MASTER_PORT is "
                "not: start the ranks with torchrun, or set all four"
            )
        master_addr = environ["MASTER_ADDR"]
        master_port: int | None = _env_int(environ, "MASTER_PORT")
        nnodes = max(1, world // max(1, local_world))
        node_rank = (
            _env_int(environ, "GROUP_RANK")
            if "GROUP_RANK" in environ
            else rank // max(1, local_world)
        )
        if not 0 <= rank < world or not 0 <= local_rank < local_world:
            raise TopologyError(
                f"RANK={rank}, LOCAL_RANK={local_rank} do not fit WORLD_SIZE="
                f"{world}, LOCAL_WORLD_SIZE={local_world}"
            )
    else:
        nnodes, node_rank = int(parallel.nnodes), int(parallel.node_rank)
        if tp == 1:
            if nnodes != 1:
                raise TopologyError(
                    f"parallel.nnodes is {nnodes} but tensor_parallel_size is 1; "
                    "expected the ranks to span the nodes"
                )
            return None
        world = tp
        if tp % nnodes:
            raise TopologyError(
                f"parallel.tensor_parallel_size {tp} is not divisible by "
                f"parallel.nnodes {nnodes}: every node runs the same number of "
                "ranks"
            )
        if node_rank >= nnodes:
            raise TopologyError(
                f"parallel.node_rank {node_rank} is out of range for nnodes "
                f"{nnodes} (expected 0 .. {nnodes - 1})"
            )
        local_world = tp // nnodes
        rank, local_rank = node_rank * local_world, 0
        master_addr = parallel.master_addr or environ.get("MASTER_ADDR") or "127.0.0.1"
        if parallel.master_port is not None:
            master_port = int(parallel.master_port)
        elif "MASTER_PORT" in environ:
            master_port = _env_int(environ, "MASTER_PORT")
        else:
            master_port = None if nnodes == 1 else DEFAULT_MASTER_PORT
        if nnodes > 1 and not master_port:
            raise TopologyError(
                "parallel.master_port: across nodes every launch must name the "
                "same rendezvous port (0 picks a free one on a single node only)"
            )
    if cuda_devices is None:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device_type = _device_type(model_device, cuda_devices > 0)
    backend = _backend(str(parallel.distributed_backend), device_type)
    if device_type == "cuda" and local_world > cuda_devices:
        raise TopologyError(
            f"{local_world} tensor-parallel ranks on this host need as many GPUs; "
            f"it has {cuda_devices}"
        )
    return Topology(
        world,
        rank,
        local_rank,
        local_world,
        nnodes,
        node_rank,
        master_addr,
        master_port or None,
        external,
        device_type,
        backend,
    )

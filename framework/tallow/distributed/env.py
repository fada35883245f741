"""Process settings every rank applies before its process group starts."""

from __future__ import annotations

import logging
import os
from typing import MutableMapping

log = logging.getLogger("tallow.distributed")

#: NVLink multicast (NVLS / multimem collectives) stays off: NCCL's NVLS algorithms, torch's
#: symmetric-memory multicast and NVSHMEM's. They need fabric-manager multicast support that
#: partitioned or shared machines may not give, where they fail at communicator creation or
#: hang; the ring and tree algorithms serve tensor parallelism on one host just as well.
MULTICAST_OFF: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def disable_nvlink_multicast(environ: MutableMapping[str, str] | None = None) -> None:
    """Set :data:`MULTICAST_OFF` in ``environ`` (this process's environment, inherited by the
    processes it starts). Must run before the process group (and NCCL) initialises: NCCL
    reads its variables once."""
    environ = os.environ if environ is None else environ
    for name, value in MULTICAST_OFF.items():
        old = environ.get(name)
        if old is not None and old != value:
            log.warning("%s=%s replaced by %s: tallow keeps NVLink multicast off", name, old, value)
        environ[name] = value


def share_cpu_cores(local_world_size: int) -> None:
    """On a CPU, give each of this host's ranks its share of the cores: torch's intra-op
    threads of several ranks would otherwise contend for every core at once."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // max(1, local_world_size)))

"""Small host values onto the device without waiting for it."""

from __future__ import annotations

import torch
from numpy.typing import ArrayLike


def device_tensor(
    values: ArrayLike, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """A small host list or array as a tensor on ``device``, without waiting for the device.

    A plain copy from pageable memory to a GPU waits for all work queued on the stream; with
    async scheduling that is the whole step still running. Copying from pinned memory queues.
    """
    host = torch.as_tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host
    if host.numel() == 0:  # nothing to copy (and nothing to pin)
        return torch.empty(host.shape, dtype=dtype, device=device)
    return host.pin_memory().to(device, non_blocking=True)

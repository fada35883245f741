"""The CUDA device a ``model.device`` setting names, and whether it can run a plugin's kernels:
what a GPU backend checks when the engine asks whether it can serve a config."""

from __future__ import annotations

import torch


def cuda_index(device: str) -> int | None:
    """The device index ``model.device`` names ("cuda:N" -> N; "cuda", "auto" -> None, the
    current device)."""
    if device.startswith("cuda:"):
        try:
            return int(device.split(":", 1)[1])
        except ValueError:
            return None
    return None


def capability(index: int | None) -> tuple[int, int]:
    """Compute capability of CUDA device ``index`` (None: the current device)."""
    major, minor = torch.cuda.get_device_capability(
        index if index is not None else torch.cuda.current_device()
    )
    return major, minor


def cuda_device_reasons(
    device: str, min_capability: tuple[int, int]
) -> tuple[list[str], tuple[int, int] | None]:
    """(reasons the CUDA device ``model.device`` names cannot run kernels that need compute
    capability ``min_capability``, its capability). No CUDA, or a device index past the
    devices there are, is a reason and no capability."""
    if not torch.cuda.is_available():
        return ["no CUDA device (torch.cuda.is_available() is False)"], None
    index = cuda_index(device)
    if index is not None and index >= torch.cuda.device_count():
        return [
            f"model.device {device!r} does not exist ({torch.cuda.device_count()} CUDA device(s))"
        ], None
    cap = capability(index)
    if cap < min_capability:
        return [
            f"CUDA compute capability {cap[0]}.{cap[1]} is below "
            f"{min_capability[0]}.{min_capability[1]}"
        ], cap
    return [], cap

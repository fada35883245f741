"""Whether FlashInfer can run here: the package, its compiler, the GPU."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from typing import Any

from tallow.kernels import cuda_device_reasons

#: the oldest flashinfer-python whose wrappers this backend drives as it does
MIN_FLASHINFER = (0, 6, 6)
#: lowest CUDA compute capability: FlashInfer's bf16 kernels need Ampere
MIN_CAPABILITY = (8, 0)
INSTALL_HINT = "pip install 'tallow-attention-flashinfer[flashinfer]'"


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def flashinfer_version() -> str | None:
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def package_reasons() -> list[str]:
    """Reasons from the installed distribution alone (nothing imported)."""
    version = flashinfer_version()
    if version is None:
        return [f"flashinfer is not installed ({INSTALL_HINT})"]
    if _version_tuple(version) < MIN_FLASHINFER:
        need = ".".join(map(str, MIN_FLASHINFER))
        return [f"flashinfer-python {version} is older than {need} ({INSTALL_HINT})"]
    return []


def import_reasons() -> list[str]:
    """Reasons ``import flashinfer`` fails (it needs its FFI package, apache-tvm-ffi)."""
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason to refuse
        return [f"flashinfer cannot be imported: {type(exc).__name__}: {exc}"]
    return []


def nvcc_reasons() -> list[str]:
    """FlashInfer compiles its kernels just in time with nvcc (found as flashinfer finds it:
    $CUDA_HOME/bin, else PATH)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return []
    if shutil.which("nvcc"):
        return []
    return [
        "nvcc was not found (FlashInfer compiles its kernels just in time: install the "
        "CUDA toolkit and set CUDA_HOME or put nvcc on PATH)"
    ]


def device_reasons(device: str) -> tuple[list[str], tuple[int, int] | None]:
    """(reasons, compute capability) of the CUDA device ``model.device`` names."""
    return cuda_device_reasons(device, MIN_CAPABILITY)


def get(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        if obj is None:
            return default
        obj = getattr(obj, name, None)
    return default if obj is None else obj

"""Programmatic Dependent Launch (PDL) for the Triton kernels of the decode step.

A batch-1 decode step is a chain of a few hundred small kernels, and without PDL each one
starts only once the previous one has fully drained: the GPU idles between them. A kernel
launched with ``launch_pdl=True`` may be started while its predecessor in the stream still
runs (once every program of the predecessor has called ``griddepcontrol.launch_dependents`` or
exited), so its programs get resident and run their prologue during the predecessor's last
wave. Two device instructions order the overlap:

* :func:`wait_prior` (``griddepcontrol.wait``) blocks until the previous grid in the stream
  has completed and its writes are visible;
* :func:`allow_next` (``griddepcontrol.launch_dependents``) lets the next PDL-launched grid
  start; it gives no memory ordering of its own.

Rules every kernel that takes ``USE_PDL`` follows:

1. Before :func:`wait_prior` the kernel reads only memory no kernel of the step writes
   (weights, norm weights, the cos/sin table) and writes nothing. What the previous kernel
   writes may not be there yet. Writes must wait too: the caching allocator (inside a CUDA
   graph as well) reuses a block as soon as its tensor is freed on the host, which can be
   right after launching the kernel that still reads it, so this kernel's output may be the
   previous kernel's input.
2. :func:`allow_next` comes after the kernel's own :func:`wait_prior`. The next grid's wait
   then covers every earlier grid (this one completes only after its predecessor did), and at
   most two grids overlap. Calling it early costs nothing: the next grid starts only once every
   program of this one has called it, i.e. during this grid's last wave.
3. With ``USE_PDL`` false (a ``tl.constexpr``) neither instruction is emitted and the kernel
   compiles to the code it had before PDL existed: the path of the interpreter, of GPUs below
   compute capability 9.0, and of ``TALLOW_PDL=0``.

Launchers pass ``USE_PDL=use, launch_pdl=use`` with ``use = pdl_enabled(tensor)``: both or
neither, since a kernel launched with the attribute but compiled without the wait would read
its inputs too early.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from ._dispatch import interpreting

try:
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents
    from triton.language.extra.cuda import gdc_wait as _gdc_wait

    HAS_GDC = True
except ImportError:  # a Triton without grid dependency control: PDL stays off
    HAS_GDC = False

ENV_VAR = "TALLOW_PDL"

# set_pdl's in-process choice; None defers to the environment variable.
_override: bool | None = None


def set_pdl(enabled: bool | None) -> None:
    """Switch PDL on or off in this process, whatever ``TALLOW_PDL`` says (so a benchmark can
    compare both in one process); ``None`` goes back to the environment. On never enables it
    where the hardware or Triton lacks it. Kernels launched afterwards use the new setting;
    graphs captured before keep the launches they recorded."""
    global _override
    _override = None if enabled is None else bool(enabled)


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def _device(where: torch.Tensor | torch.device | str) -> torch.device:
    return where.device if isinstance(where, torch.Tensor) else torch.device(where)


def unsupported_reason(where: torch.Tensor | torch.device | str) -> str | None:
    """Why kernels on ``where`` (a tensor or its device) cannot use PDL, or None when they can
    (:func:`set_pdl` and ``TALLOW_PDL`` aside)."""
    device = _device(where)
    if device.type != "cuda":
        return f"{device} is not a CUDA device"
    if not HAS_GDC:
        return "this Triton has no tl.extra.cuda.gdc_wait"
    if interpreting():
        return "TRITON_INTERPRET=1 runs the kernels in Triton's interpreter"
    major, minor = _capability(
        device.index if device.index is not None else torch.cuda.current_device()
    )
    if major < 9:
        return f"PDL needs compute capability 9.0 or newer; {device} has {major}.{minor}"
    return None


def pdl_enabled(where: torch.Tensor | torch.device | str) -> bool:
    """Whether kernels working on ``where`` (a tensor or its device) launch with PDL: a CUDA
    device of compute capability 9.0 or newer, compiled kernels (not ``TRITON_INTERPRET=1``), a
    Triton with ``gdc_wait``, and not switched off by :func:`set_pdl` or ``TALLOW_PDL=0``.
    Cheap enough to ask at every launch (the capability is cached per device)."""
    if _override is None:
        if os.environ.get(ENV_VAR, "") == "0":
            return False
    elif not _override:
        return False
    return unsupported_reason(where) is None


def off_then_on(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn()`` with PDL switched off, then on, each followed by a device synchronisation; the
    switch is left on (``set_pdl(None)`` restores the environment's choice). For tests and
    benchmarks that compare the two launches."""
    set_pdl(False)
    off = fn()
    torch.cuda.synchronize()
    set_pdl(True)
    on = fn()
    torch.cuda.synchronize()
    return off, on


def compiled_with_pdl(kernel: Any) -> bool | None:  # Any: a triton JITFunction
    """Whether a variant of the Triton ``kernel`` in Triton's in-process cache was built for a
    PDL launch (with the wait in its code): tests and benchmarks check with it that the PDL
    path really ran. None where this Triton does not expose that cache."""
    caches = getattr(kernel, "device_caches", None)
    if caches is None:
        return None
    compiled = [k for entry in caches.values() for k in entry[0].values()]
    return any(
        getattr(k.metadata, "launch_pdl", False) and "griddepcontrol.wait" in k.asm.get("ptx", "")
        for k in compiled
    )


if HAS_GDC:

    @triton.jit
    def wait_prior(USE_PDL: tl.constexpr):
        """With ``USE_PDL``: wait until the previous grid has completed and its writes are
        visible. Emits nothing otherwise."""
        if USE_PDL:
            _gdc_wait()

    @triton.jit
    def allow_next(USE_PDL: tl.constexpr):
        """With ``USE_PDL``: let the next PDL-launched grid start (call after
        :func:`wait_prior`). Emits nothing otherwise."""
        if USE_PDL:
            _gdc_launch_dependents()
else:

    @triton.jit
    def wait_prior(USE_PDL: tl.constexpr):
        """No grid dependency control in this Triton: ``USE_PDL`` is never true here."""

    @triton.jit
    def allow_next(USE_PDL: tl.constexpr):
        """No grid dependency control in this Triton: ``USE_PDL`` is never true here."""

"""``triton.jit`` for kernels launched with step-dependent arguments.

Triton compiles one variant of a kernel per *specialization* of its arguments: integers equal
to 1 or divisible by 16, pointers aligned to 16 bytes. Arguments that change from one engine
step to the next (a sequence count, a block-table width, a slice of a packed metadata buffer
whose offset depends on the batch) would make a step compile a new variant — seconds of work
in the middle of serving. :func:`step_jit` turns those specializations off for the arguments
named; the values are then plain runtime arguments.
"""

from __future__ import annotations

import inspect
from typing import Callable, Iterable

import triton

_ALIGNMENT_OPTION = "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters


def step_jit(*, values: Iterable[str] = (), pointers: Iterable[str] = ()) -> Callable:
    """``triton.jit`` without value specialization for the integers in ``values`` and without
    alignment specialization for the pointers in ``pointers`` (where this Triton has that
    option; older versions specialize them as before)."""
    options: dict[str, list[str]] = {"do_not_specialize": list(values)}
    if _ALIGNMENT_OPTION:
        options["do_not_specialize_on_alignment"] = list(pointers)
    return triton.jit(**options)

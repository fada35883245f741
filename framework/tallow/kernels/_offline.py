"""Building Triton kernels for a GPU on a machine without one, for tests.

Triton's compiler lowers a kernel to PTX and a cubin for any target given its signature, so CI
without a GPU can check what the interpreter cannot: that a kernel type-checks and lowers for
real hardware with the arguments its launcher passes, how many registers it takes, whether its
loads are vectorised, which tensor-core instructions it uses, and where Programmatic Dependent
Launch's wait falls. Kernel tests of the core and of plugins share these helpers.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any, Callable, Mapping

_LOAD = re.compile(r"\bld\.global|\bcp\.async")
_STORE = re.compile(r"\bst\.global|\batom\.|\bred\.global")


def _aligned_by_default(name: str) -> bool:
    return name.endswith("_ptr") or name.startswith("stride")


def compile_for_gpu(
    kernel: Any,
    constexprs: Mapping[str, Any],
    types: Mapping[str, str],
    *,  # Any: a Triton JITFunction; triton is untyped here
    capability: int = 90,
    default_pointer: str = "*fp16",
    aligned: Callable[[str], bool] = _aligned_by_default,
    **options: Any,
) -> Any:  # Any: triton objects (triton has no type hints)
    """``kernel`` (a ``triton.jit`` function) compiled for ``sm_<capability>``.

    Arguments named in ``constexprs`` are compile-time constants (entries that name no
    argument, such as launch options a launcher keeps beside them, are left out); the others
    take their Triton
    type from ``types`` (``"*bf16"``, ``"i32"``...), else ``default_pointer`` for names ending
    in ``_ptr`` and ``"i32"`` for the rest. Those for which ``aligned(name)`` holds are declared
    divisible by 16, as the JIT specialises 16-byte-aligned pointers and strides. ``options``
    are Triton's (``num_warps``, ``num_stages``, ``launch_pdl``, ``enable_fp_fusion``...)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        signature[name] = types.get(name, default_pointer if name.endswith("_ptr") else "i32")
        if aligned(name):
            attrs[(i,)] = [["tt.divisibility", 16]]
    constants = {k: v for k, v in constexprs.items() if k in kernel.arg_names}
    source = ASTSource(kernel, signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


def _cuobjdump(compiled: Any, flag: str) -> str:  # Any: a triton CompiledKernel
    import triton

    cuobjdump = os.path.join(
        os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run(
            [cuobjdump, flag, f.name], check=True, capture_output=True, text=True
        ).stdout


def resource_usage(compiled: Any) -> dict[str, int]:  # Any: a triton CompiledKernel
    """Registers (``REG``), stack and local memory bytes (``STACK``, ``LOCAL``: non-zero means
    spills) of a compiled kernel, as ``cuobjdump`` reports them."""
    text = _cuobjdump(compiled, "--dump-resource-usage")
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text)}


_SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def sass_loops(compiled: Any) -> list[list[str]]:  # Any: a triton CompiledKernel
    """The machine instructions (SASS, as ``cuobjdump -sass`` prints them) of each loop of a
    compiled kernel: the instructions from a backward branch's target to the branch, longest
    loop first. Tests count what a kernel spends per iteration with it."""
    lines = []
    for line in _cuobjdump(compiled, "-sass").splitlines():
        m = _SASS_LINE.match(line)
        if m:
            lines.append((int(m.group(1), 16), m.group(2)))
    index = {address: i for i, (address, _) in enumerate(lines)}
    loops = []
    for i, (address, text) in enumerate(lines):
        m = _BRANCH.search(text)
        if m and int(m.group(1), 16) <= address and int(m.group(1), 16) in index:
            loops.append([t for _, t in lines[index[int(m.group(1), 16)] : i + 1]])
    return sorted(loops, key=len, reverse=True)


def opcode(instruction: str) -> str:
    """The opcode of a SASS instruction without its predicate and modifiers (``LOP3``,
    ``FFMA``, ``LDG``...)."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0].split(".")[0]


def pdl_order(ptx: str) -> tuple[int, int]:
    """(global loads, global stores) that come before ``griddepcontrol.wait`` in ``ptx``,
    after checking there is one wait and one launch_dependents, in that order."""
    lines = ptx.splitlines()
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    releases = [i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line]
    assert len(waits) == 1 and len(releases) == 1, (waits, releases)
    assert waits[0] < releases[0], "the next grid is released before this one waited"
    before = lines[: waits[0]]
    return (
        sum(bool(_LOAD.search(line)) for line in before),
        sum(bool(_STORE.search(line)) for line in before),
    )

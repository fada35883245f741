"""The SASS of the Triton attention plugin's kernels for caches that cast (bf16 and fp8 e4m3),
compiled for sm_90 without a GPU, to show that a change leaves their instructions as they are.

    python bench/attention_sass.py dump NEW.json
    git archive REV framework plugins/attention/triton | tar -x -C OLD
    PYTHONPATH=OLD/framework:OLD/plugins/attention/triton python bench/attention_sass.py dump OLD.json
    python bench/attention_sass.py compare OLD.json NEW.json

``dump`` builds the variants the llama-3-8b runs launch (32 query heads, 8 KV heads, head size
128, bf16 activations, 16-token blocks): split-K decode with one split, with several and the
store fused, with several and the store apart; prefill; the store. Each instruction is kept
with the constant-bank offsets of kernel parameters replaced (a kernel given more parameters
reads the same ones at other offsets). ``compare`` prints, per variant, whether the two
instruction lists are identical.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any, Iterator

INT_POINTERS = {
    "block_tables_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "qsl_ptr": "*i32",
    "slot_ptr": "*i64",
}
F32_POINTERS = {
    "part_acc_ptr",
    "part_ml_ptr",
    "sinks_ptr",
    "k_scale_ptr",
    "v_scale_ptr",
    "k_offset_ptr",
}
F16_POINTERS = {"k_scales_ptr", "v_scales_ptr"}
F32_SCALARS = {"qk_scale", "softcap"}
CACHE_POINTERS = {"k_cache_ptr", "v_cache_ptr"}


def build(kernel: Any, spec: dict[str, Any], cache: str) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = dict(spec)
    options = {"num_warps": spec.pop("num_warps"), "num_stages": spec.pop("num_stages", 3)}
    spec.pop("launch_pdl", None)
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(kernel.arg_names):
        if name in spec:
            signature[name] = "constexpr"
            constants[name] = spec[name]
            continue
        signature[name] = (
            INT_POINTERS.get(name)
            or ("*fp32" if name in F32_POINTERS else None)
            or ("*fp16" if name in F16_POINTERS else None)
            or (cache if name in CACHE_POINTERS else None)
            or ("*bf16" if name.endswith("_ptr") else None)
            or ("fp32" if name in F32_SCALARS else "i32")
        )
        if name.endswith("_ptr") or (name.startswith("stride_") and name != "stride_bt"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def sass(compiled: Any) -> list[str]:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run(
            [tool, "-sass", f.name], check=True, capture_output=True, text=True
        ).stdout
    lines = []
    for line in text.splitlines():
        match = re.search(r"/\*[0-9a-f]{4}\*/\s+(.*?);", line)
        if match:
            lines.append(re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[param]", match.group(1)))
    return lines


def variants() -> Iterator[tuple[str, Any, dict[str, Any], str]]:
    import torch

    from tallow_attention_triton import ops
    from tallow_attention_triton.kernels.decode import decode_split_kernel
    from tallow_attention_triton.kernels.prefill import prefill_kernel
    from tallow_attention_triton.kernels.store import store_kv_kernel

    for cache, nbytes, limit in (("*bf16", 2, 0.0), ("*fp8e4nv", 1, 448.0)):
        for single, fused in ((True, False), (False, True), (False, False)):
            spec = ops.decode_spec(
                num_heads=32,
                group=4,
                head_dim=128,
                dtype=torch.bfloat16,
                block_size=16,
                sliding_window=None,
                logit_softcap=None,
                mixed=False,
                single_split=single,
                fused_store=fused,
                saturate=limit,
                cache_bytes=nbytes,
            )
            yield (
                f"decode {cache} single_split={single} fused_store={fused}",
                decode_split_kernel,
                spec,
                cache,
            )
        spec = ops.prefill_spec(
            head_dim=128,
            group=4,
            dtype=torch.bfloat16,
            block_size=16,
            sliding_window=None,
            logit_softcap=None,
            skip_single_query=True,
            cache_bytes=nbytes,
        )
        yield f"prefill {cache}", prefill_kernel, spec, cache
        spec = ops.store_spec(num_kv_heads=8, head_dim=128, block_size=16, saturate=limit)
        yield f"store {cache}", store_kv_kernel, spec, cache


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "dump":
        out = {name: sass(build(kernel, spec, cache)) for name, kernel, spec, cache in variants()}
        with open(argv[1], "w") as f:
            json.dump(out, f)
        for name, lines in out.items():
            print(f"{name}: {len(lines)} instructions")
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        with open(argv[1]) as f:
            old = json.load(f)
        with open(argv[2]) as f:
            new = json.load(f)
        for name in old:
            a, b = old[name], new.get(name, [])
            changed = sum(
                1
                for line in difflib.unified_diff(a, b, lineterm="", n=0)
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            )
            print(
                f"{name}: {len(a)} -> {len(b)} instructions, "
                + ("identical" if a == b else f"{changed} lines differ")
            )
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

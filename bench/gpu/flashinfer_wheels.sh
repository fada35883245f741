#!/usr/bin/env bash
# Adds to ./.whl (the wheels carried to the GPU machine, which has no package registry) what the
# flashinfer attention backend needs there: flashinfer-python, pruned to the files its JIT
# compilation of paged attention reads, and apache-tvm-ffi (the FFI its compiled modules use).
# Everything else flashinfer imports (numpy, einops, ninja, nvidia-ml-py, click, tabulate, jinja2,
# packaging, requests, tqdm, torch) is already on that machine; nvidia-cutlass-dsl and
# nvidia-cudnn-frontend, also declared, are imported only by kernels the backend never uses.
#
# Usage, from the project root, after ../shared/gpu/fetch-wheels.sh (which empties .whl):
#   bash bench/gpu/flashinfer_wheels.sh [AOT_TARBALL]
# Both downloads are checked against the sha256 below, so the result is the same every time.
# AOT_TARBALL (optional): modules compiled on the GPU machine by bench/gpu/flashinfer_probe.py
# (OUT/jit/flashinfer-aot-sm90a.tar.gz, 5 MB: the bf16 head-size-128 decode, FA2 and FA3
# modules); copied into .whl, where bench/gpu/run_all.sh unpacks it so they need no compiling.
#
# Why 0.6.6: flashinfer-python wheels start at 0.5.0 (earlier versions are source only); up to
# 0.6.x they are ~7-8 MB, later ones grow (0.6.18: 18 MB, 0.7.4: 101 MB, with cuda-tile,
# nccl4py and nvidia-cutlass-dsl among their imports). 0.6.6 (March 2026) has the FA2 and FA3
# (SM90) paged prefill and decode kernels, sliding window, logit softcap and fp8 KV, compiles
# them just in time with the machine's nvcc through tvm-ffi (no build against torch's headers,
# so the torch version does not matter to the compiled modules), and imports without
# nvidia-cutlass-dsl or nvidia-cudnn-frontend.
#
# What is pruned, and why it is safe: the JIT compiles sources copied from data/csrc (top-level
# files only) with the include directories data/include, data/csrc, data/cutlass/include,
# data/cutlass/tools/util/include and data/spdlog/include (flashinfer/jit/cpp_ext.py). Dropped:
# cutlass's python package, examples, tests and tools other than util/include, and the csrc
# subfolders of other kernels (fmha_v2, nv_internal, xqa, fused_moe), which no attention module
# lists or includes: the decode module's compiler dependency file names only data/include and
# csrc/tvm_ffi_utils.h, and the pruned wheel compiled the decode, FA2 and FA3 (sm_90a) modules
# on the GPU machine (bench/gpu/flashinfer_probe.py). The Python package is kept whole, so
# `import flashinfer` works unchanged.
# Sizes (measured): flashinfer-python 0.6.6 7.8 MB -> 5.8 MB pruned; apache-tvm-ffi 3.3 MB; with
# the server's own missing wheels (../shared/gpu/fetch-wheels.sh, 3.5 MB) and the AOT tarball
# (5 MB), .whl holds about 18 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
FLASHINFER=flashinfer-python==0.6.6
FLASHINFER_SHA256=078f158636969eec1a0d3dea19c3ca90b426b66df89bbf7b7b8276ce2ec08148
TVM_FFI=apache-tvm-ffi==0.1.15.post2
TVM_FFI_SHA256=059eed9bfc94bcd41650fb8eefde74040a1bc7e7b1a6f0a8ff897b02b118875b

exclude="$(git rev-parse --git-common-dir 2>/dev/null || echo .git)/info/exclude"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
mkdir -p .whl
rm -f .whl/flashinfer_python-*.whl .whl/apache_tvm_ffi-*.whl .whl/flashinfer-aot-*.tar.gz
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%s --hash=sha256:%s\n%s --hash=sha256:%s\n' "$FLASHINFER" "$FLASHINFER_SHA256" \
  "$TVM_FFI" "$TVM_FFI_SHA256" > "$tmp/requirements.txt"
python3 -m pip download -q --no-deps --require-hashes --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$tmp" -r "$tmp/requirements.txt"
cp "$tmp"/apache_tvm_ffi-*.whl .whl/
python3 - "$tmp"/flashinfer_python-*.whl .whl <<'PY'
"""Copy the wheel without the files the attention JIT never reads; RECORD lists what stays."""
import pathlib, sys, zipfile

src, dest_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
DATA = "flashinfer/data/"
KEEP_UNDER_DATA = ("include/", "cutlass/include/", "cutlass/tools/util/include/",
                   "spdlog/include/")


def keep(name: str) -> bool:
    if not name.startswith(DATA):
        return True
    rest = name[len(DATA):]
    if rest.startswith("csrc/"):
        return "/" not in rest[len("csrc/"):]  # top-level sources and templates only
    if "/" not in rest:
        return True  # data/build_backend.py, data/build_utils.py
    return rest.startswith(KEEP_UNDER_DATA)


dest = dest_dir / src.name
dropped = 0
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
    record = next(i for i in zin.infolist() if i.filename.endswith(".dist-info/RECORD"))
    kept = set()
    for info in zin.infolist():
        if info is record:
            continue
        if keep(info.filename):
            zout.writestr(info, zin.read(info), compress_type=zipfile.ZIP_DEFLATED,
                          compresslevel=9)
            kept.add(info.filename)
        else:
            dropped += 1
    lines = zin.read(record).decode().splitlines()
    lines = [ln for ln in lines if ln.split(",", 1)[0] in kept or ln.startswith(record.filename)]
    zout.writestr(record, "\n".join(lines) + "\n", compress_type=zipfile.ZIP_DEFLATED)
print(f"{src.name}: {src.stat().st_size / 1e6:.1f} MB -> {dest.stat().st_size / 1e6:.1f} MB "
      f"({dropped} files dropped, {len(kept)} kept)")
PY
if [ $# -gt 0 ]; then
  install -m 644 "$1" .whl/flashinfer-aot-sm90a.tar.gz
fi
ls -l .whl/flashinfer_python-*.whl .whl/apache_tvm_ffi-*.whl .whl/flashinfer-aot-*.tar.gz 2>/dev/null
du -ch .whl/* | tail -1 | sed 's/total/all of .whl/'

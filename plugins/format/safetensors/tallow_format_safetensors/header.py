"""Reading a ``.safetensors`` file's header, checked against the file before any tensor is read.

Layout: a u64 little-endian length N; N bytes of UTF-8 JSON, an object mapping each tensor name
to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data section) plus an
optional ``"__metadata__"`` object of strings; then the data section, which the tensors must
cover exactly, without gaps or overlaps.

The safetensors library checks much the same when a file is opened, but its errors name neither
the file nor, mostly, the tensor, and it opens the files only as the weights are read — after
the model was built. Here every entry is checked when the checkpoint is read, and a failure is
a :class:`tallow.plugin.ModelFileError` naming the file, the tensor and the problem. Only the
header is read (at most the file's size, and at most the library's own 100 MB limit).
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
from dataclasses import dataclass
from typing import Any

from tallow.plugin import ModelFileError

#: the safetensors library refuses larger headers
MAX_HEADER_BYTES = 100_000_000
#: bits per element of every dtype the format defines
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header describes it; offsets are into the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_header(path: str | os.PathLike[str]) -> dict[str, TensorEntry]:
    """Every tensor entry of ``path``'s header, in data order.

    Raises :class:`ModelFileError` naming the file (and the tensor) when the header is
    malformed, a dtype unknown, a shape inconsistent with its byte span, or the spans do not
    tile the data section exactly (a truncated file, overlapping or out-of-range offsets).
    """
    path = pathlib.Path(path)
    size = path.stat().st_size
    if size < 8:
        raise ModelFileError(
            path,
            None,
            f"{size} bytes is too short to be a safetensors file "
            "(it is truncated or not safetensors)",
        )
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > MAX_HEADER_BYTES:
            raise ModelFileError(
                path,
                "header",
                f"its length field says {length:,} bytes, more "
                f"than the {MAX_HEADER_BYTES:,} the format "
                "allows: the file is damaged or not safetensors",
            )
        if 8 + length > size:
            raise ModelFileError(
                path,
                "header",
                f"its length field says {length:,} bytes but "
                f"the file has {size - 8:,} after it: the file "
                "is truncated or the length is corrupt",
            )
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFileError(
            path, "header", f"is not valid UTF-8 ({exc.reason} at byte {8 + exc.start})"
        ) from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ModelFileError(path, "header", f"is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ModelFileError(
            path,
            "header",
            f"is a JSON {type(header).__name__}; expected an "
            "object of tensor name -> {dtype, shape, "
            "data_offsets}",
        )
    metadata = header.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ModelFileError(
            path, f"header '{METADATA_KEY}'", "expected an object of string values"
        )
    entries = sorted(
        (_entry(path, name, info) for name, info in header.items()), key=lambda e: (e.begin, e.end)
    )
    _check_tiling(path, entries, size - 8 - length)
    return {e.name: e for e in entries}


def _entry(path: pathlib.Path, name: str, info: Any) -> TensorEntry:
    field = f"tensor {name!r}"
    if not isinstance(info, dict):
        raise ModelFileError(
            path, field, f"{info!r}; expected an object with dtype, shape and data_offsets"
        )
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BITS:
        known = ", ".join(sorted(DTYPE_BITS))
        raise ModelFileError(path, field, f"dtype {dtype!r} is not a safetensors dtype ({known})")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise ModelFileError(
            path, field, f"shape {shape!r}; expected a list of non-negative integers"
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise ModelFileError(
            path, field, f"data_offsets {offsets!r}; expected [begin, end] with 0 <= begin <= end"
        )
    elements = 1
    for dim in shape:  # Python integers: no overflow, only a size to compare
        elements *= dim
    bits = elements * DTYPE_BITS[dtype]
    span = offsets[1] - offsets[0]
    if bits % 8 or bits // 8 != span:
        raise ModelFileError(
            path,
            field,
            f"shape {shape} of {dtype} takes {bits / 8:,g} bytes "
            f"but data_offsets {offsets} span {span:,}",
        )
    return TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])


def _check_tiling(path: pathlib.Path, entries: list[TensorEntry], data_bytes: int) -> None:
    """The spans, sorted, must cover the data section exactly: from 0, no gap, no overlap."""
    covered = 0
    previous: TensorEntry | None = None
    for entry in entries:
        field = f"tensor {entry.name!r}"
        if entry.end > data_bytes:
            raise ModelFileError(
                path,
                field,
                f"data_offsets [{entry.begin:,}, {entry.end:,}] "
                f"run past the data section's {data_bytes:,} "
                "bytes: the file is truncated (or the offsets "
                "are corrupt)",
            )
        if entry.begin < covered and previous is not None:
            raise ModelFileError(
                path,
                field,
                f"data_offsets [{entry.begin:,}, {entry.end:,}] "
                f"overlap tensor {previous.name!r} "
                f"[{previous.begin:,}, {previous.end:,}]",
            )
        if entry.begin > covered:
            raise ModelFileError(
                path,
                field,
                f"data_offsets start at {entry.begin:,}, leaving "
                f"bytes {covered:,} to {entry.begin:,} of the data "
                "section unused (the format allows no gaps)",
            )
        covered, previous = entry.end, entry
    if covered != data_bytes:
        raise ModelFileError(
            path,
            None,
            f"the tensors cover {covered:,} bytes of a data "
            f"section of {data_bytes:,}: {data_bytes - covered:,} "
            "bytes after the last tensor belong to none",
        )

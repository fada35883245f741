"""Reading one GGUF file's header — metadata and tensor index — with every count, length and
offset checked against the file before it is used.

Layout (GGUF versions 2 and 3, little-endian): the magic ``GGUF``, a u32 version, a u64 tensor
count and a u64 metadata count; the metadata, each a key string, a u32 value type and the
value; the tensor index, each a name string, a u32 dimension count, that many u64 dimensions
(fastest first), a u32 GGML type and a u64 offset into the data section; padding up to the
alignment (``general.alignment``, default 32); the data section. A string is a u64 byte length
and that many UTF-8 bytes; an array is a u32 item type, a u64 item count and the items.

The ``gguf`` package's reader trusts these counts: a corrupt one sends it into a loop of
billions of empty reads, or on to a bare ``IndexError``. Here a count is compared with the bytes
left in the file before anything is allocated from it, each tensor's bytes must lie inside the
file, aligned and apart from the others, and every failure is a
:class:`tallow.plugin.ModelFileError` naming the file, the field and the problem. The file is
memory-mapped; tensor data is only viewed, never read, until it is dequantized.
"""

from __future__ import annotations

import mmap
import os
import pathlib
import struct
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

from tallow.plugin import ModelFileError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
#: ggml's GGML_MAX_DIMS: a tensor has one to four dimensions
MAX_DIMS = 4
#: arrays of arrays are not written by any converter; a few levels are allowed, not unbounded
MAX_ARRAY_DEPTH = 3
#: magic, version, tensor count, metadata count
_HEADER_BYTES = 24
#: the least a metadata entry takes: key length, value type, a one-byte value
_MIN_KV_BYTES = 8 + 4 + 1
#: the least a tensor index entry takes: name length, n_dims, one dimension, type, offset
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
#: scalar value types: struct format (little-endian) and numpy dtype of an array of them
_SCALARS: dict[GGUFValueType, tuple[struct.Struct, np.dtype]] = {
    GGUFValueType.UINT8: (struct.Struct("<B"), np.dtype("<u1")),
    GGUFValueType.INT8: (struct.Struct("<b"), np.dtype("<i1")),
    GGUFValueType.UINT16: (struct.Struct("<H"), np.dtype("<u2")),
    GGUFValueType.INT16: (struct.Struct("<h"), np.dtype("<i2")),
    GGUFValueType.UINT32: (struct.Struct("<I"), np.dtype("<u4")),
    GGUFValueType.INT32: (struct.Struct("<i"), np.dtype("<i4")),
    GGUFValueType.FLOAT32: (struct.Struct("<f"), np.dtype("<f4")),
    GGUFValueType.UINT64: (struct.Struct("<Q"), np.dtype("<u8")),
    GGUFValueType.INT64: (struct.Struct("<q"), np.dtype("<i8")),
    GGUFValueType.FLOAT64: (struct.Struct("<d"), np.dtype("<f8")),
    GGUFValueType.BOOL: (struct.Struct("<?"), np.dtype("<u1")),
}
#: tensor types stored as plain numbers, and the numpy dtype of their data
_PLAIN_DTYPES: dict[GGMLQuantizationType, np.dtype] = {
    GGMLQuantizationType.F32: np.dtype("<f4"),
    GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("<i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}


@dataclass(frozen=True)
class GGUFTensor:
    """One entry of a GGUF tensor index, with a lazy view of its bytes.

    ``shape`` is in GGUF order (``shape[0]``, the row length, first); ``data`` views the
    memory-mapped bytes laid out as the ``gguf`` package's reader lays them out: plain types as
    numbers of torch-order shape, block-quantized types as rows of bytes.
    """

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    #: absolute position of the first byte in the file
    data_offset: int
    path: pathlib.Path
    buffer: Any = field(repr=False, compare=False)

    @property
    def data(self) -> np.ndarray:
        dims = tuple(reversed(self.shape))
        dtype = _PLAIN_DTYPES.get(self.tensor_type)
        if dtype is None:
            dtype, dims = np.dtype(np.uint8), quant_shape_to_byte_shape(dims, self.tensor_type)
        count = self.n_bytes // dtype.itemsize
        return np.frombuffer(
            self.buffer, dtype=dtype, count=count, offset=self.data_offset
        ).reshape(dims)


@dataclass
class GGUFHeader:
    """What :func:`read_header` found in one file."""

    path: pathlib.Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    alignment: int
    #: where the data section starts
    data_start: int
    file_size: int


class _Cursor:
    """Reads the header front to back; every read is checked against the file's end."""

    def __init__(self, path: pathlib.Path, buffer: Any, size: int) -> None:
        self.path = path
        self.buffer = buffer
        self.size = size
        self.pos = 0

    def error(self, field: str | None, problem: str) -> ModelFileError:
        return ModelFileError(self.path, field, problem)

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, field: str, what: str) -> None:
        if n > self.remaining:
            raise self.error(
                field,
                f"{what} of {n:,} bytes at offset {self.pos:,} runs past the "
                f"end of the file ({self.size:,} bytes): the file is "
                "truncated (or a length or count before it is corrupt)",
            )

    def unpack(self, fmt: struct.Struct, field: str) -> Any:
        self.need(fmt.size, field, "a value")
        value = fmt.unpack_from(self.buffer, self.pos)[0]
        self.pos += fmt.size
        return value

    def u32(self, field: str) -> int:
        return self.unpack(_U32, field)

    def u64(self, field: str) -> int:
        return self.unpack(_U64, field)

    def string(self, field: str) -> str:
        length = self.u64(field)
        self.need(length, field, "a string")
        raw = self.buffer[self.pos : self.pos + length]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(
                field, f"is not valid UTF-8 ({exc.reason} at byte {exc.start} of the string)"
            ) from None
        self.pos += length
        return text

    def value_type(self, field: str) -> GGUFValueType:
        at = self.pos
        raw = self.u32(field)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.error(
                field,
                f"unknown value type {raw} at offset {at:,} (known: 0 to {max(GGUFValueType)})",
            ) from None

    def value(self, kind: GGUFValueType, field: str) -> Any:
        if kind is GGUFValueType.STRING:
            return self.string(field)
        if kind is GGUFValueType.ARRAY:
            return self.array(field, depth=0)
        fmt, _ = _SCALARS[kind]
        return self.unpack(fmt, field)

    def array(self, field: str, depth: int) -> list[Any]:
        if depth >= MAX_ARRAY_DEPTH:
            raise self.error(field, f"arrays nested more than {MAX_ARRAY_DEPTH} deep")
        item = self.value_type(field + " (array item type)")
        count = self.u64(field + " (array length)")
        least = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}.get(item) or _SCALARS[item][
            1
        ].itemsize
        if count * least > self.remaining:
            raise self.error(
                field,
                f"an array of {count:,} {item.name} items needs at least "
                f"{count * least:,} bytes but {self.remaining:,} remain: "
                "the length is corrupt or the file is truncated",
            )
        if item in _SCALARS:
            dtype = _SCALARS[item][1]
            values = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.pos)
            self.pos += count * dtype.itemsize
            return (values != 0).tolist() if item is GGUFValueType.BOOL else values.tolist()
        if item is GGUFValueType.STRING:
            return self.strings(field, count)
        return [self.array(f"{field}[{i}]", depth + 1) for i in range(count)]

    def strings(self, field: str, count: int) -> list[str]:
        # The vocabulary arrays hold 100k+ strings: one tight loop, checked as it goes.
        buffer, size, pos = self.buffer, self.size, self.pos
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"{field}[{i}]", "a string length")
            length = unpack(buffer, pos)[0]
            pos += 8
            if length > size - pos:
                self.pos = pos
                self.need(length, f"{field}[{i}]", "a string")
            try:
                append(buffer[pos : pos + length].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise self.error(f"{field}[{i}]", f"is not valid UTF-8 ({exc.reason})") from None
            pos += length
        self.pos = pos
        return out


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """The metadata (plain Python values) and tensor index of one GGUF file.

    Raises :class:`~tallow.plugin.ModelFileError` naming the file and the field when the file
    is not a GGUF file, is truncated, or holds a count, length, type or offset that cannot be
    right; nothing larger than the file is allocated on the way.
    """
    path = pathlib.Path(path)
    size = path.stat().st_size
    if size < _HEADER_BYTES:
        raise ModelFileError(
            path,
            None,
            f"{size} bytes is too short to be a GGUF file (the "
            f"header alone takes {_HEADER_BYTES}); it is truncated "
            "or not a GGUF file",
        )
    with open(path, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(path, buffer, size)
    magic = buffer[:4]
    if magic != MAGIC:
        raise cursor.error(
            "header", f"starts with {magic!r} instead of the GGUF magic {MAGIC!r}; not a GGUF file"
        )
    cursor.pos = 4
    version = cursor.u32("header 'version'")
    if version not in VERSIONS:
        if int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
            raise cursor.error(
                "header 'version'",
                "the file is big-endian; tallow reads little-endian GGUF files only",
            )
        raise cursor.error(
            "header 'version'",
            f"GGUF version {version} is not supported "
            f"(versions {', '.join(map(str, VERSIONS))} are)",
        )
    tensor_count = cursor.u64("header 'tensor_count'")
    kv_count = cursor.u64("header 'kv_count'")
    _check_count(cursor, "header 'kv_count'", kv_count, _MIN_KV_BYTES, "metadata entries")
    _check_count(
        cursor,
        "header 'tensor_count'",
        tensor_count,
        _MIN_TENSOR_INFO_BYTES,
        "tensor index entries",
    )
    metadata = _read_metadata(cursor, kv_count)
    _check_count(
        cursor,
        "header 'tensor_count'",
        tensor_count,
        _MIN_TENSOR_INFO_BYTES,
        "tensor index entries",
    )
    alignment = _alignment(cursor, metadata)
    infos = [_read_tensor_info(cursor, i, alignment) for i in range(tensor_count)]
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = _place_tensors(cursor, infos, data_start)
    return GGUFHeader(path, version, metadata, tensors, alignment, data_start, size)


def _check_count(cursor: _Cursor, field: str, count: int, least: int, what: str) -> None:
    if count * least > cursor.remaining:
        raise cursor.error(
            field,
            f"{count:,} {what} need at least {count * least:,} bytes but "
            f"the file has {cursor.remaining:,} left after offset "
            f"{cursor.pos:,}: the count is corrupt or the file is "
            "truncated",
        )


def _read_metadata(cursor: _Cursor, count: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for i in range(count):
        key = cursor.string(f"metadata key #{i}")
        field = f"metadata {key!r}"
        if key in metadata:
            raise cursor.error(field, "the key appears twice")
        kind = cursor.value_type(field + " (value type)")
        metadata[key] = cursor.value(kind, field)
    return metadata


def _alignment(cursor: _Cursor, metadata: dict[str, Any]) -> int:
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise cursor.error(
            "metadata 'general.alignment'", f"{alignment!r}; expected a power of two"
        )
    return alignment


def _read_tensor_info(cursor: _Cursor, index: int, alignment: int) -> GGUFTensor:
    """One tensor index entry; its ``data_offset`` is still relative to the data section."""
    name = cursor.string(f"tensor #{index} name")
    field = f"tensor {name!r}"
    n_dims = cursor.u32(field + " (dimension count)")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cursor.error(field, f"{n_dims} dimensions; a tensor has 1 to {MAX_DIMS}")
    shape = tuple(cursor.u64(f"{field} (dimension {d})") for d in range(n_dims))
    raw_type = cursor.u32(field + " (type)")
    try:
        tensor_type = GGMLQuantizationType(raw_type)
        block, type_size = GGML_QUANT_SIZES[tensor_type]
    except (ValueError, KeyError):
        raise cursor.error(field, f"unknown GGML tensor type {raw_type}") from None
    offset = cursor.u64(field + " (data offset)")
    if 0 in shape:
        raise cursor.error(field, f"shape {list(shape)} has a zero dimension")
    if shape[0] % block:
        raise cursor.error(
            field, f"rows of {shape[0]} values are not whole {tensor_type.name} blocks of {block}"
        )
    if offset % alignment:
        raise cursor.error(field, f"data offset {offset:,} is not aligned to {alignment} bytes")
    n_elements = 1
    for dim in shape:  # Python integers: a corrupt dimension cannot overflow, only be large
        n_elements *= dim
    return GGUFTensor(
        name,
        tensor_type,
        shape,
        n_elements,
        n_elements // block * type_size,
        offset,
        cursor.path,
        cursor.buffer,
    )


def _place_tensors(
    cursor: _Cursor, infos: list[GGUFTensor], data_start: int
) -> dict[str, GGUFTensor]:
    """The tensors at their place in the file, each checked to lie inside it and apart from
    the others."""
    tensors: dict[str, GGUFTensor] = {}
    for info in infos:
        field = f"tensor {info.name!r}"
        if info.name in tensors:
            raise cursor.error(field, "the name appears twice in the tensor index")
        start = data_start + info.data_offset
        end = start + info.n_bytes
        if end > cursor.size:
            raise cursor.error(
                field,
                f"{info.tensor_type.name} data of shape "
                f"{list(info.shape)} needs bytes {start:,} to {end:,} but "
                f"the file ends at {cursor.size:,}: the file is truncated "
                "(or the tensor's offset or shape is corrupt)",
            )
        tensors[info.name] = replace(info, data_offset=start)
    ordered = sorted(tensors.values(), key=lambda t: t.data_offset)
    for before, after in zip(ordered, ordered[1:]):
        before_end = before.data_offset + before.n_bytes
        if after.data_offset < before_end:
            span = f"bytes {before.data_offset:,} to {before_end:,}"
            raise cursor.error(
                f"tensor {after.name!r}",
                f"its data (from byte {after.data_offset:,}) overlaps the data "
                f"of tensor {before.name!r} ({span})",
            )
    return tensors

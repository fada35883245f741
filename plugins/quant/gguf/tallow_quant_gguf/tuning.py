"""Which kernel, with which tiles, each quantized matmul runs on a GPU.

Three paths (:mod:`tallow_quant_gguf.ops`): ``gemv`` (one row, CUDA cores,
:mod:`~tallow_quant_gguf.kernels.gemv`), ``mma`` (tensor cores, any rows,
:mod:`~tallow_quant_gguf.kernels.matmul`) and ``dequant`` (the weight decoded into a workspace,
then cuBLAS). The choice depends on the weight's type and shape and on the number of rows ``M``,
bucketed (:data:`BUCKETS`: 1, 2-4, 5-16, 17-64, 65-256, 257-512, 513 and more).

A *tuned table* (JSON, written by ``bench/gpu/quant_micro.py --sweep``) records the fastest
path and configuration the sweep timed for each ``(type, N, K, bucket)``; tables shipped in
``tallow_quant_gguf/tuned/`` are used on the GPU they were measured on (matched by device
name), and the setting ``tuned_table`` names another file. Shapes and types the table lacks
take :func:`default_choice`.

Every choice is a pure function of the type, the shape and ``M``: the same call always runs
the same kernel, so CUDA graphs replay what was captured, and ``ops.warm_up`` can compile
every variant before serving.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

#: the largest M of each bucket (the last one is unbounded)
BUCKETS = (1, 4, 16, 64, 256, 512, 4096)
PATHS = ("gemv", "mma", "dequant")
#: config lengths per path: gemv (rows per program, warps, K slices, prefetch);
#: mma (BM, BN, quads per step, warps, stages, K slices, decoding: 0 generic, 1 fp16 pairs in
#: PTX, 2 float32 from exponent bits)
CONFIG_LENGTHS = {"gemv": 4, "mma": 7, "dequant": 0}
TUNED_DIR = Path(__file__).with_name("tuned")
#: the table format's version: a table of another version is refused
FORMAT = 1


def bucket(m: int) -> int:
    """The bucket (its largest M) that ``m`` rows fall in."""
    for top in BUCKETS:
        if m <= top:
            return top
    return BUCKETS[-1]


@dataclass(frozen=True)
class Choice:
    path: str
    config: tuple = ()


def default_choice(qtype: str, n: int, k: int, m: int, sm_count: int = 132) -> Choice:
    """The path and configuration where no tuned entry exists: the GEMV for one row (split
    along K while its one-warp row blocks would give an SM fewer than 12 warps to hide the
    memory latency with, keeping two K steps per slice), the tensor-core kernel up to 512
    rows, the workspace and cuBLAS above."""
    if m == 1:
        rows = 4
        blocks = -(-n // rows)
        splits = 1
        while blocks * splits < 12 * sm_count and splits < 8 and k // 32 >= 64 * splits:
            splits *= 2
        return Choice("gemv", (rows, 1, splits, True))
    if m <= 16:
        return Choice("mma", (16, 64, 8, 4, 3, _mma_splits(n, 64, 1, k, sm_count), 1))
    if m <= 64:
        return Choice("mma", (64, 64, 8, 4, 3, _mma_splits(n, 64, -(-m // 64), k, sm_count),
                              1))
    if m <= 512:
        return Choice("mma", (128, 128, 4, 8, 3,
                              _mma_splits(n, 128, -(-m // 128), k, sm_count), 2))
    return Choice("dequant")


def _mma_splits(n: int, bn: int, m_blocks: int, k: int, sm_count: int) -> int:
    tiles = -(-n // bn) * m_blocks
    splits = 1
    while tiles * splits < sm_count and splits < 8 and k // 32 >= 32 * splits:
        splits *= 2
    return splits


def validate_entry(entry: dict[str, Any], where: str) -> tuple[tuple[str, int, int, int], Choice]:
    """One table entry → ``((type, n, k, bucket), choice)``; ValueError naming the field."""
    for field, kind in (("type", str), ("n", int), ("k", int), ("m", int), ("path", str)):
        if not isinstance(entry.get(field), kind) or isinstance(entry.get(field), bool):
            raise ValueError(f"{where}: field {field!r} must be a {kind.__name__}, got "
                             f"{entry.get(field)!r}")
    path = entry["path"]
    if path not in PATHS:
        raise ValueError(f"{where}: path must be one of {', '.join(PATHS)}, got {path!r}")
    config = entry.get("config", [])
    if not isinstance(config, list) or len(config) != CONFIG_LENGTHS[path] or not all(
            isinstance(v, (int, bool)) for v in config):
        raise ValueError(f"{where}: config of a {path} entry must be a list of "
                         f"{CONFIG_LENGTHS[path]} integers, got {config!r}")
    if entry["m"] < 1 or entry["n"] < 1 or entry["k"] < 1:
        raise ValueError(f"{where}: n, k and m must be positive")
    key = (entry["type"].upper(), entry["n"], entry["k"], bucket(entry["m"]))
    return key, Choice(path, tuple(config))


class TunedTable:
    """Tuned choices by ``(type, N, K, bucket)``."""

    def __init__(self, entries: dict[tuple[str, int, int, int], Choice] | None = None,
                 source: str = "") -> None:
        self.entries = dict(entries or {})
        self.source = source

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TunedTable":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"tuned table {path}: cannot read it as JSON ({exc})") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: Any, where: str = "tuned table") -> "TunedTable":
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise ValueError(f"{where}: expected an object with a list 'entries'")
        if data.get("format") != FORMAT:
            raise ValueError(f"{where}: format {data.get('format')!r}, this plugin reads "
                             f"format {FORMAT}")
        entries = {}
        for i, entry in enumerate(data["entries"]):
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: entries[{i}] must be an object")
            key, choice = validate_entry(entry, f"{where}: entries[{i}]")
            entries[key] = choice
        return cls(entries, where)

    def choose(self, qtype: str, n: int, k: int, m: int) -> Choice | None:
        return self.entries.get((qtype.upper(), n, k, bucket(m)))

    def shapes(self) -> Iterable[tuple[str, int, int]]:
        return sorted({key[:3] for key in self.entries})


def table_json(best: list[dict[str, Any]], device: str, **versions: str) -> dict[str, Any]:
    """A tuned table (the JSON the plugin reads) from the sweep's best choice per cell: dicts
    with ``type``, ``n``, ``k``, ``m``, ``path``, ``config`` and, for the record, ``us`` and
    ``bf16_us``. ``device`` is the GPU's name as torch reports it (the plugin uses a shipped
    table on GPUs of that name); ``versions`` are recorded (torch, triton...)."""
    entries = []
    for cell in best:
        entry = {key: cell[key] for key in ("type", "n", "k", "m", "path", "config", "us",
                                             "bf16_us") if key in cell}
        validate_entry(entry, f"cell {cell.get('type')} [{cell.get('n')}, {cell.get('k')}] "
                              f"m={cell.get('m')}")
        entries.append(entry)
    return {"format": FORMAT, "device": device, **versions, "entries": entries}


def device_table(device_name: str) -> TunedTable:
    """The shipped table measured on a GPU of this name (``tuned/*.json`` whose ``device``
    field equals it), or an empty table."""
    return _shipped().get(device_name, TunedTable())


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, TunedTable]:
    tables = {}
    for path in sorted(TUNED_DIR.glob("*.json")):
        table = TunedTable.load(path)
        device = json.loads(path.read_text()).get("device")
        if isinstance(device, str):
            tables[device] = table
    return tables


def choose(table: TunedTable, qtype: str, n: int, k: int, m: int, sm_count: int = 132,
           dequant_min_rows: int | None = None, matmul: str = "auto") -> Choice:
    """The path and configuration for ``M = m`` rows through a ``qtype`` weight ``[n, k]``:
    ``matmul`` (``auto``/``fused``/``dequant``) and ``dequant_min_rows`` (rows from which the
    workspace path runs, when set) override the table."""
    if matmul == "dequant":
        return Choice("dequant")
    if dequant_min_rows is not None and matmul == "auto":
        if m >= dequant_min_rows:
            return Choice("dequant")
    chosen = table.choose(qtype, n, k, m) or default_choice(qtype, n, k, m, sm_count)
    if chosen.path == "dequant" and (matmul == "fused" or (
            dequant_min_rows is not None and m < dequant_min_rows)):
        return default_choice(qtype, n, k, min(m, 512), sm_count)
    if chosen.path == "gemv" and m != 1:  # a one-row entry never serves more rows
        return default_choice(qtype, n, k, m, sm_count)
    return chosen


def candidates(qtype: str, n: int, k: int, m: int, sm_count: int = 132,
               corners: bool = False) -> list[Choice]:
    """The configurations the tuning sweep times for ``m`` rows through a ``qtype`` weight
    ``[n, k]``: the GEMV's row blocks, warps, K slices and prefetch for one row; the
    tensor-core kernel's tiles, stages, K slices and decodings for every ``m``; the
    workspace path from 64 rows. ``corners``: a handful of them, for tests."""
    from .qtypes import quant_type

    qt = quant_type(qtype)
    n_quads = k // 32 * (2 if qt.byte else 1)
    bits = qt.byte or (qt.nib and not (qt.pair or qt.bit or qt.lut) and qt.group == 32)
    decodings = (1, 2) if bits else (0,)
    out: list[Choice] = []
    if m == 1:
        for rows in (2, 4, 8):
            blocks = -(-n // rows)
            for warps in (1, 2, 4):
                for splits in (1, 2, 4, 8):
                    if splits > 1 and (blocks * splits > 16 * sm_count
                                       or n_quads < 32 * warps * splits):
                        continue
                    for prefetch in (True, False):
                        out.append(Choice("gemv", (rows, warps, splits, prefetch)))
    if m <= 16:
        tiles = [(16, 32, 8, 2), (16, 64, 8, 4), (16, 64, 4, 4), (16, 128, 4, 4),
                 (16, 128, 8, 8)]
        stages = (3,)
    elif m <= 64:
        tiles = [(32, 64, 8, 4), (64, 64, 8, 4), (64, 128, 4, 4), (64, 128, 4, 8)]
        stages = (3,)
    elif m <= 512:
        tiles = [(64, 128, 4, 8), (128, 128, 4, 8), (128, 128, 2, 4), (128, 256, 2, 8),
                 (64, 64, 8, 4)]
        stages = (3, 4)
    else:
        tiles = [(128, 128, 4, 8), (128, 256, 2, 8), (128, 128, 2, 4)]
        stages = (3, 4)
    for bm, bn, q, warps in tiles:
        q *= 2 if qt.byte else 1  # a quad of 8-bit codes is half a chunk: the same K step
        m_tiles = -(-m // bm)
        for stage in stages:
            for splits in (1, 2, 4, 8):
                if splits > 1 and (-(-n // bn) * m_tiles * splits > 4 * sm_count
                                   or n_quads < q * splits):
                    continue
                for decoding in decodings:
                    out.append(Choice("mma", (bm, bn, q, warps, stage, splits, decoding)))
    if m >= 64:
        out.append(Choice("dequant"))
    if corners:
        def first(test) -> list[Choice]:
            return [c for c in out if test(c)][:1]

        picked = (first(lambda c: c.path == "gemv")
                  + first(lambda c: c.path == "gemv" and c.config[2] > 1)
                  + first(lambda c: c.path == "mma" and c.config[6] == 1)
                  + first(lambda c: c.path == "mma" and c.config[6] != 1)
                  + first(lambda c: c.path == "mma" and c.config[5] > 1) + out[-1:])
        out = list(dict.fromkeys(picked))
    return out


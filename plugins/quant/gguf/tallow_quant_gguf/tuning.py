"""Which kernel, with which tiles, each quantized matmul runs on a GPU.

Three paths (:mod:`tallow_quant_gguf.ops`): ``gemv`` (one row, CUDA cores,
:mod:`~tallow_quant_gguf.kernels.gemv`), ``mma`` (tensor cores, any rows,
:mod:`~tallow_quant_gguf.kernels.matmul`) and ``dequant`` (the weight decoded into a workspace,
then cuBLAS). The choice depends on the weight's type and shape and on the number of rows ``M``,
bucketed (:data:`BUCKETS`: 1, 2-4, 5-16, 17-64, 65-256, 257-512, 513 and more).

A *tuned table* (JSON, written by ``bench/gpu/quant_micro.py --sweep``) records the fastest
path and configuration the sweep timed for each ``(type, N, K, bucket)``, measured at the
bucket's largest M; tables shipped in ``tallow_quant_gguf/tuned/`` are used on the GPU they were
measured on (matched by device name), and the setting ``tuned_table`` names another file.
Shapes and types the table lacks take :func:`default_choice`. An M between two measured rows
whose paths differ (the tensor-core kernel below, the workspace above) takes the path
estimated faster at M from the two measurements (:meth:`TunedTable.choose`).

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
#: the fewest rows for which the sweep times the workspace path (every bucket above the
#: one-row to 16-row decode buckets, where a GEMV or the tensor-core kernel reads the weight
#: once and the workspace would write it 3.5 times over)
DEQUANT_MIN_ROWS = 17


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
        return Choice("mma", (64, 64, 8, 4, 3, _mma_splits(n, 64, -(-m // 64), k, sm_count), 1))
    if m <= 512:
        return Choice("mma", (128, 128, 4, 8, 3, _mma_splits(n, 128, -(-m // 128), k, sm_count), 2))
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
            raise ValueError(
                f"{where}: field {field!r} must be a {kind.__name__}, got {entry.get(field)!r}"
            )
    path = entry["path"]
    if path not in PATHS:
        raise ValueError(f"{where}: path must be one of {', '.join(PATHS)}, got {path!r}")
    config = entry.get("config", [])
    if (
        not isinstance(config, list)
        or len(config) != CONFIG_LENGTHS[path]
        or not all(isinstance(v, (int, bool)) for v in config)
    ):
        raise ValueError(
            f"{where}: config of a {path} entry must be a list of "
            f"{CONFIG_LENGTHS[path]} integers, got {config!r}"
        )
    if entry["m"] < 1 or entry["n"] < 1 or entry["k"] < 1:
        raise ValueError(f"{where}: n, k and m must be positive")
    key = (entry["type"].upper(), entry["n"], entry["k"], bucket(entry["m"]))
    return key, Choice(path, tuple(config))


class TunedTable:
    """Tuned choices by ``(type, N, K, bucket)``, with the times the sweep measured for them
    (``times``: microseconds of the choice and of bf16 on the same shape), where recorded."""

    def __init__(
        self,
        entries: dict[tuple[str, int, int, int], Choice] | None = None,
        source: str = "",
        times: dict[tuple[str, int, int, int], tuple[float, float]] | None = None,
    ) -> None:
        self.entries = dict(entries or {})
        self.source = source
        self.times = dict(times or {})

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
            raise ValueError(
                f"{where}: format {data.get('format')!r}, this plugin reads format {FORMAT}"
            )
        entries, times = {}, {}
        for i, entry in enumerate(data["entries"]):
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: entries[{i}] must be an object")
            key, choice = validate_entry(entry, f"{where}: entries[{i}]")
            entries[key] = choice
            us, bf16_us = entry.get("us"), entry.get("bf16_us")
            if all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                for v in (us, bf16_us)
            ):
                times[key] = (float(us), float(bf16_us))
        return cls(entries, where, times)

    def choose(self, qtype: str, n: int, k: int, m: int) -> Choice | None:
        """The entry of ``m``'s bucket; for an ``m`` below the bucket's top whose entry takes
        another path than the measured row below (say the tensor-core kernel at 64 rows and
        the workspace at 256), the one of the two estimated faster at ``m``
        (:func:`estimate_us`)."""
        top = bucket(m)
        key = (qtype.upper(), n, k, top)
        chosen = self.entries.get(key)
        below = [b for b in BUCKETS if 1 < b < m]  # the one-row GEMV serves one row only
        if chosen is None or m >= top or not below:
            return chosen
        low_key = (qtype.upper(), n, k, below[-1])
        low = self.entries.get(low_key)
        if (
            low is None
            or low.path == chosen.path
            or not (key in self.times and low_key in self.times)
        ):
            return chosen
        rows = (below[-1], top)
        bf16_at_m = _between(m, rows, (self.times[low_key][1], self.times[key][1]))
        low_us = estimate_us(low, below[-1], *self.times[low_key], m, bf16_at_m)
        top_us = estimate_us(chosen, top, *self.times[key], m, bf16_at_m)
        return low if low_us < top_us else chosen

    def shapes(self) -> Iterable[tuple[str, int, int]]:
        return sorted({key[:3] for key in self.entries})


def _between(m: int, rows: tuple[int, int], values: tuple[float, float]) -> float:
    """``values`` at ``rows``, linearly interpolated at ``m``."""
    (a, b), (va, vb) = rows, values
    return va + (vb - va) * (m - a) / (b - a)


def estimate_us(
    choice: Choice, rows: int, us: float, bf16_us: float, m: int, bf16_at_m: float
) -> float:
    """A choice measured at ``rows`` (``us``, and ``bf16_us`` for bf16 there) estimated at
    ``m`` rows: the workspace path costs its decoding (the same at any M) plus the bf16
    product at ``m``; a fused kernel grows with the rows it multiplies."""
    if choice.path == "dequant":
        return us - bf16_us + bf16_at_m
    return us * m / rows


def table_json(best: list[dict[str, Any]], device: str, **versions: str) -> dict[str, Any]:
    """A tuned table (the JSON the plugin reads) from the sweep's best choice per cell: dicts
    with ``type``, ``n``, ``k``, ``m``, ``path``, ``config`` and, for the record, ``us`` and
    ``bf16_us``. ``device`` is the GPU's name as torch reports it (the plugin uses a shipped
    table on GPUs of that name); ``versions`` are recorded (torch, triton...)."""
    entries = []
    for cell in best:
        entry = {
            key: cell[key]
            for key in ("type", "n", "k", "m", "path", "config", "us", "bf16_us")
            if key in cell
        }
        validate_entry(
            entry, f"cell {cell.get('type')} [{cell.get('n')}, {cell.get('k')}] m={cell.get('m')}"
        )
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


def choose(
    table: TunedTable,
    qtype: str,
    n: int,
    k: int,
    m: int,
    sm_count: int = 132,
    dequant_min_rows: int | None = None,
    matmul: str = "auto",
) -> Choice:
    """The path and configuration for ``M = m`` rows through a ``qtype`` weight ``[n, k]``:
    ``matmul`` (``auto``/``fused``/``dequant``) and ``dequant_min_rows`` (rows from which the
    workspace path runs, when set) override the table."""
    if matmul == "dequant":
        return Choice("dequant")
    if dequant_min_rows is not None and matmul == "auto":
        if m >= dequant_min_rows:
            return Choice("dequant")
    chosen = table.choose(qtype, n, k, m) or default_choice(qtype, n, k, m, sm_count)
    if chosen.path == "dequant" and (
        matmul == "fused" or (dequant_min_rows is not None and m < dequant_min_rows)
    ):
        return default_choice(qtype, n, k, min(m, 512), sm_count)
    if chosen.path == "gemv" and m != 1:  # a one-row entry never serves more rows
        return default_choice(qtype, n, k, m, sm_count)
    return chosen


def candidates(
    qtype: str, n: int, k: int, m: int, sm_count: int = 132, corners: bool = False
) -> list[Choice]:
    """The configurations the tuning sweep times for ``m`` rows through a ``qtype`` weight
    ``[n, k]``: the GEMV's row blocks, warps, K slices and prefetch for one row; the
    tensor-core kernel's tiles, stages, K slices and decodings for every ``m``; the
    workspace path from :data:`DEQUANT_MIN_ROWS` rows. ``corners``: a handful of them, for
    tests."""
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
                    if splits > 1 and (
                        blocks * splits > 16 * sm_count or n_quads < 32 * warps * splits
                    ):
                        continue
                    for prefetch in (True, False):
                        out.append(Choice("gemv", (rows, warps, splits, prefetch)))
    if m <= 16:
        tiles = [(16, 32, 8, 2), (16, 64, 8, 4), (16, 64, 4, 4), (16, 128, 4, 4), (16, 128, 8, 8)]
        stages = (3,)
    elif m <= 64:
        tiles = [(32, 64, 8, 4), (64, 64, 8, 4), (64, 128, 4, 4), (64, 128, 4, 8)]
        stages = (3,)
    elif m <= 512:
        tiles = [
            (64, 128, 4, 8),
            (128, 128, 4, 8),
            (128, 128, 2, 4),
            (128, 256, 2, 8),
            (64, 64, 8, 4),
        ]
        stages = (3, 4)
    else:
        tiles = [(128, 128, 4, 8), (128, 256, 2, 8), (128, 128, 2, 4)]
        stages = (3, 4)
    for bm, bn, q, warps in tiles:
        q *= 2 if qt.byte else 1  # a quad of 8-bit codes is half a chunk: the same K step
        m_tiles = -(-m // bm)
        for stage in stages:
            for splits in (1, 2, 4, 8):
                if splits > 1 and (
                    -(-n // bn) * m_tiles * splits > 4 * sm_count or n_quads < q * splits
                ):
                    continue
                for decoding in decodings:
                    out.append(Choice("mma", (bm, bn, q, warps, stage, splits, decoding)))
    if m >= DEQUANT_MIN_ROWS:
        out.append(Choice("dequant"))
    if corners:

        def first(test) -> list[Choice]:
            return [c for c in out if test(c)][:1]

        picked = (
            first(lambda c: c.path == "gemv")
            + first(lambda c: c.path == "gemv" and c.config[2] > 1)
            + first(lambda c: c.path == "mma" and c.config[6] == 1)
            + first(lambda c: c.path == "mma" and c.config[6] != 1)
            + first(lambda c: c.path == "mma" and c.config[5] > 1)
            + out[-1:]
        )
        out = list(dict.fromkeys(picked))
    return out

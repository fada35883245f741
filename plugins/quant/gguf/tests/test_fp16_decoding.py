"""The inline-PTX fp16 decodings of the tensor-core kernel (``kernels/matmul.py``), checked on a
CPU: Triton's interpreter cannot run PTX, so this test executes the kernels' PTX text with a
small evaluator of the few instructions it uses (``mov``, ``prmt``, ``lop3``, ``add``/``mul``/
``fma.rn.f16x2``, each modelled after the PTX ISA: ``prmt`` picks bytes of ``{b, a}``,
``lop3`` looks each bit up in its truth table, the f16x2 operations round the exact result to
nearest even once) and compares every output with the value it must decode to. The GPU tests
(``kernel_cases.py``) then check the same decodings end to end against the torch reference."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tallow_quant_gguf.kernels.matmul import (
    _BYTE_CONSTRAINTS,
    _BYTE_FP16,
    _NIB_CONSTRAINTS,
    _NIB_FP16,
)


def _halves(word: int) -> tuple[np.float64, np.float64]:
    lo, hi = np.array([word & 0xFFFF, word >> 16], dtype=np.uint16).view(np.float16)
    return np.float64(lo), np.float64(hi)


def _pack(lo: float, hi: float) -> int:
    bits = np.array([lo, hi], dtype=np.float64).astype(np.float16).view(np.uint16)
    return int(bits[0]) | (int(bits[1]) << 16)


def _prmt(a: int, b: int, sel: int) -> int:
    pool = (a | (b << 32)).to_bytes(8, "little")
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 15
        byte = pool[nib & 7]
        if nib & 8:  # sign replicate
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for i in range(32):
        index = (((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1)
        out |= ((lut >> index) & 1) << i
    return out


def run_ptx(asm: str, constraints: str, inputs: list[int]) -> list[int]:
    """Execute ``asm`` (as Triton passes it to ``inline_asm_elementwise``) with the 32-bit
    ``inputs``; the output registers' values."""
    n_out = constraints.split(",").count("=r")
    regs: dict[str, int] = {f"${n_out + i}": v for i, v in enumerate(inputs)}

    def value(tok: str) -> int:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok):
            return int(tok, 0) & 0xFFFFFFFF
        raise AssertionError(f"unknown operand {tok!r} (read before written?)")

    for line in asm.replace("{", "").replace("}", "").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        ops = [a.strip() for a in args.split(",")]
        dst, src = ops[0], [value(a) for a in ops[1:]]
        if op == "mov.b32":
            result = src[0]
        elif op == "prmt.b32":
            result = _prmt(*src)
        elif op == "lop3.b32":
            result = _lop3(*src)
        elif op in ("add.rn.f16x2", "mul.rn.f16x2", "fma.rn.f16x2"):
            lanes = list(zip(*(_halves(v) for v in src)))
            if op == "add.rn.f16x2":
                exact = [a + b for a, b in lanes]
            elif op == "mul.rn.f16x2":
                exact = [a * b for a, b in lanes]
            else:  # float64 holds the exact product of two fp16 values plus an fp16 value
                exact = [a * b + c for a, b, c in lanes]
            result = _pack(*exact)
        else:
            raise AssertionError(f"the evaluator does not know {op}")
        regs[dst] = result
    return [regs[f"${i}"] for i in range(n_out)]


def _f16(x: float) -> float:
    return float(np.float16(x))


@pytest.mark.parametrize("seed", range(4))
def test_4_bit_codes_decode_to_d_times_a_q_plus_c(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        words = [int(w) for w in rng.integers(0, 2**32, 2, dtype=np.uint64)]
        a = [float(rng.integers(0, 64)) for _ in range(2)]  # sub-scales: 6-bit integers
        d = [_f16(rng.uniform(-0.05, 0.05)) for _ in range(2)]
        c = [_f16(rng.uniform(-0.5, 0.5)) for _ in range(2)]
        out = run_ptx(
            _NIB_FP16.value, _NIB_CONSTRAINTS.value, words + [_pack(*a), _pack(*d), _pack(*c)]
        )
        for slot in range(8):
            got = _halves(out[slot])
            for lane in range(2):
                q = (words[lane] >> (4 * slot)) & 15
                expected = np.float16(d[lane] * (a[lane] * q) + c[lane])  # one rounding
                assert np.float16(got[lane]) == expected, (slot, lane, q, a, d, c)


@pytest.mark.parametrize("seed", range(4))
def test_8_bit_codes_decode_to_d_times_signed_q(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        words = [int(w) for w in rng.integers(0, 2**32, 2, dtype=np.uint64)]
        d = [_f16(rng.uniform(-0.05, 0.05)) for _ in range(2)]
        out = run_ptx(_BYTE_FP16.value, _BYTE_CONSTRAINTS.value, words + [_pack(*d)])
        for slot in range(4):
            got = _halves(out[slot])
            for lane in range(2):
                stored = (words[lane] >> (8 * slot)) & 0xFF  # q + 128
                expected = np.float16((stored - 128) * d[lane])
                assert np.float16(got[lane]) == expected, (slot, lane, stored, d)


def test_the_evaluator_knows_its_instructions():
    assert _prmt(0x33221100, 0x77665544, 0x6622) == 0x66662222
    assert _lop3(0xF0F0, 0x00FF, 0x1234, 0xEA) == (0xF0F0 & 0x00FF) | 0x1234
    assert _halves(_pack(1.5, -2.0)) == (1.5, -2.0)
    (one,) = run_ptx(
        "{ .reg .b32 k; mov.b32 k, 0x3C003C00; fma.rn.f16x2 $0, $1, k, $1; }",
        "=r,r",
        [_pack(2.0, 3.0)],
    )
    assert _halves(one) == (4.0, 6.0)

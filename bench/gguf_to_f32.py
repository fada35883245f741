"""Write a GGUF file with every tensor dequantized to float32 (metadata copied): the float
source that load-time quantization (``--isq``) of a model shipped only quantized starts from.

    python bench/gguf_to_f32.py SRC.gguf OUT.gguf

It runs tallow-quant-gguf's GGUF writer with every tensor's target type set to f32.
"""

from __future__ import annotations

import sys

from tallow_gguf.format import GGUFFormat
from tallow_quant_gguf import quantize_file


class _AllF32:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, name: str, shape: tuple[int, ...]) -> str:
        return "f32"


def main(src: str, out: str) -> None:
    quantize_file.TensorTypes = _AllF32
    summary = quantize_file.quantize_checkpoint(GGUFFormat().load(src), out, "q8_0",
                                                progress=False)
    print(summary)


if __name__ == "__main__":
    main(*sys.argv[1:3])

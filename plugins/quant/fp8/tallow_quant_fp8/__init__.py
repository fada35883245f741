"""FP8 weights: the tallow quant scheme ``fp8``.

float8 e4m3 weights with float32 scales (per tensor, per output row, or per 128 x 128 block)
from HF / vLLM ``fp8`` and compressed-tensors checkpoints, or quantized at load
(``model.isq: fp8``); weight-only GEMVs for decode batches and W8A8 float8 tensor-core matmuls
for larger ones (:mod:`tallow_quant_fp8.ops`).
"""

"""GGUF block-quantized weights kept quantized on the device: the tallow quant scheme ``gguf``.

Weights stay in GGML's block types (repacked once at load into planes the kernels read fast,
:mod:`tallow_quant_gguf.packing`); matmuls decode them on the fly (:mod:`tallow_quant_gguf.ops`).
"""

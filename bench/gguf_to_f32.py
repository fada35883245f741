"""Write a GGUF file with every tensor dequantized to float32: the float source that load-time
quantization (``--isq``) needs when the only copy of a model is block-quantized.

  python bench/gguf_to_f32.py SRC.gguf OUT.gguf      # SRC: default: tallow's default model

Metadata (vocabulary, chat template, hyper-parameters) is copied as ``tallow quantize`` copies
it; each tensor is tallow's GGUF dequantization of it (what tallow computes with when it loads
SRC without the gguf quant scheme), so OUT and SRC are the same model in float32.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="a GGUF file (default: the default model)")
    parser.add_argument("out")
    args = parser.parse_args()
    from gguf import GGUFWriter, LlamaFileType

    from tallow.default_model import default_model_path
    from tallow.layers import QuantizedWeight
    from tallow_format_gguf.format import GGUFFormat
    from tallow_quant_gguf.quantize_file import _copy_gguf_metadata

    source = args.source or str(default_model_path())
    if os.path.exists(args.out):
        sys.exit(f"{args.out} exists")
    checkpoint = GGUFFormat().load(source)
    writer = GGUFWriter(args.out, checkpoint.architecture.split(":", 1)[-1], use_temp_file=True)
    _copy_gguf_metadata(writer, checkpoint.extra["gguf_files"][0])
    writer.add_file_type(LlamaFileType.ALL_F32)
    count = 0
    for name, tensor in checkpoint.tensors():
        if isinstance(tensor, QuantizedWeight):
            tensor = tensor.dequantize()
        writer.add_tensor(name, tensor.float().contiguous().numpy())
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out}: {count} float32 tensors, {os.path.getsize(args.out) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()

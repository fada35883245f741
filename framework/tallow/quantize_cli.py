"""`tallow quantize SRC OUT --type TYPE`: write a quantized model file.

The core reads the source through the weight formats (a GGUF file, a safetensors directory,
anything a format plugin claims) and hands the checkpoint to the first quant scheme, by
priority, whose ``file_types`` include TYPE (:meth:`tallow.plugin.QuantScheme.quantize_file`).
The core knows no file format or quantization type itself: installing a scheme plugin
(``tallow-quant-gguf`` writes GGUF files) is what makes a type available.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tallow.plugin import Entry, QuantScheme, Registries


class QuantizeError(RuntimeError):
    """The command cannot run as asked (no scheme for the type, output exists...)."""


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "quantize",
        help="write a quantized model file (e.g. a Q4_K_M GGUF) from a model",
        description="Quantize a model (a GGUF file or a safetensors directory) into a model "
        "file of TYPE, through an installed quant scheme plugin.",
    )
    p.add_argument(
        "source",
        metavar="SRC",
        help="the model: a .gguf file or a directory with "
        "config.json, tokenizer.json and *.safetensors",
    )
    p.add_argument("output", metavar="OUT", help="the file to write (e.g. model-q4_k_m.gguf)")
    p.add_argument(
        "--type",
        dest="file_type",
        required=True,
        metavar="TYPE",
        help="the file type, e.g. q4_0, q8_0, q4_k_m, q5_k_s, q6_k (tallow-quant-gguf "
        "writes llama.cpp's file types with llama-quantize's per-tensor types); "
        "the installed schemes list theirs in the error for an unknown one",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="where to quantize: cpu, cuda, cuda:N (default: a GPU when there is one)",
    )
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--config", help="a tallow YAML file (its plugins section is used)")
    p.set_defaults(func=run)
    return p


def find_file_quantizer(registries: Registries, file_type: str) -> tuple[Entry, type[QuantScheme]]:
    """``(entry, scheme class)`` of the first quant scheme by priority that writes
    ``file_type``; :class:`QuantizeError` listing what the installed schemes offer otherwise."""
    offered: dict[str, list[str]] = {}
    failures: list[str] = []
    for entry in registries.quant_schemes.by_priority():
        try:
            cls = entry.load()
        except Exception as exc:  # a broken scheme must not hide the others
            failures.append(f"{entry.name} ({entry.distribution}): cannot import: {exc}")
            continue
        types = tuple(getattr(cls, "file_types", ()) or ())
        if file_type in types:
            return entry, cls
        if types:
            offered[f"{entry.name} ({entry.distribution})"] = list(types)
    if offered:
        detail = "; ".join(f"{name}: {', '.join(types)}" for name, types in offered.items())
        message = f"no installed quant scheme writes --type {file_type!r} (offered: {detail})"
    else:
        message = (
            f"no installed quant scheme writes model files, so --type {file_type!r} is "
            "not available (install tallow-quant-gguf for GGUF types such as q4_k_m)"
        )
    if failures:
        message += "; schemes that failed to load: " + "; ".join(failures)
    raise QuantizeError(message)


def quantize_model(
    registries: Registries,
    source: str,
    output: str,
    file_type: str,
    *,
    device: str = "auto",
    force: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Read ``source`` with the weight format that claims it and write ``output`` through the
    scheme that offers ``file_type``; returns the scheme's summary with ``scheme`` and
    ``source`` added."""
    from tallow.engine.loader import choose_weight_format, resolve_device

    file_type = file_type.lower()
    entry, scheme = find_file_quantizer(registries, file_type)
    if os.path.exists(output) and not force:
        raise QuantizeError(f"{output} exists; pass --force to overwrite it")
    if os.path.abspath(output) == os.path.abspath(source):
        raise QuantizeError("OUT must differ from SRC: the source is read while OUT is written")
    target = resolve_device(device)
    checkpoint = choose_weight_format(registries, source, None).load()().load(source)
    summary = scheme.quantize_file(
        checkpoint, output, file_type, device=str(target), progress=progress
    )
    return {
        "source": source,
        "output": output,
        "scheme": f"{entry.name} ({entry.distribution})",
        "device": str(target),
        **summary,
    }


def run(args: argparse.Namespace) -> int:
    import sys

    from tallow.config import load_config
    from tallow.plugin import SelectionError
    from tallow.plugin.manager import load_plugins

    config = load_config(path=args.config)
    pm = load_plugins(config.plugins)
    try:
        summary = quantize_model(
            pm.registries,
            args.source,
            args.output,
            args.file_type,
            device=args.device,
            force=args.force,
        )
    except (QuantizeError, SelectionError, ValueError, FileNotFoundError) as exc:
        print(f"tallow quantize: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        for key, value in summary.items():
            print(f"{key:<12} {value}")
    return 0

"""From a model source to a model with weights: choose the weight format, read the checkpoint,
resolve the architecture, build the module and fill its parameters."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from tallow.layers import ArchConfig, BuildContext
from tallow.plugin import Checkpoint, Entry, ModelFileError, Registries, SelectionError

from .checkpoint_check import check_config_against_tensors

log = logging.getLogger("tallow.engine")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
           "half": torch.float16, "float": torch.float32}


def resolve_device(name: str | None) -> torch.device:
    if not name or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device is {name!r} but no CUDA device is available")
    return device


def resolve_dtype(name: str | torch.dtype | None, device: torch.device,
                  checkpoint_dtype: str | None = None) -> torch.dtype:
    """``auto``: float32 on CPU (fast and exact there), the checkpoint's half type on a GPU
    (bfloat16 unless it asks for float16)."""
    if isinstance(name, torch.dtype):
        return name
    if name and name != "auto":
        try:
            return _DTYPES[name]
        except KeyError:
            raise ValueError(f"model.dtype must be one of auto, {', '.join(sorted(_DTYPES))}; "
                             f"got {name!r}") from None
    if device.type == "cpu":
        return torch.float32
    return torch.float16 if checkpoint_dtype in ("float16", "half") else torch.bfloat16


def choose_weight_format(registries: Registries, source: str, name: str | None) -> Entry:
    """The named format if it claims ``source``; else the first format by priority that does."""
    formats = registries.weight_formats
    if name and name != "auto":
        entry = formats.entry(name)
        if not entry.load().claims(source):
            raise SelectionError(f"weight format {name!r} (from {entry.distribution}) does not "
                                 f"recognise the model source {source!r}")
        return entry
    for entry in formats.by_priority():
        try:
            if entry.load().claims(source):
                log.info("weight format: %s (from %s) for %s", entry.name, entry.distribution,
                         source)
                return entry
        except Exception as exc:  # a broken format must not hide the others
            log.warning("weight format %s failed to inspect %s: %s", entry.name, source, exc)
    known = ", ".join(formats.names()) or "none installed"
    raise SelectionError(f"no weight format recognises the model source {source!r} "
                         f"(formats: {known}); expected a .gguf file, a directory with "
                         "config.json and *.safetensors, or a Hugging Face id 'org/name'")


def resolve_architecture(registries: Registries, checkpoint: Checkpoint) -> tuple[Entry, dict]:
    """The architecture entry and the (possibly refined) HF-style config."""
    config = dict(checkpoint.config)
    arch = checkpoint.architecture
    if arch.startswith("gguf:"):
        entry = registries.architectures.for_gguf(arch[len("gguf:"):])
        cls = entry.load()
        metadata = checkpoint.extra.get("gguf_metadata", {})
        refine = getattr(cls, "config_from_gguf", None)
        if refine is not None:
            try:
                config = refine(metadata, config)
            except ModelFileError:
                raise
            except ValueError as exc:  # the model class names the key, not the file
                raise ModelFileError(checkpoint.config_path or checkpoint.source, None,
                                     str(exc)) from None
        config.setdefault("architectures", [entry.name])
        return entry, config
    if arch not in registries.architectures:
        known = ", ".join(sorted(registries.architectures.names())) or "none installed"
        raise SelectionError(f"no model plugin implements architecture {arch!r} "
                             f"(installed: {known})")
    return registries.architectures.entry(arch), config


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: ArchConfig
    checkpoint: Checkpoint
    architecture: Entry
    dtype: torch.dtype
    device: torch.device


def load_model(registries: Registries, source: str, *, device: torch.device,
               dtype: str | torch.dtype | None = "auto", weight_format: str | None = None,
               revision: str | None = None, quant: Any = None) -> LoadedModel:
    fmt = choose_weight_format(registries, source, weight_format).load()()
    checkpoint = fmt.load(source, revision=revision)
    entry, config = resolve_architecture(registries, checkpoint)
    # before anything is allocated from the config
    check_config_against_tensors(config, checkpoint)
    arch_cfg = ArchConfig(config)
    torch_dtype = resolve_dtype(dtype, device, str(config.get("torch_dtype") or ""))
    cls = entry.load()
    started = time.perf_counter()
    with torch.device(device):
        model = cls(arch_cfg, BuildContext(dtype=torch_dtype, device=device, quant=quant))
    if checkpoint.naming == "random":
        from .random_model import initialize_random

        initialize_random(model)
    else:
        model.load_weights(checkpoint.tensors(), naming=checkpoint.naming)
    model.eval()
    log.info("loaded %s (%s, %s) in %.1fs", source, entry.name, torch_dtype,
             time.perf_counter() - started)
    return LoadedModel(model, arch_cfg, checkpoint, entry, torch_dtype, device)

"""From a model source to a model with weights: choose the weight format, read the checkpoint,
resolve the architecture, build the module and fill its parameters."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from tallow.layers import ArchConfig, BuildContext
from tallow.plugin import (
    Checkpoint, ComponentLoadError, Entry, ModelFileError, Registries, SelectionError,
)

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
    known = ", ".join(formats.names()) or "none loaded"
    raise SelectionError(f"no weight format recognises the model source {source!r} "
                         f"(formats: {known}); expected a .gguf file, a directory with "
                         "config.json and *.safetensors, or a Hugging Face id 'org/name'"
                         + formats.missing_hint())


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
        known = ", ".join(sorted(registries.architectures.names())) or "none"
        raise SelectionError(f"no model plugin implements architecture {arch!r} "
                             f"(loaded: {known})" + registries.architectures.missing_hint(arch))
    return registries.architectures.entry(arch), config


def _scheme_refusals(cls: Any, config: Any, device: torch.device) -> list[str]:
    reasons = list(cls.validate(config) or []) if config is not None else []
    need = int(getattr(cls, "min_capability", 0) or 0)
    if need and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major * 10 + minor < need:
            reasons.append(f"needs CUDA compute capability {need // 10}.{need % 10}, "
                           f"{device} has {major}.{minor}")
    return reasons


def _scheme_for_checkpoint(schemes: Any, checkpoint: Checkpoint, needed: str,
                          device: torch.device, config: Any) -> Any:
    """The first scheme that serves a checkpoint quantized with ``needed`` (its
    ``quant_method``): the scheme of that name, or one listing it in its ``quant_methods``
    whose ``detect`` recognises the checkpoint's config (``compressed-tensors`` holds fp8, int4
    or fp4 weights, each another scheme's). None, with one log line saying why, when none can:
    the tensors are then dequantized at load."""
    entries = schemes.for_quant_method(needed)
    if not entries:
        log.info("%s: its weights are %s-quantized, but no quant scheme %r is installed and "
                 "enabled: dequantizing them at load%s", checkpoint.source, needed, needed,
                 schemes.missing_hint(needed))
        return None
    refusals = []
    for entry in entries:
        try:
            cls = entry.load()
            if entry.name != needed and not cls.detect(dict(checkpoint.config)):
                refusals.append(f"quant scheme {entry.name!r} (from {entry.distribution}) does "
                                f"not hold this kind of {needed} checkpoint")
                continue
            reasons = _scheme_refusals(cls, config, device)
        except ComponentLoadError as exc:  # an unusable scheme must not stop a model that
            reasons = [str(exc)]  # can load
        except Exception as exc:
            reasons = [f"{type(exc).__name__}: {exc}"]
        if reasons:
            refusals.append(f"quant scheme {entry.name!r} (from {entry.distribution}) cannot "
                            f"serve ({'; '.join(reasons)})")
            continue
        log.info("quant scheme: %s (from %s) keeps the %s-quantized weights", entry.name,
                 entry.distribution, needed)
        scheme = cls(config, isq=None)
        try:
            scheme.use_checkpoint_config(dict(checkpoint.config))
        except ValueError as exc:
            raise ModelFileError(checkpoint.config_path or checkpoint.source, None,
                                 f"quant scheme {entry.name!r} (from {entry.distribution}) "
                                 f"cannot serve its weights: {exc}") from exc
        return scheme
    log.info("%s: its weights are %s-quantized, but %s: dequantizing them at load",
             checkpoint.source, needed, "; ".join(refusals))
    return None


def choose_quant_scheme(registries: Registries, checkpoint: Checkpoint, *, device: torch.device,
                        config: Any = None, isq: str | None = None) -> Any:
    """The quant scheme instance that holds the model's weights, or None for dense weights.

    A checkpoint whose ``quantization`` names a scheme gets that scheme when it is installed and
    can serve; otherwise one log line says why and its tensors are dequantized at load. ``isq``
    (``model.isq``) asks the highest-priority scheme that lists it in ``isq_types`` to quantize
    a float checkpoint while it loads.
    """
    schemes = registries.quant_schemes
    needed = checkpoint.quantization
    if needed and isq:
        raise SelectionError(f"model.isq {isq!r}: the checkpoint {checkpoint.source} is already "
                             f"quantized ({needed}); load-time quantization applies to float "
                             "checkpoints")
    if needed:
        return _scheme_for_checkpoint(schemes, checkpoint, needed, device, config)
    if not isq:
        return None
    offered = []
    for entry in schemes.by_priority():
        cls = entry.load()
        if isq not in getattr(cls, "isq_types", ()):
            continue
        offered.append(entry.name)
        reasons = _scheme_refusals(cls, config, device)
        if not reasons:
            log.info("quant scheme: %s (from %s) quantizes the weights to %s while loading",
                     entry.name, entry.distribution, isq)
            return cls(config, isq=isq)
        log.info("quant scheme %s cannot quantize to %s: %s", entry.name, isq, "; ".join(reasons))
    known = ", ".join(schemes.names()) or "none loaded"
    why = "those that offer it refused" if offered else f"quant schemes: {known}"
    raise SelectionError(f"model.isq {isq!r}: no installed quant scheme can quantize to it "
                         f"({why}; tallow-quant-gguf provides the GGML types, tallow-quant-int4 "
                         "int4, tallow-quant-fp4 mxfp4)"
                         + schemes.missing_hint())


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of device memory the model's parameters and buffers take (shared ones once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key in seen or t.numel() == 0:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: ArchConfig
    checkpoint: Checkpoint
    architecture: Entry
    dtype: torch.dtype
    device: torch.device
    #: the quant scheme instance holding the weights (None: dense weights)
    quant: Any = None
    #: device memory of the model's parameters and buffers
    weight_bytes: int = 0


def load_model(registries: Registries, source: str, *, device: torch.device,
               dtype: str | torch.dtype | None = "auto", weight_format: str | None = None,
               revision: str | None = None, quant: Any = None, config: Any = None,
               isq: str | None = None) -> LoadedModel:
    """Read ``source`` and build its model on ``device``. ``quant`` forces a scheme instance;
    without it the scheme follows the checkpoint and ``isq`` (:func:`choose_quant_scheme`,
    ``config`` being what schemes validate and read their settings from)."""
    fmt = choose_weight_format(registries, source, weight_format).load()()
    checkpoint = fmt.load(source, revision=revision)
    entry, config_dict = resolve_architecture(registries, checkpoint)
    # before anything is allocated from the config
    check_config_against_tensors(config_dict, checkpoint)
    arch_cfg = ArchConfig(config_dict)
    torch_dtype = resolve_dtype(dtype, device, str(config_dict.get("torch_dtype") or ""))
    if quant is None:
        quant = choose_quant_scheme(registries, checkpoint, device=device, config=config,
                                    isq=isq)
    cls = entry.load()
    started = time.perf_counter()
    with torch.device(device):
        model = cls(arch_cfg, BuildContext(dtype=torch_dtype, device=device, quant=quant))
    quantizing = getattr(quant, "isq", None)
    if checkpoint.naming == "random":
        from .random_model import initialize_random

        initialize_random(model, progress=f"Quantizing to {quantizing}" if quantizing else None)
        finish = getattr(model, "process_weights_after_loading", None)
        if finish is not None:
            finish()
    else:
        tensors = checkpoint.tensors()
        if quantizing:
            from tqdm.auto import tqdm

            tensors = tqdm(tensors, desc=f"Quantizing to {quantizing}", unit="tensor",
                           disable=None, leave=False)
        model.load_weights(tensors, naming=checkpoint.naming)
    model.eval()
    nbytes = weight_bytes(model)
    log.info("loaded %s (%s, %s) in %.1fs", source, entry.name, torch_dtype,
             time.perf_counter() - started)
    summary = getattr(quant, "summary", None)
    log.info("weights: %.2f GiB on %s%s", nbytes / 2**30, device,
             f" ({summary()})" if summary is not None else "")
    return LoadedModel(model, arch_cfg, checkpoint, entry, torch_dtype, device, quant, nbytes)

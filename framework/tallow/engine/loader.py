"""From a model source to a model with weights: choose the weight format, read the checkpoint,
resolve the architecture, build the module and fill its parameters."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from tallow.config import TallowConfig
from tallow.distributed.state import tp_rank, tp_size
from tallow.layers import ArchConfig, BuildContext, CausalLM, WeightLoadError
from tallow.plugin import (
    Checkpoint,
    Entry,
    ModelFileError,
    QuantScheme,
    Registries,
    SelectionError,
    select,
)
from tallow.plugin.first_party import install_hint
from tallow.plugin.registry import WeightFormatRegistry

from .calibration import calibrate
from .checkpoint_check import check_config_against_tensors
from .quant_choice import choose_quant_scheme, isq_offers
from .random_model import initialize_random

log = logging.getLogger("tallow.engine")

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "half": torch.float16,
    "float": torch.float32,
}


def resolve_device(name: str | None) -> torch.device:
    if not name or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device is {name!r} but no CUDA device is available")
    return device


def resolve_dtype(
    name: str | torch.dtype | None, device: torch.device, checkpoint_dtype: str | None = None
) -> torch.dtype:
    """``auto``: float32 on CPU (fast and exact there), the checkpoint's half type on a GPU
    (bfloat16 unless it asks for float16)."""
    if isinstance(name, torch.dtype):
        return name
    if name and name != "auto":
        try:
            return _DTYPES[name]
        except KeyError:
            raise ValueError(
                f"model.dtype must be one of auto, {', '.join(sorted(_DTYPES))}; got {name!r}"
            ) from None
    if device.type == "cpu":
        return torch.float32
    return torch.float16 if checkpoint_dtype in ("float16", "half") else torch.bfloat16


def choose_weight_format(registries: Registries, source: str, name: str | None) -> Entry:
    """The format that reads ``source``: :func:`tallow.plugin.select` with ``claims(source)``
    as its check, so a named format must claim it and otherwise the first by priority that
    does is taken. An unknown name is a :class:`~tallow.plugin.registry.RegistryError` listing the registered ones."""
    formats = registries.weight_formats
    if name and name != "auto":
        formats.entry(name)

    def claims(entry: Entry) -> list[str]:
        try:
            if entry.load().claims(source):
                return []
        except Exception as exc:  # a broken format must not hide the others
            log.warning("weight format %s failed to inspect %s: %s", entry.name, source, exc)
            return [f"failed to inspect the model source: {type(exc).__name__}: {exc}"]
        return [f"does not recognise the model source {source!r}"]

    try:
        return select(formats, None, name, check=claims)
    except SelectionError as exc:
        if name and name != "auto":
            raise
        known = ", ".join(formats.names()) or "none loaded"
        raise SelectionError(
            f"no weight format recognises the model source {source!r} "
            f"(formats: {known}); expected a .gguf file, a directory with "
            "config.json and *.safetensors, or a Hugging Face id 'org/name'"
            + _format_hint(source, formats)
        ) from exc


def _format_hint(source: str, formats: WeightFormatRegistry) -> str:
    """The end of the no-format error: the first-party format plugin the source's shape asks
    for when it is not registered (a .gguf file, a directory, an 'org/name' id)."""
    import os

    if source.endswith(".gguf"):
        wanted = "gguf"
    elif os.path.isdir(source):
        wanted = "safetensors"
    elif source.count("/") == 1 and not os.path.exists(source):
        wanted = "hfhub"
    else:
        return formats.missing_hint()
    if wanted in formats.names():
        return formats.missing_hint()
    return install_hint(
        "weight_format", wanted, list(formats.names()), unloaded=formats.missing_hint(wanted)
    )


def _gguf_config(entry: Entry, checkpoint: Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` completed by ``entry``'s ``config_from_gguf`` from the file's metadata."""
    refine = getattr(entry.load(), "config_from_gguf", None)
    if refine is None:
        return dict(config)
    try:
        return dict(refine(checkpoint.extra.get("gguf_metadata", {}), dict(config)))
    except ModelFileError:
        raise
    except ValueError as exc:  # the model class names the key, not the file
        raise ModelFileError(checkpoint.config_path or checkpoint.source, None, str(exc)) from None


def _preprocessor_config(checkpoint: Checkpoint) -> dict[str, Any] | None:
    """The ``preprocessor_config.json`` beside the checkpoint's ``config.json``, if any."""
    if not checkpoint.config_path:
        return None
    path = os.path.join(os.path.dirname(checkpoint.config_path), "preprocessor_config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelFileError(path, None, f"not a readable JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise ModelFileError(path, None, "expected a JSON object")
    return data


def resolve_architecture(
    registries: Registries, checkpoint: Checkpoint
) -> tuple[Entry, dict[str, Any]]:
    """The architecture entry and the (possibly refined) HF-style config."""
    config = dict(checkpoint.config)
    arch = checkpoint.architecture
    if arch.startswith("gguf:"):
        entry = registries.architectures.for_gguf(arch[len("gguf:") :])
        refined = _gguf_config(entry, checkpoint, config)
        named = (refined.get("architectures") or [entry.name])[0]
        if named != entry.name and named not in getattr(entry.load(), "hf_architectures", ()):
            # the class hands the file to another architecture (llama.cpp writes Mixtral as
            # "llama" with experts): that one completes the config from the same metadata
            if named not in registries.architectures:
                raise SelectionError(
                    f"{checkpoint.source}: GGUF architecture {arch[len('gguf:') :]!r} with "
                    f"this configuration is served by {named}, which no loaded model plugin "
                    "implements" + registries.architectures.missing_hint(named)
                )
            entry = registries.architectures.entry(named)
            refined = _gguf_config(entry, checkpoint, config)
        refined.setdefault("architectures", [entry.name])
        return entry, refined
    if arch not in registries.architectures:
        known = ", ".join(sorted(registries.architectures.names())) or "none"
        raise SelectionError(
            f"no model plugin implements architecture {arch!r} "
            f"(loaded: {known})"
            + install_hint(
                "architecture",
                arch,
                list(registries.architectures.names()),
                unloaded=registries.architectures.missing_hint(arch),
            )
        )
    entry = registries.architectures.entry(arch)
    preprocessor = _preprocessor_config(checkpoint)
    if preprocessor is not None and "preprocessor_config" not in config:
        # an image processor's settings, beside config.json (vision-language models)
        config["preprocessor_config"] = preprocessor
    refine = getattr(entry.load(), "config_from_hf", None)
    if refine is not None:
        try:
            config = refine(config)
        except ValueError as exc:  # the model class names the key, not the file
            raise ModelFileError(
                checkpoint.config_path or checkpoint.source, None, str(exc)
            ) from None
    return entry, config


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


def resolve_task(requested: str | None, entry: Entry, checkpoint: Checkpoint) -> str:
    """What the model is served for: ``requested`` (``model.task``) when the architecture
    offers it; for ``auto``, embed for an architecture that cannot generate (an encoder) or a
    checkpoint whose files describe its embeddings (sentence-transformers), else generate."""
    cls = entry.load()
    tasks = tuple(getattr(cls, "tasks", ("generate",)))
    if requested in (None, "auto"):
        if "generate" not in tasks or (checkpoint.embedding is not None and "embed" in tasks):
            return "embed" if "embed" in tasks else tasks[0]
        return "generate"
    if requested not in tasks:
        raise SelectionError(
            f"model.task {requested!r}: architecture {entry.name} (from "
            f"{entry.distribution}) serves {', '.join(tasks)}"
        )
    return requested


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: ArchConfig
    checkpoint: Checkpoint
    architecture: Entry
    dtype: torch.dtype
    device: torch.device
    #: the quant scheme instance holding the weights (None: dense weights)
    quant: QuantScheme | None = None
    #: device memory of the model's parameters and buffers
    weight_bytes: int = 0
    #: what the model was built for: "generate" or "embed"
    task: str = "generate"


def load_model(
    registries: Registries,
    source: str,
    *,
    device: torch.device,
    dtype: str | torch.dtype | None = "auto",
    weight_format: str | None = None,
    revision: str | None = None,
    quant: QuantScheme | None = None,
    config: TallowConfig | None = None,
    isq: str | None = None,
    task: str | None = "auto",
    quant_scheme: str | None = None,
) -> LoadedModel:
    """Read ``source`` and build its model on ``device``. ``quant`` forces a scheme instance;
    without it the scheme follows the checkpoint, ``isq`` and ``quant_scheme``
    (:func:`choose_quant_scheme`, ``config`` being what schemes validate and read their
    settings from). ``task`` is ``model.task`` (:func:`resolve_task`)."""
    if quant is None and isq:
        isq_offers(registries.quant_schemes, isq)  # an unknown type fails before any reading
    fmt = choose_weight_format(registries, source, weight_format).load()()
    checkpoint = fmt.load(source, revision=revision)
    entry, config_dict = resolve_architecture(registries, checkpoint)
    # before anything is allocated from the config
    check_config_against_tensors(config_dict, checkpoint)
    arch_cfg = ArchConfig(config_dict)
    torch_dtype = resolve_dtype(dtype, device, str(config_dict.get("torch_dtype") or ""))
    if quant is None:
        quant = choose_quant_scheme(
            registries, checkpoint, device=device, config=config, isq=isq, quant_scheme=quant_scheme
        )
    cls = entry.load()
    resolved_task = resolve_task(task, entry, checkpoint)
    started = time.perf_counter()

    with torch.device(device):
        model = cls(
            arch_cfg,
            BuildContext(
                dtype=torch_dtype,
                device=device,
                quant=quant,
                task=resolved_task,
                tp_rank=tp_rank(),
                tp_size=tp_size(),
                expert_parallel=bool(config is not None and config.parallel.enable_expert_parallel),
                mtp=bool(config is not None and config.speculative.method == "mtp"),
            ),
        )
    quantizing = getattr(quant, "isq", None)
    if checkpoint.naming == "random":
        initialize_random(model, progress=f"Quantizing to {quantizing}" if quantizing else None)
        head = model.mtp_head() if isinstance(model, CausalLM) else None
        if isinstance(head, CausalLM):  # not a submodule of the model: filled on its own
            initialize_random(head)
            head.process_weights_after_loading()
        finish = getattr(model, "process_weights_after_loading", None)
        if finish is not None:
            finish()
    else:
        tensors = checkpoint.tensors()
        if quantizing:
            from tqdm.auto import tqdm

            tensors = tqdm(
                tensors,
                desc=f"Quantizing to {quantizing}",
                unit="tensor",
                disable=None,
                leave=False,
            )
        try:
            model.load_weights(tensors, naming=checkpoint.naming)
        except WeightLoadError as exc:
            if checkpoint.quantization and quant is None:
                raise WeightLoadError(
                    f"{exc}\n{checkpoint.source} is {checkpoint.quantization}-quantized and no "
                    "quant scheme serves it (the log line 'its weights are "
                    f"{checkpoint.quantization}-quantized, but ...' says why); its format could "
                    "not hand its tensors over as float weights"
                ) from exc
            raise
    model.eval()
    calibrate(
        model,
        quant,
        checkpoint,
        device,
        torch_dtype,
        max_tokens=arch_cfg.text.get("max_position_embeddings"),
        vocab_size=arch_cfg.text.get("vocab_size"),
    )
    nbytes = weight_bytes(model)
    log.info(
        "loaded %s (%s, %s) in %.1fs",
        source,
        entry.name,
        torch_dtype,
        time.perf_counter() - started,
    )
    summary = getattr(quant, "summary", None)
    log.info(
        "weights: %.2f GiB on %s%s",
        nbytes / 2**30,
        device,
        f" ({summary()})" if summary is not None else "",
    )
    return LoadedModel(
        model, arch_cfg, checkpoint, entry, torch_dtype, device, quant, nbytes, resolved_task
    )

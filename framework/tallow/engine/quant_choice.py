"""Which quant scheme holds a model's weights: the one that claims a quantized checkpoint, or
the one that offers the load-time quantization type ``model.isq``.

A scheme *claims* a checkpoint of quantization method M (``Checkpoint.quantization``, a
``config.json``'s ``quantization_config.quant_method``) when it serves M (its name, or a
method in the ``quant_methods`` it was registered with) and its ``detect`` accepts the
checkpoint's config. Exactly one claim serves; none dequantizes the tensors at load; two are
an error naming both and ``model.quant_scheme``, the setting that picks one. The same holds
for ``model.isq`` and the schemes' ``isq_types``.
"""

from __future__ import annotations

import logging
import torch

from tallow.config import TallowConfig

from tallow.plugin import (
    Checkpoint,
    ComponentLoadError,
    Entry,
    ModelFileError,
    QuantScheme,
    Registries,
    RegistryError,
    SelectionError,
)
from tallow.plugin.first_party import install_hint
from tallow.plugin.registry import QuantSchemeRegistry, serves_quant_method

log = logging.getLogger("tallow.engine")

#: what the setting ``model.quant_scheme`` names
SETTING = "model.quant_scheme (--quant-scheme)"


def scheme_refusals(
    cls: type[QuantScheme], config: TallowConfig | None, device: torch.device
) -> list[str]:
    """Why the scheme class ``cls`` cannot serve ``config`` on ``device`` (its ``validate``
    and ``min_capability``); empty when it can."""
    reasons = list(cls.validate(config) or []) if config is not None else []
    need = int(getattr(cls, "min_capability", 0) or 0)
    if need and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major * 10 + minor < need:
            reasons.append(
                f"needs CUDA compute capability {need // 10}.{need % 10}, "
                f"{device} has {major}.{minor}"
            )
    return reasons


def _named(entry: Entry) -> str:
    return f"{entry.name!r} (from {entry.distribution})"


def _ambiguous(what: str, entries: list[Entry]) -> SelectionError:
    names = ", ".join(_named(e) for e in entries[:-1]) + f" and {_named(entries[-1])}"
    return SelectionError(
        f"{what}: quant schemes {names} all claim it; set {SETTING} to the "
        "one that should serve it (or disable the other plugins with "
        "plugins.disable)"
    )


def choose_quant_scheme(
    registries: Registries,
    checkpoint: Checkpoint,
    *,
    device: torch.device,
    config: TallowConfig | None = None,
    isq: str | None = None,
    quant_scheme: str | None = None,
) -> QuantScheme | None:
    """The quant scheme instance that holds the model's weights, or None for dense weights.

    A quantized checkpoint goes to the scheme that claims it (see the module docstring), which
    then reads the checkpoint's config (``use_checkpoint_config``; a config it refuses stops
    the load, naming the config file). When none claims it, or the one that does cannot serve
    on this device, one log line says why and the tensors are dequantized at load. ``isq``
    (``model.isq``) asks the scheme that lists it in ``isq_types`` to quantize a float
    checkpoint while it loads. ``quant_scheme`` (``model.quant_scheme``; None or ``"auto"``:
    choose as described) names the scheme to use, which must claim the checkpoint or offer
    ``isq`` and be able to serve.
    """
    schemes = registries.quant_schemes
    named = _named_entry(schemes, quant_scheme)
    method = checkpoint.quantization
    if method and isq:
        raise SelectionError(
            f"model.isq {isq!r}: the checkpoint {checkpoint.source} is already "
            f"quantized ({method}); load-time quantization applies to float "
            "checkpoints"
        )
    if method:
        return _checkpoint_scheme(schemes, checkpoint, method, device, config, named)
    if isq:
        return _isq_scheme(schemes, isq, device, config, named)
    if named is not None:
        log.warning(
            "%s %r is not used: %s is not quantized and model.isq is not set",
            SETTING,
            named.name,
            checkpoint.source,
        )
    return None


def _named_entry(schemes: QuantSchemeRegistry, name: str | None) -> Entry | None:
    if not name or name == "auto":
        return None
    try:
        return schemes.entry(name)
    except RegistryError as exc:
        raise SelectionError(f"model.quant_scheme {name!r}: {exc}") from None


def _claims(
    schemes: QuantSchemeRegistry, checkpoint: Checkpoint, method: str
) -> tuple[list[Entry], list[str]]:
    """The schemes that claim the checkpoint, and why each other one serving ``method`` does
    not."""
    claims, passed = [], []
    for entry in schemes.for_quant_method(method):
        try:
            if entry.load().detect(dict(checkpoint.config)):
                claims.append(entry)
                continue
            passed.append(
                f"quant scheme {_named(entry)} does not hold this kind of {method} checkpoint"
            )
        except ComponentLoadError as exc:  # an unusable scheme must not stop a model that
            passed.append(str(exc))  # can load
        except Exception as exc:
            passed.append(
                f"quant scheme {_named(entry)} failed to inspect it ({type(exc).__name__}: {exc})"
            )
    return claims, passed


def _checkpoint_scheme(
    schemes: QuantSchemeRegistry,
    checkpoint: Checkpoint,
    method: str,
    device: torch.device,
    config: TallowConfig | None,
    named: Entry | None,
) -> QuantScheme | None:
    if named is not None:
        return _named_checkpoint_scheme(named, checkpoint, method, device, config)
    claims, passed = _claims(schemes, checkpoint, method)
    if len(claims) > 1:
        raise _ambiguous(f"{checkpoint.source} ({method}-quantized)", claims)
    if not claims:
        why = (
            "; ".join(passed)
            if passed
            else f"no quant scheme serving {method!r} is "
            "installed and enabled"
            + install_hint(
                "quant_method",
                method,
                [],
                unloaded=schemes.missing_hint(match=lambda e: serves_quant_method(e, method)),
            )
        )
        log.info(
            "%s: its weights are %s-quantized, but %s: dequantizing them at load",
            checkpoint.source,
            method,
            why,
        )
        return None
    entry = claims[0]
    try:
        reasons = scheme_refusals(entry.load(), config, device)
    except Exception as exc:
        reasons = [f"{type(exc).__name__}: {exc}"]
    if reasons:
        log.info(
            "%s: its weights are %s-quantized, but quant scheme %s cannot serve (%s): "
            "dequantizing them at load",
            checkpoint.source,
            method,
            _named(entry),
            "; ".join(reasons),
        )
        return None
    return _configured(entry, checkpoint, method, config)


def _named_checkpoint_scheme(
    entry: Entry,
    checkpoint: Checkpoint,
    method: str,
    device: torch.device,
    config: TallowConfig | None,
) -> QuantScheme:
    cls = entry.load()
    if not serves_quant_method(entry, method) or not cls.detect(dict(checkpoint.config)):
        raise SelectionError(
            f"model.quant_scheme {entry.name!r}: quant scheme {_named(entry)} "
            f"does not claim {checkpoint.source} ({method}-quantized)"
        )
    reasons = scheme_refusals(cls, config, device)
    if reasons:
        raise SelectionError(
            f"model.quant_scheme {entry.name!r}: quant scheme {_named(entry)} "
            f"cannot serve on {device}: {'; '.join(reasons)}"
        )
    return _configured(entry, checkpoint, method, config)


def _configured(
    entry: Entry, checkpoint: Checkpoint, method: str, config: TallowConfig | None
) -> QuantScheme:
    log.info(
        "quant scheme: %s (from %s) keeps the %s-quantized weights",
        entry.name,
        entry.distribution,
        method,
    )
    scheme: QuantScheme = entry.load()(config, isq=None)
    try:
        scheme.use_checkpoint_config(dict(checkpoint.config))
    except ValueError as exc:
        raise ModelFileError(
            checkpoint.config_path or checkpoint.source,
            None,
            f"quant scheme {_named(entry)} cannot serve its weights: {exc}",
        ) from None
    return scheme


def isq_offers(schemes: QuantSchemeRegistry, isq: str) -> list[Entry]:
    """The schemes of the quant-scheme registry ``schemes`` whose ``isq_types`` list ``isq``,
    highest priority first; :class:`SelectionError` naming the types the installed schemes
    offer when none does."""
    offers, offered = [], []
    for entry in schemes.by_priority():
        try:
            types = tuple(getattr(entry.load(), "isq_types", ()))
        except ComponentLoadError as exc:
            log.info("quant scheme %s cannot be loaded: %s", entry.name, exc)
            continue
        if isq in types:
            offers.append(entry)
        if types:
            offered.append(f"{', '.join(types)} ({entry.distribution})")
    if not offers:
        known = "; ".join(offered) or "none"
        raise SelectionError(
            f"model.isq {isq!r}: no installed quant scheme can quantize to it "
            f"(the installed ones offer: {known}; tallow-quant-gguf provides "
            "the GGML types, tallow-quant-fp8 fp8, tallow-quant-int4 int4, "
            "tallow-quant-fp4 mxfp4)" + schemes.missing_hint()
        )
    return offers


def _isq_scheme(
    schemes: QuantSchemeRegistry,
    isq: str,
    device: torch.device,
    config: TallowConfig | None,
    named: Entry | None,
) -> QuantScheme:
    offers = isq_offers(schemes, isq)
    if named is not None:
        if named not in offers:
            raise SelectionError(
                f"model.quant_scheme {named.name!r}: quant scheme "
                f"{_named(named)} does not quantize to model.isq {isq!r} "
                f"(schemes that do: {', '.join(e.name for e in offers)})"
            )
        offers = [named]
    if len(offers) > 1:
        raise _ambiguous(f"model.isq {isq!r}", offers)
    entry = offers[0]
    cls: type[QuantScheme] = entry.load()
    reasons = scheme_refusals(cls, config, device)
    if reasons:
        raise SelectionError(
            f"model.isq {isq!r}: quant scheme {_named(entry)} cannot quantize "
            f"to it here: {'; '.join(reasons)}"
        )
    log.info(
        "quant scheme: %s (from %s) quantizes the weights to %s while loading",
        entry.name,
        entry.distribution,
        isq,
    )
    return cls(config, isq=isq)

"""Registries: named, lazily imported components recorded with who registered them.

A registry stores *targets*: either a ``"module:attr"`` string, imported only when the
component is first used, or the object itself. Listing plugins therefore imports no torch and
touches no GPU. Every entry remembers the distribution (and version) that registered it, so
``tallow plugins list`` and ``/v1/plugins`` can say where a component came from.
"""

from __future__ import annotations

import importlib
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .errors import ComponentLoadError, describe_exception, missing_attribute
from .first_party import install_hint

log = logging.getLogger("tallow.plugin")


class RegistryError(ValueError):
    """A registration or a lookup that cannot be honoured (duplicate name, unknown name, bad target)."""


@dataclass
class Entry:
    """One registered component."""

    kind: str
    name: str
    #: a lazy ``"module:attr"`` string, or the object itself
    target: object
    distribution: str = "<unknown>"
    version: str = ""
    priority: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    _loaded: object = field(default=None, repr=False)
    #: the entry point of the plugin that registered it (``name = module``), when known
    entry_point: str = ""

    @property
    def lazy(self) -> bool:
        return isinstance(self.target, str)

    def load(self) -> Any:  # Any: a component is a class, a function or an app, by kind
        """Import the target (once) and return the object it names.

        A target that cannot be imported or resolved raises
        :class:`~tallow.plugin.ComponentLoadError` naming the plugin (distribution, version,
        entry point), the target and what failed.
        """
        if self._loaded is not None:
            return self._loaded
        if not isinstance(self.target, str):
            self._loaded = self.target
            return self._loaded
        module_name, sep, attr = self.target.partition(":")
        if not sep or not module_name or not attr:
            detail = "it is not of the form 'module:attr'"
            raise self._load_error(ValueError(detail), detail)
        try:
            obj: object = importlib.import_module(module_name)
        except Exception as exc:
            raise self._load_error(exc, describe_exception(exc)) from exc
        parts = attr.split(".")
        for depth, part in enumerate(parts):
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                where = (
                    f"{module_name}:{'.'.join(parts[:depth])}" if depth else f"module {module_name}"
                )
                raise self._load_error(exc, missing_attribute(where, part, dir(obj))) from exc
        self._loaded = obj
        return obj

    def _load_error(self, cause: BaseException, detail: str) -> ComponentLoadError:
        return ComponentLoadError(
            kind=self.kind,
            component=self.name,
            target=str(self.target),
            detail=detail,
            distribution=self.distribution,
            version=self.version,
            entry_point=self.entry_point,
            cause=cause,
        )

    def describe(self) -> dict[str, Any]:
        target = self.target if isinstance(self.target, str) else _qualname(self.target)
        return {
            "kind": self.kind,
            "name": self.name,
            "target": target,
            "distribution": self.distribution,
            "version": self.version,
            "priority": self.priority,
            **({"meta": self.meta} if self.meta else {}),
        }


def _qualname(obj: object) -> str:
    mod = getattr(obj, "__module__", type(obj).__module__)
    name = getattr(obj, "__qualname__", type(obj).__qualname__)
    return f"{mod}:{name}"


# The distribution currently registering. The plugin manager sets it around each plugin's
# registration hooks; direct calls (tests, the core itself) fall back to "<unknown>"/"tallow".
_current_owner: list[tuple[str, str, str]] = []


@contextmanager
def registering_as(distribution: str, version: str = "", entry_point: str = "") -> Iterator[None]:
    """Attribute every registration made inside the block to ``distribution`` (``version``,
    and the ``entry_point`` it was loaded from, for messages)."""
    _current_owner.append((distribution, version, entry_point))
    try:
        yield
    finally:
        _current_owner.pop()


def _owner() -> tuple[str, str, str]:
    return _current_owner[-1] if _current_owner else ("<unknown>", "", "")


class Registry:
    """A name → :class:`Entry` map for one kind of component.

    Subclasses add keyword arguments that describe their kind; the storage, duplicate rule and
    lazy loading live here.
    """

    kind: str = "component"

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        # Journal of mutations, so the plugin manager can roll back a failing plugin.
        self._journal: list[tuple[str, Entry | None]] = []
        #: set by the plugin manager: (kind, match) → what installed plugins that did not load
        #: would provide (see :meth:`missing_hint`)
        self.explain_unloaded: Callable[[str, Callable[[Entry], bool] | None], str] | None = None

    # -- registration -------------------------------------------------------------------
    def register(
        self,
        name: str,
        target: object,
        *,
        priority: int = 0,
        override: bool = False,
        **meta: Any,  # Any: each kind's registry adds typed keywords of its own
    ) -> Entry:
        """Register ``target`` (``"module:attr"`` or an object) under ``name``.

        A name registered before is refused unless ``override=True``; an override is logged with
        both distributions.
        """
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind}: a name must be a non-empty string, got {name!r}")
        if isinstance(target, str) and not all(target.partition(":")):
            raise RegistryError(
                f"{self.kind} {name!r}: target {target!r} is not of the form 'module:attr'"
            )
        dist, version, entry_point = _owner()
        previous = self._entries.get(name)
        if previous is not None:
            if not override:
                raise RegistryError(
                    f"{self.kind} {name!r} is already registered by {previous.distribution}"
                    f"{' ' + previous.version if previous.version else ''} "
                    f"(target {previous.describe()['target']}); {dist} may replace it only "
                    "with override=True"
                )
            log.warning(
                "%s %r registered by %s is overridden by %s",
                self.kind,
                name,
                previous.distribution,
                dist,
            )
        entry = Entry(
            self.kind, name, target, dist, version, priority, dict(meta), entry_point=entry_point
        )
        self._journal.append((name, previous))
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        if name not in self._entries:
            raise RegistryError(f"{self.kind} {name!r} is not registered")
        self._journal.append((name, self._entries.pop(name)))

    # -- transactions used by the plugin manager -----------------------------------------
    def mark(self) -> int:
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        """Undo every mutation since ``mark`` (newest first)."""
        while len(self._journal) > mark:
            name, previous = self._journal.pop()
            if previous is None:
                self._entries.pop(name, None)
            else:
                self._entries[name] = previous

    # -- lookup -------------------------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def names(self) -> list[str]:
        return list(self._entries)

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            hint = install_hint(
                self.kind, name, list(self._entries), unloaded=self.missing_hint(name)
            )
            raise RegistryError(
                f"unknown {self.kind} {name!r} (registered: {known})" + hint
            ) from None

    def missing_hint(
        self, name: str | None = None, *, match: Callable[[Entry], bool] | None = None
    ) -> str:
        """``"; plugin tallow-x 0.1 provides ... but is installed and not loaded: disabled by
        plugins.disable ...; take it out ..."`` when an installed plugin that was left out (or
        failed to load) may provide the component ``name`` (or one ``match`` accepts; neither:
        any of this kind), else ``""``. For the end of a lookup's error message."""
        if self.explain_unloaded is None:
            return ""
        if match is None and name is not None:
            match = lambda entry: entry.name == name  # noqa: E731
        text = self.explain_unloaded(self.kind, match)
        return f"; {text}" if text else ""

    def get(self, name: str) -> Any:  # Any: as Entry.load
        """The loaded component registered under ``name``."""
        return self.entry(name).load()

    def by_priority(self) -> list[Entry]:
        """Entries, highest priority first; equal priorities keep registration order."""
        return sorted(self._entries.values(), key=lambda e: -e.priority)

    def find(self, predicate: Callable[[Entry], bool]) -> list[Entry]:
        return [e for e in self._entries.values() if predicate(e)]


class ArchitectureRegistry(Registry):
    """Model classes, by Hugging Face ``architectures`` name.

    ``gguf=("llama", ...)`` also maps GGUF ``general.architecture`` values to this entry.
    """

    kind = "architecture"

    def register(
        self,
        name: str,
        target: object,
        *,
        gguf: tuple[str, ...] | list[str] = (),
        priority: int = 0,
        override: bool = False,
        **meta: object,
    ) -> Entry:
        return super().register(
            name, target, priority=priority, override=override, gguf=tuple(gguf), **meta
        )

    def for_gguf(self, gguf_arch: str) -> Entry:
        for entry in self.by_priority():
            if gguf_arch in entry.meta.get("gguf", ()):
                return entry
        known = sorted({g for e in self for g in e.meta.get("gguf", ())})
        hint = install_hint(
            "gguf_architecture",
            gguf_arch,
            [],
            unloaded=self.missing_hint(match=lambda e: gguf_arch in e.meta.get("gguf", ())),
        )
        raise RegistryError(
            f"no architecture plugin handles GGUF architecture {gguf_arch!r} "
            f"(known: {', '.join(known) or 'none'}){hint}"
        )


class WeightFormatRegistry(Registry):
    """Checkpoint loaders (safetensors directory, GGUF file, Hugging Face hub id, ...)."""

    kind = "weight_format"


class QuantSchemeRegistry(Registry):
    """Weight quantization schemes (GGUF k-quants, FP8, GPTQ/AWQ, ...).

    ``quant_methods=("gptq", "compressed-tensors", ...)`` names the checkpoint quantization
    methods (``Checkpoint.quantization``: a ``config.json``'s
    ``quantization_config.quant_method``) a scheme may serve besides its own name. Several
    schemes may list one method (``compressed-tensors`` holds fp8, int4 and fp4 weights); each
    says through ``detect(config)`` whether a checkpoint is one of its own (see
    :class:`tallow.plugin.QuantScheme`).
    """

    kind = "quant_scheme"

    def register(
        self,
        name: str,
        target: object,
        *,
        quant_methods: tuple[str, ...] | list[str] = (),
        priority: int = 0,
        override: bool = False,
        **meta: object,
    ) -> Entry:
        if isinstance(quant_methods, str) or not all(
            isinstance(m, str) and m for m in quant_methods
        ):
            raise RegistryError(
                f"{self.kind} {name!r}: quant_methods must be a tuple of "
                f"non-empty strings, got {quant_methods!r}"
            )
        return super().register(
            name,
            target,
            priority=priority,
            override=override,
            quant_methods=tuple(quant_methods),
            **meta,
        )

    def for_quant_method(self, method: str) -> list[Entry]:
        """The schemes that may serve checkpoints of quantization method ``method`` (it is
        their name or in their ``quant_methods``), highest priority first."""
        return [e for e in self.by_priority() if serves_quant_method(e, method)]


def serves_quant_method(entry: Entry, method: str) -> bool:
    """Whether the quant scheme ``entry`` may serve checkpoints of quantization method
    ``method``: its name, or one of the ``quant_methods`` it was registered with."""
    return entry.name == method or method in entry.meta.get("quant_methods", ())


class KVCodecRegistry(Registry):
    """KV-cache codecs (auto, fp8, turbo*).

    ``bits`` is the codec's nominal storage per K or V element without its scales (None: the
    model's dtype), kept as metadata so that listings show it without importing the codec.
    """

    kind = "kv_codec"

    def register(
        self,
        name: str,
        target: object,
        *,
        bits: float | None = None,
        priority: int = 0,
        override: bool = False,
        **meta: object,
    ) -> Entry:
        if bits is not None and (
            isinstance(bits, bool) or not isinstance(bits, (int, float)) or bits <= 0
        ):
            raise RegistryError(
                f"kv_codec {name!r}: bits must be a positive number or None, got {bits!r}"
            )
        return super().register(
            name, target, priority=priority, override=override, bits=bits, **meta
        )

    def label(self, name: str) -> str:
        """``name`` with its storage for listings: ``turbo4 (4 bits)``, ``auto (model dtype)``."""
        bits = self.entry(name).meta.get("bits")
        return f"{name} ({'model dtype' if bits is None else f'{bits:g} bits'})"


class AttentionBackendRegistry(Registry):
    """Attention backends; the highest-priority compatible one is chosen unless one is named."""

    kind = "attention_backend"


class ToolParserRegistry(Registry):
    """Tool-call parsers for model output."""

    kind = "tool_parser"


class ReasoningParserRegistry(Registry):
    """Reasoning parsers: split model output into reasoning and content; used only when
    ``server.reasoning_parser`` names one."""

    kind = "reasoning_parser"


class ToolProviderRegistry(Registry):
    """Providers of tools the server can call itself (MCP clients)."""

    kind = "tool_provider"


class GrammarBackendRegistry(Registry):
    """Structured-output grammar backends (xgrammar, llguidance); chosen by priority unless
    ``runner.grammar_backend`` names one."""

    kind = "grammar_backend"


class SpeculatorRegistry(Registry):
    """Speculators for speculative decoding (prompt lookup, draft models, MTP heads); used only
    when ``speculative.method`` names one."""

    kind = "speculator"


class RouteRegistry(Registry):
    """Extra HTTP routes: name = path, target = an ASGI app or a Starlette endpoint.

    With ``factory=True`` the target is instead called once, when the app is built, with the
    server's :class:`tallow.config.TallowConfig` (or None), and returns the app or endpoint to
    serve, or None when that configuration does not serve the route (a UI switched off).
    """

    kind = "route"

    def register(
        self,
        name: str,
        target: object,
        *,
        methods: tuple[str, ...] = ("GET",),
        mount: bool = False,
        factory: bool = False,
        priority: int = 0,
        override: bool = False,
        **meta: object,
    ) -> Entry:
        if not name.startswith("/"):
            raise RegistryError(f"route {name!r}: a path must start with '/'")
        return super().register(
            name,
            target,
            priority=priority,
            override=override,
            methods=tuple(methods),
            mount=mount,
            factory=factory,
            **meta,
        )


REGISTRY_CLASSES: dict[str, type[Registry]] = {
    cls.kind: cls
    for cls in (
        ArchitectureRegistry,
        WeightFormatRegistry,
        QuantSchemeRegistry,
        KVCodecRegistry,
        AttentionBackendRegistry,
        ToolParserRegistry,
        ToolProviderRegistry,
        RouteRegistry,
        GrammarBackendRegistry,
        ReasoningParserRegistry,
        SpeculatorRegistry,
    )
}


class Registries:
    """Every registry of one plugin manager, one attribute per kind."""

    def __init__(self) -> None:
        self.architectures = ArchitectureRegistry()
        self.weight_formats = WeightFormatRegistry()
        self.quant_schemes = QuantSchemeRegistry()
        self.kv_codecs = KVCodecRegistry()
        self.attention_backends = AttentionBackendRegistry()
        self.tool_parsers = ToolParserRegistry()
        self.tool_providers = ToolProviderRegistry()
        self.routes = RouteRegistry()
        self.grammar_backends = GrammarBackendRegistry()
        self.reasoning_parsers = ReasoningParserRegistry()
        self.speculators = SpeculatorRegistry()

    def explain_unloaded_with(
        self, explain: Callable[[str, Callable[[Entry], bool] | None], str]
    ) -> None:
        """Let every registry's lookup errors say what left-out plugins provide
        (:meth:`Registry.missing_hint`)."""
        for registry in self.all():
            registry.explain_unloaded = explain

    def all(self) -> list[Registry]:
        return [
            self.architectures,
            self.weight_formats,
            self.quant_schemes,
            self.kv_codecs,
            self.attention_backends,
            self.tool_parsers,
            self.tool_providers,
            self.routes,
            self.grammar_backends,
            self.reasoning_parsers,
            self.speculators,
        ]

    def mark(self) -> list[int]:
        return [r.mark() for r in self.all()]

    def rollback(self, marks: list[int]) -> None:
        for registry, mark in zip(self.all(), marks):
            registry.rollback(mark)

    def owned_by(self, distribution: str) -> dict[str, list[str]]:
        """Component names per kind registered by ``distribution``."""
        out: dict[str, list[str]] = {}
        for registry in self.all():
            names = [e.name for e in registry if e.distribution == distribution]
            if names:
                out[registry.kind] = names
        return out

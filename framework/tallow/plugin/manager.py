"""The plugin manager: find plugin distributions, load the chosen ones, each in isolation.

A plugin is a distribution with an entry point in the group ``tallow`` whose name is the
distribution's name and whose value is the module holding its ``@hookimpl`` functions.

Loading goes in three steps (the first two in :mod:`tallow.plugin.discovery`):

1. *Discover* the entry points (reading metadata only; nothing is imported).
2. *Plan*: decide from ``plugins: {autoload, enable, disable, require}`` and ``TALLOW_PLUGINS``
   which distributions load and whether their failure is fatal. A required distribution that
   is missing, of the wrong version, or excluded stops start-up here, before any import.
3. *Load* each chosen distribution in a transaction: import the module, check its hook names,
   register it with pluggy, call its registration hooks inside
   :func:`~tallow.plugin.registering_as`. On any error the registries are rolled back and the
   plugin is unregistered, so a broken plugin leaves no trace; an enabled or required plugin's
   error then stops start-up (:class:`PluginLoadError`), an autoloaded one's is reported as
   ``failed`` and start-up goes on.

The core's own components (:mod:`tallow.builtins`) load first, the same way, as distribution
``tallow``. ``TALLOW_TRACE_HOOKS=1`` writes every hook call to stderr.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as metadata
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import pluggy

from tallow import __version__

from . import hookspecs
from .errors import PluginError, PluginLoadError, describe_exception as _describe
from .discovery import (
    CORE_DISTRIBUTION as CORE_DISTRIBUTION,
    ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,
    ENV_PLUGINS as ENV_PLUGINS,
    Candidate as Candidate,
    Plan as Plan,
    canonical as canonical,
    discover as discover,
    plan_plugins as plan_plugins,
)
from .hookspecs import PROJECT
from .registry import Registries, registering_as
from .target_check import target_problems
from .unloaded import UnloadedPlugins

if TYPE_CHECKING:
    from tallow.config import PluginsConfig, TallowConfig

log = logging.getLogger("tallow.plugin")

CORE_MODULE = "tallow.builtins"
ENV_TRACE = "TALLOW_TRACE_HOOKS"
REGISTRATION_PREFIX = "tallow_register_"
#: statuses of a plugin whose hooks and components are in the manager
_LOADED = ("ok", "broken")

#: every hook tallow declares, in declaration order
HOOK_NAMES: tuple[str, ...] = tuple(
    name
    for name, obj in vars(hookspecs).items()
    if name.startswith("tallow_") and callable(obj) and hasattr(obj, f"{PROJECT}_spec")
)


class HookNameError(PluginError):
    """A plugin defines a hook tallow does not declare, or forgot ``@hookimpl``."""


@dataclass
class PluginStatus:
    """What happened to one plugin distribution.

    ``status`` is ``"ok"``, ``"failed"`` (``reason`` holds the error), ``"disabled"``
    (``reason`` says which setting left it out) or ``"broken"`` (it loaded, but a registered
    ``"module:attr"`` target does not resolve: :meth:`PluginManager.check_targets`). ``mode``
    says why it was loaded: ``builtin``, ``required``, ``enabled`` or ``autoload`` (empty when
    disabled). ``components`` maps each kind to the names this distribution registered.
    """

    name: str
    version: str
    entry_point: str
    status: str
    reason: str = ""
    mode: str = ""
    components: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "entry_point": self.entry_point,
            "status": self.status,
            "reason": self.reason,
            "mode": self.mode,
            "components": {k: list(v) for k, v in self.components.items()},
        }


@dataclass
class _Record:
    name: str
    version: str
    entry_point: str
    status: str
    reason: str = ""
    mode: str = ""
    plugin: object = None


# ---------------------------------------------------------------------------------------------
# Hook relay: pluggy's, with tallow's calling rule for the historic hook
# ---------------------------------------------------------------------------------------------
class _HistoricCaller:
    """Calling a historic hook records the call, so plugins registered later receive it too."""

    def __init__(self, caller: pluggy.HookCaller) -> None:
        self._caller = caller

    def __call__(self, **kwargs: object) -> list[object]:
        results: list[object] = []
        self._caller.call_historic(result_callback=results.append, kwargs=kwargs)
        return results

    def __getattr__(self, name: str) -> Any:  # Any: whatever pluggy's HookCaller has
        return getattr(self._caller, name)


class HookRelay:
    """``pm.hook.<name>(**kwargs)`` calls every implementation of a hook.

    As pluggy's relay, except: ``tallow_configure`` (historic) may be called directly and is
    replayed to plugins registered later.
    """

    def __init__(self, manager: "PluginManager") -> None:
        self._manager = manager

    def __getattr__(self, name: str) -> Any:  # Any: each hook's caller takes its own arguments
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            caller = getattr(self._manager.pluggy.hook, name)
        except AttributeError:
            raise AttributeError(
                f"tallow declares no hook {name!r} (hooks: {', '.join(HOOK_NAMES)})"
            ) from None
        if caller.spec is not None and caller.spec.opts.get("historic"):
            return _HistoricCaller(caller)
        return caller

    def __dir__(self) -> list[str]:
        return list(HOOK_NAMES)


# ---------------------------------------------------------------------------------------------
# The manager
# ---------------------------------------------------------------------------------------------
class PluginManager:
    """Plugins of one process: the pluggy manager, the component registries, the statuses."""

    def __init__(self, *, trace: bool | None = None, env: Mapping[str, str] = os.environ) -> None:
        self.pluggy = pluggy.PluginManager(PROJECT)
        self.pluggy.add_hookspecs(hookspecs)
        self.registries = Registries()
        self.hook = HookRelay(self)
        #: the discovered plugins that did not load, for "installed but disabled" messages
        self.unloaded = UnloadedPlugins(probe_alone)
        self.registries.explain_unloaded_with(self.unloaded.explain)
        self._records: dict[str, _Record] = {}
        if trace is None:
            trace = env.get(ENV_TRACE, "").strip().lower() not in ("", "0", "false", "no")
        if trace:
            self.enable_tracing()

    # -- adding plugins ------------------------------------------------------------------
    def add_plugin(
        self,
        plugin: object,
        name: str,
        version: str = "",
        *,
        entry_point: str = "",
        mode: str = "enabled",
        fatal: bool = True,
    ) -> PluginStatus:
        """Register ``plugin`` (a module or object with ``@hookimpl`` methods) as distribution
        ``name`` and call its registration hooks, in one transaction.

        On failure everything it registered is rolled back; with ``fatal`` a
        :class:`PluginLoadError` is raised, otherwise the status is ``failed``.
        """
        return self._load(
            name,
            version,
            entry_point or _object_label(plugin),
            lambda: plugin,
            mode=mode,
            fatal=fatal,
        )

    def load_candidate(self, candidate: Candidate, *, mode: str, fatal: bool) -> PluginStatus:
        """Import a discovered plugin's entry point and add it (see :meth:`add_plugin`)."""
        return self._load(
            candidate.name,
            candidate.version,
            candidate.label,
            candidate.entry_point.load,
            mode=mode,
            fatal=fatal,
        )

    def record_disabled(self, candidate: Candidate, reason: str, enable: str = "") -> PluginStatus:
        """Note a discovered plugin that was not loaded, why (``reason``), and how to load it
        (``enable``, for messages about a component it provides)."""
        record = _Record(candidate.name, candidate.version, candidate.label, "disabled", reason)
        self._records[canonical(candidate.name)] = record
        self.unloaded.disabled(canonical(candidate.name), candidate, reason, enable)
        return self._status(record)

    def _load(
        self,
        name: str,
        version: str,
        label: str,
        importer: Callable[[], object],
        *,
        mode: str,
        fatal: bool,
    ) -> PluginStatus:
        key = canonical(name)
        if key in self._records and self._records[key].status in _LOADED:
            raise PluginError(f"plugin {name} is already loaded")
        marks = self.registries.mark()
        plugin: object = None
        try:
            plugin = importer()
            self._check_hook_names(plugin, name)
            self.pluggy.register(plugin, name=name)
            self._check_pending_for(plugin, name)
            implemented = {c.name for c in self.pluggy.get_hookcallers(plugin) or []}
            with registering_as(name, version, label):
                for hook_name in HOOK_NAMES:
                    if hook_name.startswith(REGISTRATION_PREFIX) and hook_name in implemented:
                        registry = getattr(self.registries, hook_name[len(REGISTRATION_PREFIX) :])
                        self._caller_for(plugin, hook_name)(registry=registry)
        except Exception as exc:
            self.registries.rollback(marks)
            if plugin is not None and self.pluggy.get_name(plugin) == name:
                self.pluggy.unregister(plugin)
            reason = _describe(exc)
            self._records[key] = _Record(name, version, label, "failed", reason, mode)
            self.unloaded.failed(key, name, version, reason)
            if fatal:
                why = {
                    "required": "it is required (plugins.require)",
                    "builtin": "it is part of the core",
                }.get(mode, "it is enabled (plugins.enable or TALLOW_PLUGINS)")
                raise PluginLoadError(
                    f"plugin {name} {version or '(unknown version)'} (entry point {label}) "
                    f"failed to load: {reason}\n{why}, so tallow cannot start; fix or uninstall "
                    "it, or leave it out of the configuration",
                    distribution=name,
                    version=version,
                    entry_point=label,
                    cause=exc,
                ) from exc
            log.warning(
                "plugin %s %s (entry point %s) failed to load and is skipped: %s",
                name,
                version,
                label,
                reason,
            )
        else:
            self._records[key] = _Record(name, version, label, "ok", "", mode, plugin)
            self.unloaded.loaded(key)
            log.debug("plugin %s %s loaded (%s)", name, version, mode)
        return self._status(self._records[key])

    def _caller_for(self, plugin: object, hook_name: str) -> pluggy.HookCaller:
        """A caller of ``hook_name`` that reaches only ``plugin``'s implementation."""
        others = [p for p in self.pluggy.get_plugins() if p is not plugin]
        return self.pluggy.subset_hook_caller(hook_name, remove_plugins=others)

    def _check_hook_names(self, plugin: object, name: str) -> None:
        """Catch ``tallow_*`` functions that would silently never be called."""
        for attr in dir(plugin):
            if not attr.startswith("tallow_") or not callable(getattr(plugin, attr, None)):
                continue
            if self.pluggy.parse_hookimpl_opts(plugin, attr) is not None:
                continue  # marked: unknown names are caught by _check_pending_for
            if attr in HOOK_NAMES:
                raise HookNameError(
                    f"{name}: {attr} is not marked with @hookimpl (from tallow.plugin import "
                    "hookimpl), so it would never be called"
                )
            close = difflib.get_close_matches(attr, HOOK_NAMES, n=1, cutoff=0.8)
            if close:
                raise HookNameError(
                    f"{name}: {attr} is not a tallow hook; did you mean {close[0]}?"
                )

    def _check_pending_for(self, plugin: object, name: str) -> None:
        """pluggy's ``check_pending``, for one plugin, with a suggestion for misspellings."""
        for impl_caller in self.pluggy.get_hookcallers(plugin) or []:
            if impl_caller.has_spec():
                continue
            for impl in impl_caller.get_hookimpls():
                if impl.plugin is plugin and not impl.optionalhook:
                    close = difflib.get_close_matches(impl_caller.name, HOOK_NAMES, n=1)
                    hint = (
                        f"did you mean {close[0]}?"
                        if close
                        else f"tallow's hooks are {', '.join(HOOK_NAMES)}"
                    )
                    raise HookNameError(f"{name}: unknown hook {impl_caller.name!r}; {hint}")

    # -- lifecycle -----------------------------------------------------------------------
    def configure(self, config: TallowConfig) -> None:
        """Tell every plugin (and every plugin added later) the effective configuration."""
        self.hook.tallow_configure(config=config)

    def check_pending(self) -> None:
        """Raise if any registered plugin implements a hook tallow does not declare."""
        self.pluggy.check_pending()

    # -- tracing -------------------------------------------------------------------------
    def enable_tracing(self, writer: Callable[[str], object] | None = None) -> Callable[[], None]:
        """Write every hook call and its result (to stderr by default); returns an undo."""

        def to_stderr(text: str) -> None:
            sys.stderr.write(
                "".join("[tallow hooks] " + line for line in text.splitlines(keepends=True))
            )

        self.pluggy.trace.root.setwriter(writer or to_stderr)
        return self.pluggy.enable_tracing()

    # -- introspection -------------------------------------------------------------------
    def statuses(self) -> list[PluginStatus]:
        """Every plugin seen, the core first, then in load order."""
        return [self._status(r) for r in self._records.values()]

    def status(self, name: str) -> PluginStatus:
        record = self._records.get(canonical(name))
        if record is None:
            raise KeyError(
                f"no plugin named {name!r} was seen "
                f"(seen: {', '.join(r.name for r in self._records.values())})"
            )
        return self._status(record)

    def loaded(self) -> dict[str, str]:
        """Distribution → version of every plugin that loaded (the core included): what a
        worker process must load to match this one (:func:`load_pinned_plugins`)."""
        return {r.name: r.version for r in self._records.values() if r.status in _LOADED}

    def check_targets(self, *, import_them: bool = False) -> None:
        """Resolve every lazy target of the loaded plugins; a plugin with a target that does not
        resolve gets status ``broken``, its reason naming each such component, its target and
        what is wrong. Without ``import_them`` the targets are found without importing them
        (:func:`tallow.plugin.target_check.target_problem`: no torch, no GPU); with it each is
        imported, which also catches a missing dependency."""
        for record in self._records.values():
            if record.status != "ok":
                continue
            problems = target_problems(self.registries, record.name, import_them=import_them)
            if problems:
                record.status = "broken"
                record.reason = "; ".join(problems)

    def _status(self, record: _Record) -> PluginStatus:
        return PluginStatus(
            record.name,
            record.version,
            record.entry_point,
            record.status,
            record.reason,
            record.mode,
            self.registries.owned_by(record.name) if record.status in _LOADED else {},
        )


def _object_label(plugin: object) -> str:
    return getattr(plugin, "__name__", None) or type(plugin).__qualname__


def _core_version() -> str:
    return __version__


def load_plugins(
    plugins_config: PluginsConfig | TallowConfig | Mapping[str, object] | None = None,
    *,
    env: Mapping[str, str] = os.environ,
    entry_points: Iterable[metadata.EntryPoint] | None = None,
    builtins: bool = True,
) -> PluginManager:
    """Discover, plan and load the plugins; return the manager.

    ``plugins_config`` is ``config.plugins`` (or a whole config, a mapping, or None for the
    defaults). ``env`` supplies ``TALLOW_PLUGINS`` (comma-separated distribution names: exactly
    those load, as if enabled; empty: no external plugin) and ``TALLOW_TRACE_HOOKS``.
    ``entry_points`` replaces discovery (embedding, tests). The caller then calls
    ``pm.configure(config)`` (the ``tallow_configure`` hook).

    Raises :class:`PluginError` / :class:`PluginLoadError` when start-up must stop.
    """
    config = _plugins_section(plugins_config)
    pm = PluginManager(env=env)
    if builtins:
        pm.add_plugin(
            importlib.import_module(CORE_MODULE),
            CORE_DISTRIBUTION,
            _core_version(),
            entry_point=CORE_MODULE,
            mode="builtin",
            fatal=True,
        )
    plan = plan_plugins(discover(entry_points), config, env)
    for candidate, mode, reason in plan.items:
        if mode is None:
            pm.record_disabled(candidate, reason, plan.advice.get(canonical(candidate.name), ""))
        else:
            pm.load_candidate(candidate, mode=mode, fatal=mode != "autoload")
    pm.check_pending()
    return pm


def load_pinned_plugins(
    pinned: Mapping[str, str], *, entry_points: Iterable[metadata.EntryPoint] | None = None
) -> PluginManager:
    """Load exactly the distributions of ``pinned`` (name → version, as
    :meth:`PluginManager.loaded` returned in the driver), each required at that version.

    For worker processes, which must match the driver; ``TALLOW_PLUGINS`` is not consulted.
    """
    core = pinned.get(CORE_DISTRIBUTION)
    if core is not None and core != _core_version():
        raise PluginError(
            f"this process runs tallow {_core_version()} but the driver runs tallow {core}"
        )
    require = [
        f"{n}=={v}" if v else n for n, v in pinned.items() if canonical(n) != CORE_DISTRIBUTION
    ]
    config = {"autoload": False, "enable": [], "disable": [], "require": require}
    return load_plugins(config, env={}, entry_points=entry_points)


class _Section:
    def __init__(self, data: Mapping[str, object]) -> None:
        self.__dict__.update(data)


def _plugins_section(plugins_config: object) -> object:
    if plugins_config is None:
        return _Section({})
    if isinstance(plugins_config, Mapping):
        unknown = set(plugins_config) - {"autoload", "enable", "disable", "require", "settings"}
        if unknown:
            raise PluginError(
                f"plugins: unknown keys {sorted(unknown)}; expected autoload, "
                "enable, disable, require, settings"
            )
        return _Section(plugins_config)
    if not hasattr(plugins_config, "autoload") and hasattr(plugins_config, "plugins"):
        return plugins_config.plugins
    return plugins_config


def probe_alone(candidate: Candidate) -> Registries | None:
    """The registries a left-out plugin fills when loaded on its own (None: it cannot load)."""
    scratch = PluginManager(env={})
    try:
        scratch.load_candidate(candidate, mode="enabled", fatal=True)
    except PluginError:
        return None
    return scratch.registries

"""Testing helpers for plugin authors: an isolated plugin manager and a hook-call recorder.

Enable the pytest fixtures in a test module (or in a project's top-level conftest.py)::

    pytest_plugins = ["tallow.plugin.testing"]

    def test_registers_my_backend(tallow_plugin_manager, tallow_hook_recorder):
        import tallow_mine.plugin
        status = tallow_plugin_manager.add_plugin(tallow_mine.plugin, "tallow-mine", "0.1.0")
        assert status.status == "ok"
        assert "mine" in tallow_plugin_manager.registries.attention_backends
        assert tallow_hook_recorder.called("tallow_register_attention_backends")

The isolated manager discovers nothing: only the plugins you add are in it (plus tallow's own
components if you ask for ``builtins=True``), so installed plugins cannot change your test.

(PYTEST_DONT_REWRITE: this module raises its own AssertionErrors, so pytest need not rewrite
it, and may then load it as a plugin after a test module has imported it.)
"""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import pluggy

from tallow import __version__
from tallow.config import config_from_mapping

from ..discovery import CORE_DISTRIBUTION
from ..manager import CORE_MODULE, PluginManager, PluginStatus

if TYPE_CHECKING:
    from tallow.config import TallowConfig

    from ..tool_parsing import ParseResult, ToolParser

#: the conformance suites and their helpers, imported on first use (they import torch)
_LAZY = {
    "ComponentConformance": "component",
    "AttentionBackendConformance": "attention",
    "KVCodecConformance": "kv_codec",
    "ToolParserConformance": "tool_parser",
    "ReasoningParserConformance": "reasoning_parser",
    "WeightFormatConformance": "weight_format",
    "WrittenCheckpoint": "weight_format",
    "QuantSchemeConformance": "quant",
    "QuantizedLayer": "quant",
    "ModelArchitectureConformance": "model",
    "ToolProviderConformance": "tool_provider",
    "RouteConformance": "routes",
    "GrammarBackendConformance": "grammar_backend",
    "tiny_tokenizer_info": "grammar_backend",
    "allowed_ids": "grammar_backend",
    "closing_tokens": "grammar_backend",
    "walk_to_end": "grammar_backend",
    "PagedStep": "paged_batch",
    "random_paged_step": "paged_batch",
    "check_step": "paged_batch",
    "PagedRunner": "paged_runner",
    "tiny_tokenizer": "tokenizer",
    "save_tokenizer": "tokenizer",
    "offline_llm": "engine",
    "forced_logprobs": "engine",
    "run_interpreted": "interpreter",
    "random_hf_model": "model_parity",
    "assert_greedy_parity": "model_parity",
    "assert_cuda_parity": "model_parity",
    "assert_engine_greedy": "model_parity",
    "load_model": "model_parity",
    "load_saved": "model_parity",
    "gguf_tensors": "gguf_files",
    "gguf_metadata": "gguf_files",
    "write_gguf": "gguf_files",
    "read_gguf": "gguf_files",
}


__all__ = [
    "isolated_plugin_manager",
    "add_plugin",
    "HookCall",
    "HookRecorder",
    "make_config",
    "suite_failures",
    "tallow_plugin_manager",
    "tallow_hook_recorder",
    "parse_summary",
    "assert_streaming_matches_parse",
    "assert_every_split_matches_parse",
    "modules_imported_by_registration",
    *_LAZY,
]


def __getattr__(name: str) -> Any:  # Any: the lazily imported helper named
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _default_name(plugin: object) -> str:
    return getattr(plugin, "__name__", None) or type(plugin).__name__


def add_plugin(
    pm: PluginManager,
    plugin: object,
    name: str | None = None,
    version: str = "",
    *,
    fatal: bool = True,
) -> PluginStatus:
    """Add ``plugin`` (a module, an object with ``@hookimpl`` methods, or a module path) to
    ``pm`` as distribution ``name`` (default: the module's name) and run its registration hooks.

    With ``fatal`` (the default) a failure raises :class:`~tallow.plugin.manager.PluginLoadError`
    carrying the original error; otherwise the returned status says ``failed``.
    """
    if isinstance(plugin, str):
        plugin = importlib.import_module(plugin)
    return pm.add_plugin(plugin, name or _default_name(plugin), version, fatal=fatal)


def isolated_plugin_manager(
    *plugins: object, builtins: bool = False, trace: bool = False
) -> PluginManager:
    """A manager without entry-point discovery holding exactly ``plugins``.

    Each item is a plugin (see :func:`add_plugin`) or a ``(name, plugin)`` pair. With
    ``builtins`` tallow's own components are added first, as distribution ``tallow``.
    """
    pm = PluginManager(trace=trace, env={})
    if builtins:
        pm.add_plugin(
            importlib.import_module(CORE_MODULE),
            CORE_DISTRIBUTION,
            __version__,
            entry_point=CORE_MODULE,
            mode="builtin",
        )
    for item in plugins:
        if isinstance(item, tuple):
            name, plugin = item
            add_plugin(pm, plugin, name)
        else:
            add_plugin(pm, item)
    return pm


def modules_imported_by_registration(
    module: str, hook: str, registry: str, watch: tuple[str, ...] = ("torch",)
) -> list[str]:
    """Which of ``watch`` a fresh interpreter has imported after importing the registration
    module ``module`` and calling its ``hook`` with an empty ``registry`` (a registry class
    of :mod:`tallow.plugin`, by name). Registration should stay light (``tallow plugins``
    and start-up run it for every plugin; components load lazily), so a plugin test asserts
    this is empty. Raises AssertionError with the child's stderr if registration fails."""
    code = (
        "import importlib, sys, tallow.plugin as tp\n"
        f"m = importlib.import_module({module!r})\n"
        f"getattr(m, {hook!r})(getattr(tp, {registry!r})())\n"
        f"print(','.join(n for n in {tuple(watch)!r} if n in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"registering {module} failed:\n{out.stderr}")
    return [name for name in out.stdout.strip().split(",") if name]


def suite_failures(
    source: str, directory: str | os.PathLike[str], timeout: float = 600
) -> tuple[set[str], str]:
    """Run the test module ``source`` (conformance suites subclassed for deliberately broken
    components, say) in a fresh pytest process in ``directory``; return the ids
    (``Class::test[param]``) of the tests that failed or errored, and pytest's output. This is
    how a plugin checks that a suite catches a bug: the tests that must fail do, the others
    pass."""
    import pathlib
    import textwrap

    module = pathlib.Path(directory) / "test_broken.py"
    module.write_text(textwrap.dedent(source))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", str(module)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=directory,
    )
    failed = {
        line.split("::", 2)[1] + "::" + line.split("::", 2)[2].split(" ")[0]
        for line in proc.stdout.splitlines()
        if line.startswith(("FAILED", "ERROR"))
    }
    return failed, proc.stdout


def make_config(data: Mapping[str, Any] | None = None) -> TallowConfig:
    """A validated :class:`tallow.config.TallowConfig` from a nested mapping, e.g.
    ``make_config({"runner": {"attention_backend": "mine"}})``, for ``validate(config)`` and
    ``tallow_configure`` in plugin tests."""
    return config_from_mapping(data or {}, origin="test config")


@dataclass
class HookCall:
    """One call of a hook: its arguments, the plugins whose implementations ran, the outcome."""

    name: str
    kwargs: dict[str, Any]
    plugins: list[str]
    result: object = None
    exception: BaseException | None = None


@dataclass
class HookRecorder:
    """Records every hook call made through a :class:`PluginManager` while it is open.

    Recorders (and tracing) stack; close them in the reverse order of opening (the fixtures
    do). Usable as a context manager.
    """

    pm: PluginManager
    calls: list[HookCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._pending: list[HookCall] = []
        self._undo: Callable[[], None] | None = self.pm.pluggy.add_hookcall_monitoring(
            self._before, self._after
        )

    def _before(
        self, hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]
    ) -> None:
        names = [impl.plugin_name for impl in impls]
        self._pending.append(HookCall(hook_name, dict(kwargs), names))

    def _after(
        self,
        outcome: pluggy.Result[object],
        hook_name: str,
        impls: Sequence[pluggy.HookImpl],
        kwargs: Mapping[str, Any],
    ) -> None:
        call = self._pending.pop()
        call.exception = outcome.exception
        if outcome.exception is None:
            call.result = outcome.get_result()
        self.calls.append(call)

    def names(self) -> list[str]:
        """Hook names in call order (with repeats)."""
        return [c.name for c in self.calls]

    def calls_of(self, name: str) -> list[HookCall]:
        return [c for c in self.calls if c.name == name]

    def called(self, name: str) -> bool:
        return any(c.name == name for c in self.calls)

    def assert_called(self, name: str, times: int | None = None) -> list[HookCall]:
        """The calls of ``name``; AssertionError if none (or not exactly ``times``)."""
        calls = self.calls_of(name)
        if not calls or (times is not None and len(calls) != times):
            raise AssertionError(
                f"expected {name} to be called {times if times is not None else 'at least once'}"
                f" time(s), it was called {len(calls)} time(s); calls: {self.names()}"
            )
        return calls

    def clear(self) -> None:
        self.calls.clear()

    def close(self) -> None:
        """Stop recording."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def __enter__(self) -> "HookRecorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


try:
    import pytest
except ImportError:  # pragma: no cover - the helpers above work without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def tallow_plugin_manager() -> PluginManager:
        """An empty isolated :class:`PluginManager` (no discovery, no builtins); add your plugin
        with ``.add_plugin(module, "tallow-name", "version")``."""
        return isolated_plugin_manager()

    @pytest.fixture
    def tallow_hook_recorder(tallow_plugin_manager: PluginManager) -> Iterator[HookRecorder]:
        """A :class:`HookRecorder` on ``tallow_plugin_manager``, open for the whole test."""
        recorder = HookRecorder(tallow_plugin_manager)
        yield recorder
        recorder.close()


# -- tool-call parsers ---------------------------------------------------------------------
def parse_summary(result: ParseResult) -> tuple[str | None, list[tuple[str, str]]]:
    """``(content, [(name, arguments), ...])`` of a ParseResult: what a client sees (call ids,
    which are random, left out)."""
    return result.content, [(c.name, c.arguments) for c in result.tool_calls]


def assert_streaming_matches_parse(
    parser: ToolParser, text: str, tools: list[dict[str, Any]] | None = None, tries: int = 40
) -> ParseResult:
    """Check a tool parser's contract on ``text``: fed one character at a time, then in
    ``tries`` random splits (chunks of 1–9 characters, seeded by the text), the assembled
    stream equals ``parser.parse(text, tools)``. Returns that parse result."""
    from ..tool_parsing import assemble

    whole = parser.parse(text, tools)
    rng = random.Random(text)
    for n in range(tries + 1):
        chunks, i = [], 0
        while i < len(text):
            k = 1 if n == 0 else rng.randint(1, 9)
            chunks.append(text[i : i + k])
            i += k
        stream = parser.stream(tools)
        deltas = [stream.feed(c) for c in chunks] + [stream.finish()]
        streamed = parse_summary(assemble(deltas))
        if streamed != parse_summary(whole):
            raise AssertionError(
                f"streamed {streamed!r} != parsed {parse_summary(whole)!r} for chunks {chunks!r}"
            )
    return whole


def assert_every_split_matches_parse(
    parser: ToolParser, text: str, tools: list[dict[str, Any]] | None = None
) -> ParseResult:
    """:func:`assert_streaming_matches_parse`, and also ``text`` fed in two pieces split at
    every index (each piece's delta checked as it comes): the assembled stream equals
    ``parser.parse(text, tools)`` for every split point. Returns that parse result."""
    from ..tool_parsing import assemble

    whole = assert_streaming_matches_parse(parser, text, tools)
    for k in range(len(text) + 1):
        stream = parser.stream(tools)
        deltas = [stream.feed(text[:k]), stream.feed(text[k:]), stream.finish()]
        streamed = parse_summary(assemble(deltas))
        if streamed != parse_summary(whole):
            raise AssertionError(
                f"split at {k}: streamed {streamed!r} != parsed {parse_summary(whole)!r} "
                f"for {text[:k]!r} + {text[k:]!r}"
            )
    return whole

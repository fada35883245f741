"""The ``tallow`` command.

``tallow plugins list`` and ``tallow config show`` live here. ``tallow serve``, ``tallow bench``,
``tallow mcp`` and ``tallow quantize`` come from :mod:`tallow.server.cli`,
:mod:`tallow.bench.cli`, :mod:`tallow.server.mcp_cli` and :mod:`tallow.quantize_cli` when
those are installed: each provides ``add_parser(subparsers) -> argparse.ArgumentParser`` that
adds its subcommand and sets ``func`` (``func(args) -> int | None``) with ``set_defaults``.
They are imported only when their subcommand runs, so ``tallow --help`` and ``tallow plugins
list`` import no torch.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import sys
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from tallow.config import TallowConfig
    from tallow.plugin.manager import PluginManager

from tallow import __version__

# subcommand → (module providing add_parser, one-line help shown while it is not imported)
EXTERNAL_COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("tallow.server.cli", "start the OpenAI-compatible HTTP server"),
    "bench": ("tallow.bench.cli", "run the benchmarks"),
    "mcp": ("tallow.server.mcp_cli", "serve the model to MCP hosts over stdio"),
    "quantize": ("tallow.quantize_cli", "write a quantized model file (e.g. a Q4_K_M GGUF)"),
}


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing
        return False


def _first_positional(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser of ``tallow``; ``argv`` decides which external subcommand is imported."""
    from tallow.config import add_config_arguments

    parser = argparse.ArgumentParser(
        prog="tallow", description="tallow: an LLM inference and serving engine."
    )
    parser.add_argument("--version", action="version", version=f"tallow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    plugins = sub.add_parser("plugins", help="inspect the plugin distributions")
    plugins_sub = plugins.add_subparsers(dest="action", metavar="ACTION")
    plugins_sub.required = True
    listing = plugins_sub.add_parser(
        "list",
        help="every plugin found: version, status (ok, failed, disabled, or broken: "
        "a registered target does not resolve), components registered",
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.add_argument(
        "--import-components",
        action="store_true",
        help="import every registered component instead of only finding its "
        "module:attr target (slower, imports torch; also catches a missing "
        "dependency)",
    )
    listing.add_argument(
        "--check-tools",
        action="store_true",
        help="also start the tool providers (connect to the configured MCP "
        "servers, say) and report the state and tools of each source",
    )
    add_config_arguments(listing)
    listing.set_defaults(func=cmd_plugins_list)

    config = sub.add_parser("config", help="inspect the configuration")
    config_sub = config.add_subparsers(dest="action", metavar="ACTION")
    config_sub.required = True
    show = config_sub.add_parser(
        "show", help="the effective configuration (flags > env > file > defaults)"
    )
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    add_config_arguments(show)
    show.set_defaults(func=cmd_config_show)

    chosen = _first_positional(argv)
    for name, (module, summary) in EXTERNAL_COMMANDS.items():
        if name == chosen:
            importlib.import_module(module).add_parser(sub)
        elif _module_exists(module):
            # a placeholder for --help; running the command imports the real parser above
            sub.add_parser(name, help=summary, add_help=False)
    return parser


# ---------------------------------------------------------------------------------------------
# tallow plugins list
# ---------------------------------------------------------------------------------------------
def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def cmd_plugins_list(args: argparse.Namespace) -> int:
    from tallow.config import load_config
    from tallow.plugin.manager import load_plugins
    from tallow.plugin.naming import kind_of, kind_order

    config = load_config(args)
    pm = load_plugins(config.plugins)
    pm.check_targets(import_them=args.import_components)  # a typo in a target: "broken"
    statuses = pm.statuses()
    checked = _check_tools(pm, config) if args.check_tools else None
    if args.json:
        rows = [s.to_dict() for s in statuses]
        for row in rows:
            row["kind"] = kind_of(row["name"])
            if checked is not None:
                row["tool_providers"] = [p for p in checked if p["distribution"] == row["name"]]
        print(json.dumps(rows, indent=2))
        return 0
    table = [["NAME", "VERSION", "STATUS", "MODE", "COMPONENTS / REASON"]]
    groups: list[int] = []  # the row index where each kind's group starts
    previous = ""
    for s in sorted(statuses, key=lambda s: (kind_order(kind_of(s.name)), s.name)):
        if kind_of(s.name) != previous:
            previous = kind_of(s.name)
            groups.append(len(table))
        detail = "; ".join(
            f"{kind}: {', '.join(_labels(pm, kind, names))}" for kind, names in s.components.items()
        )
        table.append(
            [
                s.name,
                s.version or "?",
                s.status,
                s.mode or "-",
                s.reason if s.status != "ok" else (detail or "(none)"),
            ]
        )
    lines = _table(table).split("\n")
    for start in reversed(groups):  # a heading and a blank line before each kind's rows
        lines[start:start] = ["", f"{kind_of(table[start][0])}:"]
    print("\n".join(lines))
    if checked is not None:
        print()
        print(_tools_table(checked))
    return 0


def _labels(pm: PluginManager, kind: str, names: list[str]) -> list[str]:
    """Component names as listed: KV codecs with their bits per element."""
    if kind == "kv_codec":
        return [pm.registries.kv_codecs.label(name) for name in names]
    return names


def _check_tools(pm: PluginManager, config: TallowConfig) -> list[dict[str, Any]]:
    from tallow.server.tool_providers import check_tool_providers

    pm.hook.tallow_configure(config=config)  # plugins validate their settings here
    return check_tool_providers(pm, config)


def _tools_table(providers: list[dict[str, Any]]) -> str:
    """One row per source of each tool provider: its state and tools, or why it is down."""
    rows = [["TOOL PROVIDER", "SOURCE", "STATE", "TOOLS / REASON"]]
    for provider in providers:
        sources = provider.get("status", {}).get("sources") or [{}]
        for source in sources:
            state = source.get("state") or ("running" if provider["running"] else "failed")
            if state == "up":
                detail = ", ".join(source.get("tool_names") or [])
            elif source:
                detail = source.get("error", "")
            else:  # a provider that does not describe sources
                detail = provider.get("error") or ", ".join(
                    t["function"]["name"] for t in provider["tools"]
                )
            rows.append([provider["name"], source.get("name", "-"), state, detail or "(none)"])
    if len(rows) == 1:
        return "no tool provider is configured"
    return _table(rows)


# ---------------------------------------------------------------------------------------------
# tallow config show
# ---------------------------------------------------------------------------------------------
def cmd_config_show(args: argparse.Namespace) -> int:
    import os

    import yaml

    from tallow.config import dump_config, load_config
    from tallow.plugin.manager import ENV_PLUGINS

    data = dump_config(load_config(args))
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    if ENV_PLUGINS in os.environ:
        print(
            f"# {ENV_PLUGINS}={os.environ[ENV_PLUGINS]!r} decides which plugins load "
            "(plugins.autoload/enable/disable are not consulted)"
        )
    print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    return 0


# ---------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tallow`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    from tallow.config import ConfigError
    from tallow.plugin import ModelFileError, PluginError

    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="tallow: %(levelname)s: %(message)s")
    try:
        parser = build_parser(argv)
    except ImportError as exc:
        command = _first_positional(argv)
        print(f"tallow: the {command!r} command is not available: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], Any] | None = getattr(args, "func", None)
    if func is None:
        parser.error(f"the {args.command!r} command does not say what to run")
    try:
        return int(func(args) or 0)
    except ConfigError as exc:
        print(f"tallow: {exc}", file=sys.stderr)
        return 2
    except (PluginError, ModelFileError) as exc:  # a damaged model names file and field
        print(f"tallow: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

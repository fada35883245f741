"""Command-line flags for every setting, generated from the config models.

Every flag defaults to None ("not given"), so a flag overrides the environment and the file only
when it is on the command line. Flags store into ``"<section>.<field>"`` destinations, which
:func:`read_args` turns back into a settings layer.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any, Iterator

from pydantic.fields import FieldInfo

from .models import SECTIONS
from .sources import Layer, field_kind

CONFIG_DEST = "config"


def setting_flags() -> Iterator[tuple[str, str, str | None, FieldInfo]]:
    """``(section, field, flag or None, FieldInfo)`` for every setting, in model order.

    The flag is ``--<field-name>`` unless the field names another (or None: no flag).
    """
    for section, model in SECTIONS.items():
        for name, info in model.model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            flag = extra.get("flag", "--" + name.replace("_", "-"))
            assert flag is None or isinstance(flag, str), f"{section}.{name}: flag {flag!r}"
            yield section, name, flag, info


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--config`` and one flag per setting to ``parser`` (grouped by section); return it.

    Pass the parsed namespace to :func:`tallow.config.load_config` as ``args``.
    """
    parser.add_argument(
        "--config",
        dest=CONFIG_DEST,
        metavar="PATH",
        default=None,
        help="YAML config file (default: $TALLOW_CONFIG, else none). Flags override the "
        "environment, which overrides the file.",
    )
    groups: dict[str, Any] = {}
    for section, name, flag, info in setting_flags():
        if flag is None:
            continue
        group = groups.get(section)
        if group is None:
            doc = (SECTIONS[section].__doc__ or "").strip().splitlines()[0]
            group = groups[section] = parser.add_argument_group(f"{section} settings", doc)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        default = info.get_default(call_default_factory=True)
        shown = "" if extra.get("secret") else f" (default: {default!r})"
        help_text = (info.description or "").replace("%", "%%") + shown
        kwargs: dict[str, Any] = {"dest": f"{section}.{name}", "default": None, "help": help_text}
        kind, _ = field_kind(info.annotation)
        if kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kind == "list":
            kwargs["action"] = "append"
            kwargs["metavar"] = extra.get("metavar", "VALUE")
            kwargs["help"] = help_text + "; repeat the flag for several"
        elif typing.get_origin(info.annotation) is typing.Literal:
            # choices are checked by the model (one error format, case rules), shown here
            kwargs["metavar"] = "{" + ",".join(map(str, typing.get_args(info.annotation))) + "}"
        else:
            kwargs["metavar"] = extra.get("metavar", name.upper())
        group.add_argument(flag, **kwargs)
    return parser


def read_args(args: argparse.Namespace | None) -> Layer:
    """The settings given on the command line (flags left at None are not given)."""
    layer = Layer("command line")
    if args is None:
        return layer
    given = vars(args)
    for section, name, flag, _ in setting_flags():
        if flag is None:
            continue
        value = given.get(f"{section}.{name}")
        if value is not None:
            layer.set((section, name), value, f"flag {flag}")
    return layer

"""The keyword arguments of the Python API (``LLM(...)``, ``AsyncEngine.create(...)``), derived
from the config models, so that every setting is a keyword and none is listed by hand.

- Every field of the sections in :data:`FLAT_SECTIONS` is a keyword of its own name
  (``max_num_seqs=``, ``kv_codec=``, ``tokenizer=``, ``port=``), unless the field names another
  in ``json_schema_extra={"keyword": ...}`` (``model=`` is ``model.source``).
- Every section whose name is not already a keyword takes a mapping or an instance of its model:
  ``plugins={"disable": ["tallow-mcp-client"]}`` or ``plugins=PluginsConfig(autoload=False)`` (only the
  fields given to the instance count, so the others stay with the lower sources),
  ``logging=...``, and also ``cache=``, ``scheduler=``, ``runner=``, ``server=``.

A keyword whose value is None is not given: the setting comes from the lower sources (the
environment, the file, the defaults), as with a command-line flag that is left out.
:func:`tallow.config.load_config` takes these keywords as its highest layer.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import Problem
from .models import SECTIONS
from .sources import Layer

#: sections whose fields are keywords of their own (the others are keywords as a whole)
FLAT_SECTIONS: tuple[str, ...] = ("model", "cache", "scheduler", "runner", "parallel", "server")

#: keywords the Python API takes besides the settings (see :class:`tallow.LLM`)
RESERVED: tuple[str, ...] = ("config", "plugin_manager")


@dataclass(frozen=True)
class Keyword:
    """One keyword argument: the setting ``section.field`` it gives (``field`` None: the whole
    section, as a mapping or a section model)."""

    name: str
    section: str
    field: str | None = None

    @property
    def setting(self) -> str:
        return self.section if self.field is None else f"{self.section}.{self.field}"


def _derive() -> dict[str, Keyword]:
    keywords: dict[str, Keyword] = {}

    def add(keyword: Keyword) -> None:
        clash = keywords.get(keyword.name)
        if clash is not None or keyword.name in RESERVED:
            # two settings may not share a keyword: fix the models (a "keyword" override)
            raise RuntimeError(
                f"keyword {keyword.name!r} would mean both {keyword.setting} and "
                f"{clash.setting if clash else 'a reserved argument'}"
            )
        keywords[keyword.name] = keyword

    for section in FLAT_SECTIONS:
        for name, info in SECTIONS[section].model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            add(Keyword(str(extra.get("keyword", name)), section, name))
    for section in SECTIONS:
        if section not in keywords:
            add(Keyword(section, section))
    return keywords


#: keyword name → the setting it gives, for every keyword
KEYWORDS: dict[str, Keyword] = _derive()


def unknown_keyword_error(name: str, caller: str) -> TypeError:
    """A TypeError naming ``name`` and the keywords (or nested settings) it may have meant."""
    suggestions = [repr(k) for k in difflib.get_close_matches(name, list(KEYWORDS), n=3)]
    for section, model in SECTIONS.items():
        if section not in FLAT_SECTIONS and name in model.model_fields:
            suggestions.append(f"{section}={{{name!r}: ...}}")
    message = f"{caller} got an unexpected keyword argument {name!r}"
    if suggestions:
        return TypeError(f"{message}; did you mean {' or '.join(suggestions)}?")
    return TypeError(
        f"{message}; the keywords are the settings of docs/configuration.md: "
        + ", ".join(sorted(KEYWORDS))
    )


def _section_values(keyword: Keyword, value: object) -> Mapping[str, Any] | None:
    model = SECTIONS[keyword.section]
    if isinstance(value, model):
        return value.model_dump(exclude_unset=True)
    return value if isinstance(value, Mapping) else None


def read_keywords(values: Mapping[str, Any], caller: str = "LLM()") -> Layer:
    """The settings given as keyword arguments of ``caller``.

    Raises TypeError for a keyword that is not a setting, or a setting given twice (by its own
    keyword and inside its section's); a value of the wrong shape is a problem of the layer,
    reported with the other configuration problems.
    """
    layer = Layer(f"{caller} keywords")
    for name, value in values.items():
        keyword = KEYWORDS.get(name)
        if keyword is None:
            raise unknown_keyword_error(name, caller)
        if value is None:
            continue
        origin = f"{caller} keyword {name}"
        if keyword.field is not None:
            _set_once(layer, (keyword.section, keyword.field), value, origin, caller)
            continue
        body = _section_values(keyword, value)
        if body is None:
            layer.problems.append(
                Problem(
                    keyword.section,
                    f"got {type(value).__name__}, expected a mapping of keys to "
                    f"values or a {SECTIONS[keyword.section].__name__}",
                    origin,
                )
            )
            continue
        for field_name, field_value in body.items():
            _set_once(layer, (keyword.section, str(field_name)), field_value, origin, caller)
    return layer


def _set_once(layer: Layer, key: tuple[str, str], value: object, origin: str, caller: str) -> None:
    if key in layer.values:
        raise TypeError(
            f"{caller} got {'.'.join(key)} twice: from {layer.origins[key]} and from {origin}"
        )
    layer.set(key, value, origin)

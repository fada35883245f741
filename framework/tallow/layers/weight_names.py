"""Declarative maps from checkpoint tensor names to model parameters.

A model declares, per naming scheme (``"hf"``, ``"gguf"``), an ordered list of
:class:`WeightRule`. A rule's ``source`` is a template in which ``{name}`` matches one dotted
component (``[^.]+``) and is substituted into ``target``::

    WeightRule("model.layers.{i}.self_attn.q_proj.{kind}",
               "model.layers.{i}.self_attn.qkv_proj.{kind}", shard="q")

The first rule whose source matches the whole name wins. A rule may also

- name a ``transform``: a method of the model called as ``transform(tensor, groups)`` before
  loading (GGUF's Q/K row permutation is undone this way). A transform that only moves whole
  rows (dim 0) says so with ``rowwise=True``; it then applies to the rows of bytes of a
  still-quantized tensor (:class:`~tallow.layers.QuantizedWeight`), which is otherwise
  dequantized before any transform;
- name a ``handler`` instead of a target: a method called as ``handler(tensor, groups)`` that
  consumes the tensor itself (GGUF's ``rope_freqs``);
- have neither target nor handler: the tensor is known and deliberately skipped.

A ``shard`` may itself use the source's fields, as a string or a tuple of strings: per-expert
tensors of a mixture of experts load into one stacked parameter with
``shard=("{e}", "gate")``, which :attr:`WeightMatch.shard` fills in (``("3", "gate")``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Hashable, Iterable

_FIELD = re.compile(r"\{(\w+)\}")


class WeightLoadError(ValueError):
    """A checkpoint does not fit the model: missing, unexpected or mis-shaped tensors."""


@dataclass(frozen=True)
class WeightRule:
    """One checkpoint-name pattern and where its tensors go (see the module docstring)."""

    source: str
    target: str | None = None
    shard: Hashable | None = None
    transform: str | None = None
    handler: str | None = None
    rowwise: bool = False

    def __post_init__(self) -> None:
        if self.target is not None and self.handler is not None:
            raise ValueError(f"weight rule {self.source!r}: give a target or a handler, not both")
        used = _FIELD.findall(self.target or "") + _FIELD.findall(
            " ".join(_shard_texts(self.shard))
        )
        unknown = set(used) - set(_FIELD.findall(self.source))
        if unknown:
            raise ValueError(
                f"weight rule {self.source!r}: target {self.target!r} uses "
                f"{sorted(unknown)} that the source does not capture"
            )


def _shard_texts(shard: Hashable | None) -> list[str]:
    if isinstance(shard, str):
        return [shard]
    if isinstance(shard, tuple):
        return [s for s in shard if isinstance(s, str)]
    return []


@dataclass(frozen=True)
class WeightMatch:
    """Where one checkpoint tensor goes."""

    rule: WeightRule
    groups: dict[str, str]

    @property
    def target(self) -> str | None:
        if self.rule.target is None:
            return None
        return _FIELD.sub(lambda m: self.groups[m.group(1)], self.rule.target)

    @property
    def shard(self) -> Hashable | None:
        """The rule's shard with the source's fields filled in."""
        shard = self.rule.shard
        if isinstance(shard, str):
            return self._fill(shard)
        if isinstance(shard, tuple):
            return tuple(self._fill(s) if isinstance(s, str) else s for s in shard)
        return shard

    def _fill(self, template: str) -> str:
        return _FIELD.sub(lambda m: self.groups[m.group(1)], template)

    @property
    def ignored(self) -> bool:
        return self.rule.target is None and self.rule.handler is None


@dataclass
class WeightNameMap:
    """An ordered list of :class:`WeightRule`, compiled once."""

    rules: list[WeightRule]
    _compiled: list[tuple[re.Pattern[str], WeightRule]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._compiled = [(self._compile(r.source), r) for r in self.rules]

    @staticmethod
    def _compile(template: str) -> re.Pattern[str]:
        parts: list[str] = []
        last = 0
        for m in _FIELD.finditer(template):
            parts.append(re.escape(template[last : m.start()]))
            parts.append(f"(?P<{m.group(1)}>[^.]+)")
            last = m.end()
        parts.append(re.escape(template[last:]))
        return re.compile("".join(parts))

    def match(self, name: str) -> WeightMatch | None:
        """The first rule matching ``name`` entirely, or None when no rule knows it."""
        for pattern, rule in self._compiled:
            m = pattern.fullmatch(name)
            if m:
                return WeightMatch(rule, m.groupdict())
        return None

    def __add__(self, other: "WeightNameMap | Iterable[WeightRule]") -> "WeightNameMap":
        extra = other.rules if isinstance(other, WeightNameMap) else list(other)
        return WeightNameMap([*self.rules, *extra])

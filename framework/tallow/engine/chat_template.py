"""Rendering chat templates: Jinja2 in a sandbox, with the globals chat templates expect.

Chat templates ship with models and are untrusted code. They run in Jinja's
``ImmutableSandboxedEnvironment`` (no attribute access to internals, no mutation of inputs), and
everything they see is rebuilt from plain JSON types first. The environment matches what the
Hugging Face ecosystem renders templates with, so a template renders byte for byte as it does
there:

- ``trim_blocks`` and ``lstrip_blocks``; the ``loopcontrols`` extension (``break``/``continue``);
  a ``{% generation %}`` block tag (rendered as its body);
- ``tojson`` that does not escape HTML and keeps non-ASCII text (``ensure_ascii=False``), with
  ``indent``, ``separators`` and ``sort_keys``;
- globals ``raise_exception(message)``, ``strftime_now(format)``, ``dict(...)`` and a
  ``namespace`` that refuses underscore-prefixed attributes;
- variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special tokens
  (``bos_token``, ``eos_token``, ...) and any extra keyword the caller passes.

Every failure (syntax, ``raise_exception``, sandbox violation, a type error inside the template)
becomes a :class:`ChatTemplateError`, a ``ValueError`` saying what went wrong.

A render is bounded in time: every call, attribute or item access, ``range`` item, ``*`` and
``**`` a template evaluates counts as a step, and past ``time_limit_s`` the render stops with
:class:`ChatTemplateTimeout` (nested loops over ``range`` or runaway macro recursion cannot
hang the caller). ``*`` may not build a string or list over :data:`MAX_REPEAT_ITEMS` items, and
``**`` takes no exponent over 1000.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Callable

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

# Names a message's reasoning may come under; templates read ``reasoning_content`` (most) or
# ``thinking`` (gpt-oss), so both are filled from whichever the caller used.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


#: seconds a render may take unless the caller says otherwise
DEFAULT_TIME_LIMIT_S = 5.0
#: the most items ``*`` may build (a string's characters, a list's items)
MAX_REPEAT_ITEMS = 1 << 20
_CHECK_EVERY = 256  # steps between two reads of the clock


class ChatTemplateError(ValueError):
    """A chat template that cannot be compiled or rendered for the given messages."""


class ChatTemplateTimeout(ChatTemplateError):
    """A render that ran past its time limit (and was stopped)."""


class _Budget(threading.local):
    """The deadline of the render running on this thread (renders run on worker threads)."""

    deadline = float("inf")
    limit_s = DEFAULT_TIME_LIMIT_S
    steps = 0


_budget = _Budget()


def _step() -> None:
    _budget.steps += 1
    if _budget.steps % _CHECK_EVERY == 0 and time.monotonic() > _budget.deadline:
        raise ChatTemplateTimeout(
            f"the chat template did not finish rendering within "
            f"{_budget.limit_s:g} s and was stopped"
        )


class _CountedRange:
    """``range(...)`` for templates: each item taken counts as a step."""

    def __init__(self, *args: int) -> None:
        self._range = safe_range(*args)

    def __iter__(self) -> Any:  # Any: an iterator of ints
        for item in self._range:
            _step()
            yield item

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: Any) -> Any:  # Any: an int or a slice, as range takes
        return self._range[index]


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every call, access and repetition counted against the deadline."""

    intercepted_binops = frozenset({"*", "**"})

    def call(
        __self,
        __context: Any,
        __obj: Any,
        *args: Any,
        **kwargs: Any,  # noqa: N805 - the sandbox's own signature; Any: template values
    ) -> Any:  # Any: whatever the template calls returns
        _step()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:  # Any: template values
        _step()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:  # Any: template values
        _step()
        return super().getitem(obj, argument)

    def call_binop(
        self,
        context: Any,
        operator: str,
        left: Any,
        right: Any,  # Any: template values
    ) -> Any:  # Any: the operation's result
        _step()
        if operator == "**":
            if isinstance(right, (int, float)) and abs(right) > 1000:
                raise jinja2.exceptions.SecurityError(
                    "a chat template may not raise to a power over 1000"
                )
            return left**right
        for seq, times in ((left, right), (right, left)):
            if (
                isinstance(seq, (str, list, tuple))
                and isinstance(times, int)
                and len(seq) * times > MAX_REPEAT_ITEMS
            ):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template may not repeat a sequence to over {MAX_REPEAT_ITEMS} items"
                )
        return left * right


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}``: marks assistant text for training masks.

    Serving needs only the text, so the block renders its body unchanged.
    """

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:  # Any: jinja2's Parser is untyped
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Callable[[], str]) -> str:
        return caller()


class _SafeNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses attributes starting with ``_``."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's own signature trick; Any: keyword values of templates, any Python value
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:  # Any: a template sets any value
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:  # Any: a name a template passes, checked here
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not set the underscore-prefixed attribute {name!r} on a "
                "namespace"
            )


class _SafeDict:
    """``dict(...)`` for templates, without exposing the ``dict`` type itself."""

    def __call__(
        self, *args: Any, **kwargs: Any
    ) -> dict[Any, Any]:  # Any: dict()'s own arguments, from templates
        return dict(*args, **kwargs)

    def fromkeys(
        self, *args: Any, **kwargs: Any
    ) -> dict[Any, Any]:  # Any: dict.fromkeys' own arguments, from templates
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,  # Any: any value a template serializes
    separators: Any = None,
    sort_keys: bool = False,
) -> str:  # Any: json.dumps' separators as templates pass them
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile ``source`` once (cached by its text) in the sandboxed environment."""
    if not isinstance(source, str):
        raise ChatTemplateError(f"a chat template must be a string, got {type(source).__name__}")
    env = _BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _SafeDict()
    env.globals["namespace"] = _SafeNamespace
    env.globals["range"] = _CountedRange
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"the chat template does not compile: {exc.message} (line {exc.lineno})"
        ) from None


def plain(value: Any) -> Any:  # Any: any value, rebuilt from JSON types
    """``value`` rebuilt from JSON types only (dicts, lists, str, int, float, bool, None).

    Pydantic models and dataclasses become dicts; anything else becomes an inert placeholder
    string ``"<TypeName>"``, so that no object with methods reaches the template.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        return plain(item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return plain(dump())
    return f"<{type(value).__name__}>"


def normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Messages as plain dicts, top-level keys whose value is None dropped (templates test for a
    missing key, not for None), and reasoning aliased under every name templates read."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, message in enumerate(messages):
        message = plain(message)
        if not isinstance(message, dict):
            raise ChatTemplateError(
                f"messages[{i}] must be a dict with 'role' and 'content', "
                f"got {type(message).__name__}"
            )
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next(
            (message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render_chat_template(
    template: str,
    messages: Sequence[Any],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    special_tokens: Mapping[str, Any] | None = None,
    time_limit_s: float | None = None,
    **template_kwargs: Any,  # Any: extra template variables, any value
) -> str:
    """Render ``template`` for ``messages``.

    ``tools`` are OpenAI-style JSON schemas (``{"type": "function", "function": {...}}``);
    ``special_tokens`` (``bos_token``, ``eos_token``, ...) become template variables, and
    ``template_kwargs`` are passed on as variables too (they win over special tokens).
    ``continue_final_message`` leaves the last message open (no end-of-turn after it) so that
    generation continues it; it excludes ``add_generation_prompt``.
    ``time_limit_s`` bounds the render (default :data:`DEFAULT_TIME_LIMIT_S`).
    Raises :class:`ChatTemplateError` on any failure, :class:`ChatTemplateTimeout` past the
    time limit.
    """
    if not messages:
        raise ChatTemplateError("messages is empty: a chat needs at least one message")
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError(
            "continue_final_message and add_generation_prompt exclude each "
            "other: continue the last message, or start a new one"
        )
    if tools is not None:
        if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
            raise ChatTemplateError("tools must be a list of JSON-schema dicts")
        for i, tool in enumerate(tools):
            if not isinstance(tool, Mapping):
                raise ChatTemplateError(
                    f"tools[{i}] must be a JSON-schema dict, got {type(tool).__name__}"
                )
    if documents is not None:
        for i, doc in enumerate(documents):
            if not isinstance(doc, Mapping):
                raise ChatTemplateError(f"documents[{i}] must be a dict with 'title' and 'text'")
    compiled = compile_template(template)
    chat = normalize_messages(messages)
    final = None
    if continue_final_message:
        final = chat[-1].get("content")
        if not isinstance(final, str):
            raise ChatTemplateError(
                "continue_final_message needs the last message's content to be a string"
            )
        chat[-1] = {**chat[-1], "content": final + _CONTINUE_TAG}
    variables = {
        **{k: v for k, v in (special_tokens or {}).items() if v is not None},
        **plain(template_kwargs),
    }
    limit = DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    _budget.limit_s, _budget.deadline = limit, time.monotonic() + limit
    try:
        rendered = compiled.render(
            messages=chat,
            tools=plain(tools),
            documents=plain(documents),
            add_generation_prompt=bool(add_generation_prompt),
            **variables,
        )
    except ChatTemplateError:
        raise
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(
            f"the chat template did something unsafe and was stopped: {exc}"
        ) from None
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"the chat template failed: {exc}") from None
    except (
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
        ZeroDivisionError,
        OverflowError,
        RecursionError,
    ) as exc:
        raise ChatTemplateError(
            f"the chat template failed on these messages: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        _budget.deadline = float("inf")
    if final is not None:
        rendered = _cut_at_continue_tag(rendered, final)
    return rendered


def _cut_at_continue_tag(rendered: str, final: str) -> str:
    at = rendered.rfind(_CONTINUE_TAG.strip())
    if at < 0 or final.strip() not in rendered:
        raise ChatTemplateError(
            "continue_final_message: the chat template does not render the "
            "last message's content verbatim, so it cannot be continued"
        )
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    # The template trimmed trailing whitespace after the content.
    return rendered[:at].rstrip()


__all__ = [
    "ChatTemplateError",
    "ChatTemplateTimeout",
    "compile_template",
    "render_chat_template",
    "normalize_messages",
    "plain",
]

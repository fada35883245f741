"""Tool-call parsing: the contract (model text → OpenAI ``tool_calls``) and shared machinery.

The contract is :class:`ToolParser`: ``parse(text, tools)`` for a whole response and
``stream(tools)`` for an incremental :class:`StreamingToolParser` whose deltas, put together
with :func:`assemble`, equal ``parse``'s result for any split of the text into chunks.

Most parsers are *markup* parsers: ordinary text interrupted by call regions that begin at an
opening marker (``<tool_call>``, ``[TOOL_CALLS]``, ...). :class:`MarkupToolParser` runs the text
through :class:`MarkupStream`, which owns everything the formats share — holding back text that
might be the start of a marker, skipping code fences and ``<think>`` blocks, keeping content
exact, numbering calls — and asks a format's :class:`CallRegion` only one question: what does the
region that starts here turn out to be?

Rules every markup parser gets from the machinery:

- A call is emitted once its markup is complete and valid, as one :class:`ToolCallDelta`
  carrying index, id, name and the whole arguments text; a client therefore never receives
  arguments that later prove malformed.
- Markup never leaks into content; text inside ```` ``` ```` fences or ``<think>`` blocks is never a
  call; markup that turns out malformed (bad JSON, unknown tool, unclosed at the end) is content,
  character for character.
- When a response has calls, content is the non-call text with trailing whitespace removed (None
  if nothing is left); without calls, content is the text exactly.
- Arguments are a JSON object serialized compactly with ``ensure_ascii=False``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, NamedTuple

from .components import Component
from .json_schema import SchemaProblem, check_schema, schema_errors

# The JSON helpers live in .json_text; formats import them from here, where the plugin API
# offers them.
from .json_text import JsonSpan as JsonSpan
from .json_text import bracket_opens as bracket_opens
from .json_text import compact_json as compact_json
from .json_text import loads_strict as loads_strict
from .json_text import match_literal as match_literal
from .json_text import skip_ws as skip_ws

if TYPE_CHECKING:  # pragma: no cover
    from .registry import Entry, Registry

log = logging.getLogger("tallow.plugin")


def new_call_id() -> str:
    """A fresh OpenAI-style call id (``call_`` and 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


# ---------------------------------------------------------------------------------------------
# The contract
# ---------------------------------------------------------------------------------------------
@dataclass
class ToolCall:
    """One complete call: ``arguments`` is JSON text, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)


@dataclass
class ParseResult:
    """Text left for ``content`` (None if nothing but calls) and the calls found."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ToolCallDelta:
    """A piece of the call at ``index``: the first piece carries id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class StreamDelta:
    """What one chunk of model text adds: plain content and/or tool-call pieces (in order)."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


class StreamingToolParser:
    """Incremental parser for one response. ``feed`` each text delta, then ``finish`` once."""

    def feed(self, text: str) -> StreamDelta:
        raise NotImplementedError

    def finish(self) -> StreamDelta:
        raise NotImplementedError


class ToolParser(Component):
    """Finds tool calls in model output.

    ``matches`` decides automatic selection from the model name and chat template (the highest
    ``priority`` parser that matches is used); ``parse`` handles a whole response; ``stream``
    returns a fresh :class:`StreamingToolParser` whose deltas, assembled, equal ``parse``'s
    result. ``tools`` is the request's OpenAI tool list; None or empty means any tool name is
    accepted, otherwise a call to a tool not in the list is content. Markup never leaks into
    content; text inside code fences or ``<think>`` is not taken for a call; malformed markup
    degrades to plain content.

    ``call_opening`` is the text that opens one call in the model's trained format when a JSON
    object ``{"name": ..., "arguments": ...}`` follows it (``"<tool_call>\\n"`` for hermes); the
    server prefixes it when it forces a call. Empty when the format has no such opening.
    ``call_closing`` is the text that ends such a call (``"\\n</tool_call>"`` for hermes; empty
    when the object's end is the call's end): a call whose JSON object was constrained by a
    grammar is written ``call_opening + object + call_closing`` and parsed by the parser.

    ``reads_special_tokens`` says that the format's markup consists of the tokenizer's special
    tokens (harmony's ``<|call|>``, say): the server then keeps them in the text it gives the
    parser (it skips them otherwise).
    """

    priority: ClassVar[int] = 0
    reads_special_tokens: ClassVar[bool] = False
    call_opening: ClassVar[str] = ""
    call_closing: ClassVar[str] = ""

    @classmethod
    def matches(cls, model_name: str, chat_template: str | None) -> bool:
        return False

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        raise NotImplementedError

    def stream(self, tools: list[dict[str, Any]] | None = None) -> StreamingToolParser:
        raise NotImplementedError


def choose_tool_parser(
    registry: "Registry", model_name: str, chat_template: str | None, name: str | None = "auto"
) -> "Entry":
    """The parser named ``name``, or else (``"auto"``/None) the highest-priority parser whose
    ``matches(model_name, chat_template)`` is true: :func:`tallow.plugin.select` with the match
    as its check, so a parser that cannot be imported is passed over with its reason. The
    choice is logged.

    Raises :class:`tallow.plugin.SelectionError` for an unknown or unusable name, or when
    nothing matches.
    """
    from .selection import SelectionError, select

    if name and name != "auto":
        try:
            return select(registry, None, name)
        except SelectionError as exc:
            raise SelectionError(f"server.tool_parser: {exc}") from None
    try:
        return select(registry, None, check=template_match(model_name, chat_template))
    except SelectionError:
        known = ", ".join(registry.names()) or "none is registered"
        raise SelectionError(
            f"no tool parser matches model {model_name!r} and its chat "
            f"template (registered: {known}); name one with "
            "server.tool_parser" + registry.missing_hint()
        ) from None


def template_match(model_name: str, chat_template: str | None) -> "Callable[[Entry], list[str]]":
    """A :func:`tallow.plugin.select` check: a tool parser serves when it ``matches`` the model
    name and chat template (a parser that raises gives its error as the reason)."""

    def check(entry: "Entry") -> list[str]:
        try:
            fits = bool(entry.load().matches(model_name, chat_template))
        except Exception as exc:  # a broken parser plugin must not stop the others
            return [f"matches() failed: {type(exc).__name__}: {exc}"]
        return [] if fits else [f"does not match model {model_name!r} and its chat template"]

    return check


def assemble(deltas: Iterable[StreamDelta]) -> ParseResult:
    """Put stream deltas together into the :class:`ParseResult` they describe.

    Calls are ordered by index; a call's id and name come from its first delta, its arguments
    are the concatenation of all its argument pieces. Content is None when calls exist and no
    content was sent. Raises ValueError when a call's first delta has no name.
    """
    pieces: list[str] = []
    calls: dict[int, ToolCall] = {}
    for delta in deltas:
        pieces.append(delta.content)
        for part in delta.tool_calls:
            call = calls.get(part.index)
            if call is None:
                if not part.name:
                    raise ValueError(
                        f"tool_calls[{part.index}]: the first delta of a call must carry its name"
                    )
                calls[part.index] = ToolCall(part.name, part.arguments, part.id or new_call_id())
            else:
                call.arguments += part.arguments
    ordered = [calls[i] for i in sorted(calls)]
    content = "".join(pieces)
    return ParseResult(content if content or not ordered else None, ordered)


# ---------------------------------------------------------------------------------------------
# Tools and validation
# ---------------------------------------------------------------------------------------------
def _json_type(value: object) -> str:
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    return "null" if value is None else kinds.get(type(value), "a number")


def tool_schemas(
    tools: list[dict[str, Any]] | None, *, check: bool = True
) -> dict[str, dict[str, Any]]:
    """Map each tool name to the JSON Schema of its arguments.

    Accepts OpenAI tools (``{"type": "function", "function": {"name", "parameters"}}``) and bare
    function definitions (``{"name", "parameters"}``). A missing ``parameters`` means any JSON
    object. With ``check``, every schema is also checked against its JSON Schema metaschema.
    Raises ValueError naming the field (``tools[1].function.name``) and what was expected.
    """
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise ValueError(f"tools: expected a list of tool definitions, got {_json_type(tools)}")
    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ValueError(f"{where}: expected an object, got {_json_type(tool)}")
        fn = tool
        if "function" in tool or "type" in tool:
            if tool.get("type", "function") != "function":
                raise ValueError(f"{where}.type: expected 'function', got {tool.get('type')!r}")
            inner, where = tool.get("function"), where + ".function"
            if not isinstance(inner, dict):
                raise ValueError(f"{where}: expected an object, got {_json_type(inner)}")
            fn = inner
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name: expected a non-empty string, got {name!r}")
        if name in out:
            raise ValueError(f"{where}.name: the tool name {name!r} appears twice")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object"}
        if not isinstance(params, dict):
            raise ValueError(
                f"{where}.parameters: expected a JSON Schema object, got {_json_type(params)}"
            )
        if check:
            try:
                check_schema(params)
            except SchemaProblem as exc:
                raise ValueError(f"{where}.parameters: {exc}") from None
        out[name] = params
    return out


def validate_tool_call(call: ToolCall, tools: list[dict[str, Any]]) -> list[str]:
    """The reasons ``call`` is not a valid call of one of ``tools`` (empty when it is).

    Reasons: an unknown tool name, arguments that are not JSON or not a JSON object, and every
    violation of the tool's ``parameters`` JSON Schema (``arguments.unit: 'K' is not one of
    ['C', 'F']``). Malformed ``tools`` raise ValueError (see :func:`tool_schemas`).
    """
    schemas = tool_schemas(tools)
    if call.name not in schemas:
        known = ", ".join(sorted(schemas)) or "none"
        return [f"unknown tool {call.name!r} (tools: {known})"]
    try:
        args = loads_strict(call.arguments)
    except ValueError as exc:
        return [f"arguments: not valid JSON ({exc})"]
    if not isinstance(args, dict):
        return [f"arguments: expected a JSON object, got {_json_type(args)}"]
    return schema_errors(schemas[call.name], args, root="arguments", schema_name=call.name)


class ToolSet:
    """The request's tools as a parser needs them: which names exist, and their schemas."""

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self.schemas = tool_schemas(tools, check=False)

    def known(self, name: str) -> bool:
        """True when ``name`` may be called: any name if no tools were given."""
        return not self.schemas or name in self.schemas

    def parameters(self, name: str) -> dict[str, Any]:
        """The JSON Schema of ``name``'s arguments; empty when unknown."""
        return self.schemas.get(name, {})


# ---------------------------------------------------------------------------------------------
# Calls read from JSON
# ---------------------------------------------------------------------------------------------
class FoundCall(NamedTuple):
    """A call a region found: name, decoded arguments, and the model's own id if it gave one."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None


def call_from_json(
    obj: object, argument_keys: tuple[str, ...] = ("arguments", "parameters")
) -> FoundCall | None:
    """Read ``{"name": ..., "arguments": {...}}`` (or an alias key); None when ``obj`` is not one.

    Arguments may be missing (``{}``) or a string holding a JSON object; keys other than the
    name, one arguments key, ``"type": "function"`` and ``"id"`` mean the object is not a call.
    """
    if not isinstance(obj, dict) or not set(obj) <= {"name", "type", "id", *argument_keys}:
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name or obj.get("type", "function") != "function":
        return None
    present = [key for key in argument_keys if key in obj]
    if len(present) > 1:
        return None
    args = obj[present[0]] if present else {}
    if isinstance(args, str):
        try:
            args = loads_strict(args)
        except ValueError:
            return None
    return FoundCall(name, args) if isinstance(args, dict) else None


# ---------------------------------------------------------------------------------------------
# Markup machinery
# ---------------------------------------------------------------------------------------------
@dataclass
class Decision:
    """What a call region turned out to be.

    The first ``consumed`` characters of the region are either the ``calls`` or, when ``calls``
    is None, plain content; scanning resumes after them.
    """

    consumed: int
    calls: list[FoundCall] | None = None


class CallRegion:
    """Reads one stretch of call markup, from its opening marker on. One instance per region.

    ``decide(text, final)`` is called with everything from the opener on (the text only grows
    between calls) and returns None while the region is undecided. Contract: the answer depends
    on the text alone, never on how it arrived — a Decision given for some text is the one any
    longer text would get — and with ``final`` (the response is over) it always decides.
    """

    def __init__(self, opener: str, tools: ToolSet) -> None:
        self.opener = opener
        self.tools = tools

    def decide(self, text: str, final: bool) -> Decision | None:
        raise NotImplementedError

    def malformed(self, at: int = 0) -> Decision:
        """The markup is not a call: it is content up to ``at`` (at least the opener)."""
        return Decision(max(at, len(self.opener)))

    def pending(self, final: bool) -> Decision | None:
        """Undecided: wait for more text, or, at the end of the response, content."""
        return self.malformed() if final else None

    def accept(self, consumed: int, calls: list[FoundCall]) -> Decision:
        """The first ``consumed`` characters are ``calls``, unless one names an unknown tool."""
        if not calls or not all(self.tools.known(c.name) for c in calls):
            return self.malformed()
        return Decision(consumed, calls)


FENCE, THINK_OPEN, THINK_CLOSE = "```", "<think>", "</think>"
_TEXT, _FENCE, _THINK, _REGION = range(4)


def _earliest(buf: str, markers: list[str], final: bool) -> tuple[int, str | None]:
    """Where the first marker starts in ``buf`` and which one it is.

    Returns ``(p, None)`` when no marker is complete: ``buf[p:]`` may still become one (hold it
    back), or ``p == len(buf)``. At the end of the response nothing is held back.
    """
    best, found = len(buf), None
    for m in markers:
        k = buf.find(m, 0, best + len(m) - 1)
        if k != -1 and (k < best or (k == best and len(m) > len(found or ""))):
            best, found = k, m
    if not final:
        longest = max(map(len, markers))
        for p in range(max(0, len(buf) - longest + 1), best):
            tail = buf[p:]
            if any(m.startswith(tail) for m in markers):
                return p, None
    return best, found


class MarkupStream(StreamingToolParser):
    """The streaming half of :class:`MarkupToolParser`; see the module docstring for the rules.

    ``openers`` start a call region anywhere in ordinary text; ``anchored`` ones only as the
    first non-whitespace of the response (a leading ``<think>`` block aside).
    """

    def __init__(
        self,
        openers: dict[str, type[CallRegion]],
        anchored: dict[str, type[CallRegion]],
        tools: list[dict[str, Any]] | None,
    ) -> None:
        self._tools = ToolSet(tools)
        self._openers, self._anchored = openers, anchored
        self._markers = [*openers, FENCE, THINK_OPEN]
        self._buf = ""
        self._mode = _TEXT
        self._region: CallRegion | None = None
        self._region_text = ""
        self._at_start = True
        self._ws = ""  # trailing whitespace held back: dropped if only calls follow it
        self._calls = 0
        self._out = StreamDelta()
        self._finished = False

    def feed(self, text: str) -> StreamDelta:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        if self._finished:
            raise RuntimeError("feed() after finish(): a stream parser reads one response")
        self._buf += text
        return self._run(final=False)

    def finish(self) -> StreamDelta:
        if self._finished:
            raise RuntimeError("finish() was already called")
        self._finished = True
        out = self._run(final=True)
        if self._ws and not self._calls:
            out.content += self._ws
        self._ws = ""
        return out

    # -- the scanning loop --------------------------------------------------------------
    def _run(self, final: bool) -> StreamDelta:
        self._out = StreamDelta()
        while self._step(final):
            pass
        return self._out

    def _step(self, final: bool) -> bool:
        """Advance once; False when nothing more can be decided now."""
        if self._mode == _REGION:
            return self._step_region(final)
        if not self._buf:
            return False
        if self._mode == _TEXT:
            return self._step_text(final)
        closer = FENCE if self._mode == _FENCE else THINK_CLOSE
        k = self._buf.find(closer)
        if k < 0:
            p, _ = _earliest(self._buf, [closer], final)
            self._content(self._buf[:p])
            self._buf = self._buf[p:]
            return False
        self._content(self._buf[: k + len(closer)])
        self._buf = self._buf[k + len(closer) :]
        self._mode = _TEXT
        return True

    def _step_text(self, final: bool) -> bool:
        marker: str | None
        buf = self._buf
        if self._at_start and self._anchored:
            rest = buf.lstrip(" \t\r\n")
            self._content(buf[: len(buf) - len(rest)])
            self._buf = buf = rest
            if not rest:
                return False
            for marker, region in self._anchored.items():
                if rest.startswith(marker):
                    return self._open(marker, region)
            if not final and any(m.startswith(rest) for m in self._anchored):
                return False
            if not rest.startswith(THINK_OPEN) and (final or not THINK_OPEN.startswith(rest)):
                self._at_start = False
        p, marker = _earliest(buf, self._markers, final)
        self._content(buf[:p])
        self._buf = buf = buf[p:]
        if marker is None:
            if final:
                self._content(buf)
                self._buf = ""
            return False
        if marker in self._openers:
            return self._open(marker, self._openers[marker])
        self._mode = _FENCE if marker == FENCE else _THINK
        self._content(marker)
        self._buf = buf[len(marker) :]
        return True

    def _open(self, marker: str, region: type[CallRegion]) -> bool:
        self._region = region(marker, self._tools)
        self._region_text = ""
        self._mode = _REGION
        return True

    def _step_region(self, final: bool) -> bool:
        assert self._region is not None
        self._region_text += self._buf
        self._buf = ""
        text = self._region_text
        decision = self._region.decide(text, final)
        if decision is None:
            if not final:
                return False
            decision = self._region.malformed()
        if not 0 < decision.consumed <= len(text):
            raise RuntimeError(
                f"{type(self._region).__name__}.decide consumed {decision.consumed} characters "
                f"of a {len(text)}-character region; expected 1..{len(text)}"
            )
        self._mode, self._region, self._region_text = _TEXT, None, ""
        self._at_start = False
        if decision.calls is None:
            self._content(text[: decision.consumed])
        else:
            for call in decision.calls:
                self._out.tool_calls.append(
                    ToolCallDelta(
                        self._calls,
                        call.id or new_call_id(),
                        call.name,
                        compact_json(call.arguments),
                    )
                )
                self._calls += 1
        self._buf = text[decision.consumed :]
        return True

    def _content(self, text: str) -> None:
        if not text:
            return
        if self._mode != _THINK and not text.isspace():
            self._at_start = False
        held = self._ws + text
        body = held.rstrip()
        self._out.content += body
        self._ws = held[len(body) :]


class MarkupToolParser(ToolParser):
    """A parser for a markup format: declare ``openers`` (and ``anchored_openers``) mapping a
    marker to the :class:`CallRegion` that reads the markup it opens; parsing, streaming and
    every shared rule come from :class:`MarkupStream`.
    """

    openers: ClassVar[dict[str, type[CallRegion]]] = {}
    anchored_openers: ClassVar[dict[str, type[CallRegion]]] = {}

    def stream(self, tools: list[dict[str, Any]] | None = None) -> MarkupStream:
        return MarkupStream(self.openers, self.anchored_openers, tools)

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        stream = self.stream(tools)
        return assemble([stream.feed(text), stream.finish()])

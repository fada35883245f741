"""Tool calling: the ``tools`` of a request, ``tool_choice``, and reading calls out of the output.

- The server's parsers are chosen once (:mod:`.parsers`): a primary parser, and fallbacks that
  read a response in which the primary finds no call.
- ``tool_choice: "none"`` (or no tools) renders no tools into the prompt and parses nothing.
- ``"auto"`` renders the tools and parses the output with the parsers.
- ``"required"`` / a named function: with a grammar backend the output is constrained to one
  call valid against the tool's parameters, streamed as it is written (id and name first, then
  the arguments in pieces); without one, a call's start is appended to the generation prompt
  and one call is read out of the continuation (:mod:`.forced`).
- Every call is validated against its tool (``validate_tool_call``: a known name, arguments a
  JSON object valid against the tool's ``parameters`` schema). A response whose calls do not all
  validate is returned as plain content: the model's exact text.
- While streaming, plain content flows as soon as every parser has let it through; tool calls
  (and anything after the first sign of one) are sent when the response is complete and
  validated, as OpenAI ``tool_calls`` deltas. The assembled stream therefore equals the
  non-streaming answer, and markup never reaches ``content``.
- ``parallel_tool_calls: false`` keeps the first call only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from tallow.plugin import GrammarSpec
from tallow.plugin.json_schema import SchemaProblem, check_schema
from tallow.plugin.tool_parsing import (
    StreamDelta,
    StreamingToolParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
)

from .errors import invalid, unsupported
from .forced import CallStream, ForcedCallScanner, call_schema, steering_prefix

if TYPE_CHECKING:
    from .parsers import ToolParsing

log = logging.getLogger("tallow.server")

_FN_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# ---------------------------------------------------------------------------------------------
# Request checks
# ---------------------------------------------------------------------------------------------
def validate_tools(tools: Sequence[object]) -> list[dict[str, Any]]:
    """Check the ``tools`` of a request; 400 naming the first bad field."""
    seen: set[str] = set()
    checked: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(at, f"Invalid value for {at!r}: expected a tool object.")
        kind = tool.get("type", "function")
        if kind != "function":
            raise unsupported(
                f"{at}.type", f"tools of type {kind!r} are not implemented; use 'function'"
            )
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise invalid(
                f"{at}.function",
                f"Missing required parameter: '{at}.function'.",
                code="missing_required_parameter",
            )
        name = fn.get("name")
        if not isinstance(name, str) or not _FN_NAME.match(name):
            raise invalid(
                f"{at}.function.name",
                f"Invalid value for '{at}.function.name': "
                "expected 1-64 characters of a-z, A-Z, 0-9, '_' or '-', got "
                f"{name!r}.",
            )
        if name in seen:
            raise invalid(
                f"{at}.function.name",
                f"Invalid value for '{at}.function.name': the tool name {name!r} is given twice.",
            )
        seen.add(name)
        params = fn.get("parameters")
        if params is not None:
            try:
                check_schema(params)
            except SchemaProblem as exc:
                raise invalid(
                    f"{at}.function.parameters",
                    f"Invalid value for '{at}.function.parameters': {exc}.",
                ) from None
        checked.append(tool)
    return checked


def tool_name(tool: dict[str, Any]) -> str:
    name: str = tool["function"]["name"]  # a string once validate_tools has checked it
    return name


@dataclass
class ToolPlan:
    """How one request uses tools: ``mode`` is none, auto, required or named."""

    mode: str = "none"
    tools: list[dict[str, Any]] | None = None
    name: str | None = None
    parallel: bool = True
    parser_cls: type[ToolParser] | None = None
    fallback_cls: tuple[type[ToolParser], ...] = ()
    opening: str = ""
    closing: str = ""
    #: a forced call is constrained by a grammar (the server has a grammar backend)
    constrained: bool = False

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")

    @property
    def prompt_tools(self) -> list[dict[str, Any]] | None:
        """The tools rendered into the prompt (none when tool_choice is none)."""
        return self.tools if self.mode != "none" else None

    @property
    def prompt_suffix(self) -> str:
        """Text appended to the generation prompt (the opening of a constrained call, or the
        start of a steered one)."""
        if self.forced and self.constrained:
            return self.opening
        if self.mode == "required":
            return steering_prefix(None, self.opening)
        if self.mode == "named":
            return steering_prefix(self.name, self.opening)
        return ""

    def call_spec(self) -> GrammarSpec:
        """The grammar of a constrained forced call."""
        return GrammarSpec.json_schema(call_schema(self.tools or [], self.name))

    def choice(self, stream_calls: bool = False) -> "ChoiceTools":
        """Fresh tool state for one of the ``n`` choices; ``stream_calls``: an ``auto`` stream
        sends its first call's deltas as the call is written (a caller that needs whole calls
        from ``finish``, such as the server-side tool loop, leaves it off)."""
        if self.mode == "auto":
            return AutoTools(self, stream_calls)
        if self.forced:
            return ConstrainedCall(self) if self.constrained else ForcedTools(self)
        return NoTools()


def plan_tools(
    tools: list[dict[str, Any]] | None,
    tool_choice: str | Mapping[str, object] | None,
    parallel: bool | None,
    parsing: ToolParsing,
    constrain: bool = False,
) -> ToolPlan:
    """Resolve ``tools``/``tool_choice``/``parallel_tool_calls`` of a chat request, given the
    server's :class:`~tallow.server.parsers.ToolParsing`; ``constrain`` says that forced calls
    can be constrained by a grammar."""
    parser_cls = getattr(parsing, "parser", None)
    if tools is not None and len(tools) == 0:
        tools = None
    if tools is not None:
        validate_tools(tools)
    names = {tool_name(t) for t in tools} if tools else set()
    named: str | None = None
    if tool_choice is None:
        mode = "auto" if tools else "none"
    elif isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise invalid(
                "tool_choice",
                "Invalid value for 'tool_choice': expected 'none', "
                f"'auto', 'required' or a named function, got {tool_choice!r}.",
            )
        mode = tool_choice
    else:
        kind = tool_choice.get("type")
        if kind == "allowed_tools":
            raise unsupported(
                "tool_choice", "'allowed_tools' is not implemented; restrict 'tools' instead"
            )
        fn = tool_choice.get("function")
        if kind != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(
                "tool_choice",
                "Invalid value for 'tool_choice': expected "
                "{'type': 'function', 'function': {'name': ...}}.",
            )
        mode, named = "named", fn["name"]
        if named not in names:
            raise invalid(
                "tool_choice.function.name",
                "Invalid value for "
                f"'tool_choice.function.name': no tool named {named!r} in 'tools'.",
            )
    if mode in ("required", "named") and not tools:
        raise invalid("tool_choice", f"'tool_choice' {mode!r} needs a non-empty 'tools' list.")
    if mode == "auto" and tools and parser_cls is None:
        raise invalid(
            "tools",
            "Tool calling is not available: no tool parser matches the "
            "served model; start the server with --tool-parser NAME.",
            code="tool_parser_unavailable",
        )
    opening = str(getattr(parser_cls, "call_opening", "") or "") if parser_cls else ""
    closing = str(getattr(parser_cls, "call_closing", "") or "") if opening else ""
    fallbacks = tuple(cls for _, cls in getattr(parsing, "fallbacks", ()))
    return ToolPlan(
        mode=mode,
        tools=tools,
        name=named,
        parallel=parallel is not False,
        parser_cls=parser_cls,
        fallback_cls=fallbacks,
        opening=opening,
        closing=closing,
        constrained=constrain,
    )


# ---------------------------------------------------------------------------------------------
# Per-choice output handling
# ---------------------------------------------------------------------------------------------
def _validate(calls: list[ToolCall], tools: list[dict[str, Any]]) -> list[str]:
    from tallow.plugin.tool_parsing import validate_tool_call

    reasons: list[str] = []
    for call in calls:
        reasons += [f"{call.name}: {r}" for r in validate_tool_call(call, tools)]
    return reasons


def _content_or_none(text: str | None) -> str | None:
    return text if text and text.strip() else None


@dataclass
class Final:
    """A choice's message: content (None when only calls) and its tool calls."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


class ChoiceTools:
    """Turns one choice's text into content and tool calls, whole or as stream deltas."""

    #: true once the output holds everything the response needs (a forced call is closed)
    complete: bool = False
    #: tool-call deltas have been sent while streaming (the choice ends with "tool_calls")
    sent_calls: bool = False
    #: the output stopped inside a call (its finish reason is "length")
    truncated: bool = False

    def feed(self, text: str) -> StreamDelta:
        raise NotImplementedError

    def finish(self) -> list[StreamDelta]:
        raise NotImplementedError

    def final(self, text: str) -> Final:
        raise NotImplementedError


class NoTools(ChoiceTools):
    def feed(self, text: str) -> StreamDelta:
        return StreamDelta(content=text)

    def finish(self) -> list[StreamDelta]:
        return []

    def final(self, text: str) -> Final:
        return Final(text)


class AutoTools(ChoiceTools):
    """``tool_choice: auto``: the primary parser, then the fallbacks, read the output.

    The answer is decided on the whole text (:meth:`final`), so a stream ends exactly as the
    whole response would. While streaming, content is released only as far as every parser has
    released it as plain content; from the first sign of a call, nothing more is released until
    the end.
    """

    def __init__(self, plan: ToolPlan, stream_calls: bool = False) -> None:
        self.plan = plan
        assert plan.parser_cls is not None  # "auto" with tools needs a parser (plan_tools)
        self.parsers = [plan.parser_cls(), *(cls() for cls in plan.fallback_cls)]
        self.streams: list[StreamingToolParser] | None = None
        self.content = [""] * len(self.parsers)  # content each stream has released
        self.text = ""
        self.released = ""
        self.holding = False
        #: the first call, streamed as it is written (see :class:`LiveCall`); None: not
        #: streaming calls, or no call opened yet
        self.live: LiveCall | None = None
        self.stream_calls = stream_calls and bool(plan.opening)

    def feed(self, text: str) -> StreamDelta:
        self.text += text
        if self.holding:
            return self._live()
        if self.streams is None:
            self.streams = [p.stream(self.plan.tools) for p in self.parsers]
        for k, stream in enumerate(self.streams):
            delta = stream.feed(text)
            self.content[k] += delta.content
            if delta.tool_calls:
                self.holding = True
        if self.holding or (
            self.stream_calls and self.plan.opening in self.text[len(self.released) :]
        ):
            self.holding = True
            return self._live()
        safe = min(len(c) for c in self.content)
        if any(not c.startswith(self.content[0][:safe]) for c in self.content):
            self.holding = True  # the parsers disagree on the content: wait for the end
            return StreamDelta()
        out = self.content[0][len(self.released) : safe]
        self.released += out
        return StreamDelta(content=out)

    def _live(self) -> StreamDelta:
        """The deltas of the first call while it is written, once its opening markup and a
        name of the request's tools are seen; nothing otherwise (held to the end)."""
        if not self.stream_calls:
            return StreamDelta()
        if self.live is None:
            start = self.text.find(self.plan.opening, len(self.released))
            if start < 0:
                return StreamDelta()
            self.live = LiveCall(start, start + len(self.plan.opening))
        deltas = self.live.feed(self.text[: self._call_end()])
        if not self.sent_calls and self.live.stream.name is not None:
            names = {tool_name(t) for t in self.plan.tools or []}
            if self.live.stream.name not in names:  # not a call to offer: decide at the end
                self.stream_calls = False
                return StreamDelta()
        if deltas and self.live.stream.name is not None:
            self.sent_calls = True
            return StreamDelta(tool_calls=deltas)
        return StreamDelta()

    def _call_end(self) -> int:
        """Where the live call's text ends: at the closing markup, or before an end of the
        output that may be the start of it."""
        assert self.live is not None
        closing = self.plan.closing
        if not closing:
            return len(self.text)
        end = self.text.find(closing, self.live.body)
        if end >= 0:
            return end
        for k in range(min(len(closing) - 1, len(self.text)), 0, -1):
            if self.text.endswith(closing[:k]):
                return len(self.text) - k
        return len(self.text)

    def finish(self) -> list[StreamDelta]:
        if self.sent_calls:
            return self._finish_live()
        final = self.final(self.text)
        rest = final.content or ""
        if rest.startswith(self.released):
            rest = rest[len(self.released) :]
        elif self.released.startswith(rest):
            rest = ""  # the parser trimmed trailing whitespace that was already sent
        out = [StreamDelta(content=rest)] if rest else []
        out += [
            StreamDelta(tool_calls=[ToolCallDelta(i, id=c.id, name=c.name, arguments=c.arguments)])
            for i, c in enumerate(final.tool_calls)
        ]
        return out

    def _finish_live(self) -> list[StreamDelta]:
        """The end of a stream whose first call was sent as it came: the content not yet
        released, and the calls after the first (whole) when the parsers read them."""
        assert self.live is not None
        self.truncated = not self.live.stream.closed
        final = self.final(self.text)
        first = final.tool_calls[0] if final.tool_calls else None
        if first is not None and first.name == self.live.stream.name:
            rest, later = final.content or "", final.tool_calls[1:]
        else:  # the parsers do not read the streamed call: the text before it is the content
            rest, later = self.text[: self.live.start].rstrip(), []
        if rest.startswith(self.released):
            rest = rest[len(self.released) :]
        elif self.released.startswith(rest):
            rest = ""
        out = [StreamDelta(content=rest)] if rest else []
        out += [
            StreamDelta(tool_calls=[ToolCallDelta(i, id=c.id, name=c.name, arguments=c.arguments)])
            for i, c in enumerate(later, start=1)
        ]
        return out

    def final(self, text: str) -> Final:
        for parser in self.parsers:
            result = parser.parse(text, self.plan.tools)
            if not result.tool_calls:
                continue
            calls = list(result.tool_calls)[: None if self.plan.parallel else 1]
            reasons = _validate(calls, self.plan.tools or [])
            if reasons:
                log.info("tool calls returned as content: %s", "; ".join(reasons))
                return Final(text)
            return Final(_content_or_none(result.content), calls)
        return Final(text)


class LiveCall:
    """The first call of an ``auto`` output, read as it is written: the JSON object after the
    parser's call opening (``{"name": ..., "arguments": {...}}``) through a
    :class:`CallStream`, its arguments sent with the whitespace outside strings left out, so
    the pieces add up to the compact arguments text a whole response holds."""

    def __init__(self, start: int, body: int) -> None:
        self.start = start  # where the opening markup starts in the output
        self.body = body  # where the call's object may start
        self.stream = CallStream()
        self._fed = body
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> list[ToolCallDelta]:
        new = text[self._fed :]
        self._fed = len(text)
        if not self.stream.text:
            new = new.lstrip()
        out = []
        for delta in self.stream.feed(new):
            if delta.arguments:
                delta = ToolCallDelta(
                    delta.index,
                    id=delta.id,
                    name=delta.name,
                    arguments=self._compact(delta.arguments),
                )
                if not delta.arguments and delta.name is None:
                    continue
            out.append(delta)
        return out

    def _compact(self, piece: str) -> str:
        kept = []
        for ch in piece:
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch.isspace():
                continue
            kept.append(ch)
        return "".join(kept)


class ForcedTools(ChoiceTools):
    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.scanner = ForcedCallScanner(plan.name, plan.opening)
        self._checked: tuple[ToolCall | None] | None = None  # the call, validated once done

    @property
    def complete(self) -> bool:  # type: ignore[override]
        # Only a valid call ends the generation early; anything else runs to its end and is
        # returned as content.
        return self.scanner.done and self._call() is not None

    def _call(self) -> ToolCall | None:
        if not self.scanner.done:
            return None
        if self._checked is None:
            call = self.scanner.result()
            reasons = _validate([call], self.plan.tools or []) if call is not None else []
            if reasons:
                log.info("forced tool call returned as content: %s", "; ".join(reasons))
            self._checked = (call if call is not None and not reasons else None,)
        return self._checked[0]

    def feed(self, text: str) -> StreamDelta:
        self.scanner.feed(text)
        return StreamDelta()  # held until the call is complete and validated

    def finish(self) -> list[StreamDelta]:
        call = self._call()
        if call is None:
            return [StreamDelta(content=self.scanner.raw)]
        return [
            StreamDelta(
                tool_calls=[ToolCallDelta(0, id=call.id, name=call.name, arguments=call.arguments)]
            )
        ]

    def final(self, text: str) -> Final:
        # The output was fed while it streamed in; feed what has not been seen yet.
        if len(text) > len(self.scanner.text):
            self.scanner.feed(text[len(self.scanner.text) :])
        call = self._call()
        if call is None:
            return Final(self.scanner.raw)
        return Final(None, [call])


class ConstrainedCall(ChoiceTools):
    """A forced call under a grammar: the output is one call's JSON object (see
    :mod:`.forced`). While streaming, its deltas are sent as the object grows; the whole
    response has the same call, read by the server's tool parsers from the output in the
    model's markup (``call_opening`` + object + ``call_closing``), with the arguments as the
    model wrote them (which the stream's pieces add up to)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.stream = CallStream()

    def feed(self, text: str) -> StreamDelta:
        deltas = self.stream.feed(text)
        if deltas:
            self.sent_calls = True
        return StreamDelta(tool_calls=deltas)

    def finish(self) -> list[StreamDelta]:
        self.truncated = self.stream.name is not None and not self.stream.closed
        return []  # every piece was sent as it came

    def final(self, text: str) -> Final:
        if len(text) > len(self.stream.text):
            self.feed(text[len(self.stream.text) :])
        call = self.stream.call()
        if call is None:  # cut off before the name was complete
            return Final(text)
        self.truncated = not self.stream.closed
        if not self.truncated:
            self._check_with_parsers(call)
        return Final(None, [call])

    def _check_with_parsers(self, call: ToolCall) -> None:
        """Read the call back through the tool parsers, as the model's markup; they must find
        this call (a grammar and a parser that disagree would be a bug worth a log line)."""
        import json

        markup = self.plan.opening + self.stream.text + self.plan.closing
        for cls in (self.plan.parser_cls, *self.plan.fallback_cls):
            if cls is None:
                continue
            found = cls().parse(markup, self.plan.tools).tool_calls
            if found:
                same = found[0].name == call.name and json.loads(found[0].arguments) == json.loads(
                    call.arguments
                )
                if not same:
                    log.warning(
                        "the tool parser reads the constrained call %r as %r", call, found[0]
                    )
                return
        log.warning("no tool parser reads the constrained call %r", markup)

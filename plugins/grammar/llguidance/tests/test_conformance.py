"""tallow's grammar-backend suite on the llguidance backend."""

from __future__ import annotations

from tallow.plugin.testing import GrammarBackendConformance


class TestLLGuidanceBackend(GrammarBackendConformance):
    distribution = "tallow-grammar-llguidance"
    component = "llguidance"
    refused_schemas = [
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "properties.a.not"),
        (
            {
                "anyOf": [
                    {"type": "string"},
                    {"type": "object", "properties": {"when": {"type": "string", "format": "iri"}}},
                ]
            },
            "anyOf[1].properties.when.format",
        ),
        (
            {
                "$defs": {"code": {"type": "string", "pattern": "^(?!x)[a-z]+$"}},
                "$ref": "#/$defs/code",
            },
            "$defs.code.pattern",
        ),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
        ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}, "contains"),
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
        (
            {
                "type": "object",
                "properties": {
                    "t": {
                        "type": "array",
                        "prefixItems": [{"type": "integer"}],
                        "additionalItems": False,
                    }
                },
            },
            "properties.t.additionalItems",
        ),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames"),
        # a schema's own options must not switch off the refusals
        (
            {"x-guidance": {"lenient": True}, "type": "object", "dependentRequired": {"a": ["b"]}},
            "dependentRequired",
        ),
    ]


class TestLLGuidanceAnyWhitespace(TestLLGuidanceBackend):
    settings = {"any_whitespace": True, "parallel_rows": 2}

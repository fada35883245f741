"""tallow's grammar-backend suite on the xgrammar backend."""

from __future__ import annotations

from tallow.plugin.testing import GrammarBackendConformance


class TestXGrammarBackend(GrammarBackendConformance):
    distribution = "tallow-grammar-xgrammar"
    component = "xgrammar"
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
    ]

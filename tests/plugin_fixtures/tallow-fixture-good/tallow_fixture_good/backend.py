"""Components of the fixture plugin; loaded only when a test asks for them."""

from tallow.plugin import AttentionBackend, ToolParser


class FixtureBackend(AttentionBackend):
    name = "fixture-attn"

    @classmethod
    def validate(cls, config) -> list[str]:
        # serves only when named explicitly, so it never wins automatic selection by accident
        if config.runner.attention_backend != "fixture-attn":
            return ["fixture-attn serves only when named"]
        return []


class FixtureParser(ToolParser):
    name = "fixture-parser"

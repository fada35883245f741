"""The Qwen3-Coder XML parser against tallow's tool-parser conformance suite."""

from __future__ import annotations

from tallow.plugin.testing import ToolParserConformance


def call(name: str, args: dict[str, str]) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


class TestQwen3CoderConformance(ToolParserConformance):
    distribution = "tallow-tool-qwen3-coder"
    component = "qwen3_coder"
    examples = [
        (
            call("write_file", {"path": "a.py", "content": "print('hi')\n"}),
            [("write_file", {"path": "a.py", "content": "print('hi')\n"})],
        ),
        (
            "I will list it.\n" + call("ls", {"dir": "東京 😀"}) + "\n" + call("ls", {}),
            [("ls", {"dir": "東京 😀"}), ("ls", {})],
        ),
    ]

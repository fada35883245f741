"""Chat template rendering: identical to transformers' renderer on templates that use every
feature, and safe against templates that try to escape the sandbox."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest

from tallow.engine.chat_template import ChatTemplateError, render_chat_template

FEATURES = r"""
{%- set ns = namespace(count=0, last_role='') -%}
{{ bos_token }}
{%- for message in messages %}
  {%- if message.role == 'skip' %}{% continue %}{% endif %}
  {%- if loop.index > 20 %}{% break %}{% endif %}
  {%- set ns.count = ns.count + 1 %}
  <{{ message.role }}>{{ message.content | trim }}
  {%- if message.tool_calls is defined %}
    {%- for call in message.tool_calls %} CALL {{ call.function | tojson }}{% endfor %}
  {%- endif %}
  {%- if message.reasoning_content is defined %} [think:{{ message.reasoning_content }}]{% endif %}
  {%- if loop.last %} (last of {{ loop.length }}){% endif %}
  {{ eos_token }}
{% endfor %}
{%- if tools %}TOOLS {{ tools | tojson(indent=2) }}
{{ tools[0] | tojson(separators=(',', ':'), sort_keys=true) }}{% endif %}
{%- if documents %}{% for d in documents %}DOC {{ d.title }}: {{ d.text }}
{% endfor %}{% endif %}
{%- set d = dict(a=1, b='x') %}{{ d | tojson }} {{ dict.fromkeys(['k'], 0) | tojson }}
{%- if extra_flag is defined %} flag={{ extra_flag }}{% endif %}
{%- if add_generation_prompt %}<assistant>{% generation %}{% endgeneration %}{% endif %}
{{ ns.count }}
"""

MESSAGES = [
    {"role": "system", "content": "  Be brief — «ok» <b>bold</b> & 'quotes'  "},
    {"role": "skip", "content": "ignored"},
    {"role": "user", "content": "日本語 🎉"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"x": "é", "y": [1, 2.5]}}}
        ],
    },
    {"role": "assistant", "content": "answer", "reasoning": "because", "name": None},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "description": "<tag> & ü",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
DOCS = [{"title": "T1", "text": "first"}, {"title": "T2", "text": "second"}]
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def _transformers_render(template, messages, **kwargs):
    from transformers.utils.chat_template_utils import render_jinja_template

    add_generation_prompt = kwargs.pop("add_generation_prompt", False)
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    rendered, _ = render_jinja_template(
        conversations=[[{k: v for k, v in m.items() if v is not None} for m in messages]],
        tools=tools,
        documents=documents,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return rendered[0]


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("with_tools", [True, False])
def test_features_render_like_transformers(gen, with_tools):
    kwargs = dict(
        add_generation_prompt=gen,
        tools=TOOLS if with_tools else None,
        documents=DOCS,
        extra_flag=True,
    )
    ours = render_chat_template(FEATURES, MESSAGES, special_tokens=SPECIALS, **kwargs)
    ref = _transformers_render(FEATURES, MESSAGES, **SPECIALS, **kwargs)
    assert ours == ref
    assert "«ok» <b>bold</b>" in ours and "日本語 🎉" in ours  # tojson keeps text as it is
    assert '"x": "é"' in ours


def test_continue_final_message_like_transformers():
    template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n"
        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    messages = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi, I am"}]
    ours = render_chat_template(template, messages, continue_final_message=True)
    ref = _transformers_render(template, messages, continue_final_message=True)
    assert ours == ref == "<user>Say hi</user>\n<assistant>Hi, I am"
    with pytest.raises(ChatTemplateError, match="exclude each other"):
        render_chat_template(
            template, messages, continue_final_message=True, add_generation_prompt=True
        )


def test_strftime_now():
    before = datetime.now().strftime("%Y-%m-%d")
    out = render_chat_template("{{ strftime_now('%Y-%m-%d') }}", [{"role": "user", "content": ""}])
    assert out in {before, datetime.now().strftime("%Y-%m-%d")}  # a midnight in between


def test_objects_are_reduced_to_plain_data():
    @dataclasses.dataclass
    class Msg:
        role: str
        content: str

    class Weird:
        def __repr__(self) -> str:
            return "WEIRD"

    out = render_chat_template(
        "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ x }}",
        [Msg("user", "hi"), {"role": "assistant", "content": "yo"}],
        x=Weird(),
    )
    assert out == "user:hi;assistant:yo;<Weird>"


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ raise_exception.__globals__['__builtins__'] }}",
        "{% set x = namespace() %}{% set x._private = 1 %}{{ x }}",
        "{{ messages.append({'role': 'x'}) }}",
        "{{ cycler.__init__.__globals__.os }}",
    ],
)
def test_sandbox_refuses_escapes(template):
    with pytest.raises(ChatTemplateError) as info:
        render_chat_template(template, [{"role": "user", "content": "hi"}])
    assert isinstance(info.value, ValueError)
    assert "chat template" in str(info.value)


def test_raise_exception_message_reaches_the_caller():
    template = (
        "{% if messages[0].role != 'user' %}"
        "{{ raise_exception('Conversation must start with user') }}{% endif %}ok"
    )
    assert render_chat_template(template, [{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(ChatTemplateError, match="Conversation must start with user"):
        render_chat_template(template, [{"role": "assistant", "content": ""}])


def test_syntax_and_runtime_errors_are_value_errors():
    with pytest.raises(ChatTemplateError, match=r"does not compile.*line 1"):
        render_chat_template("{% for m in messages %}", [{"role": "user", "content": ""}])
    with pytest.raises(ChatTemplateError, match="TypeError"):
        render_chat_template("{{ messages[0].content + 1 }}", [{"role": "user", "content": "a"}])
    with pytest.raises(ChatTemplateError, match="empty"):
        render_chat_template("x", [])
    with pytest.raises(ChatTemplateError, match=r"messages\[1\]"):
        render_chat_template("x", [{"role": "user", "content": ""}, "not a dict"])
    with pytest.raises(ChatTemplateError, match=r"tools\[0\]"):
        render_chat_template("x", [{"role": "user", "content": ""}], tools=["f"])


def test_trim_and_lstrip_blocks():
    template = "start\n    {% if true %}\n    inner\n    {% endif %}\nend"
    assert (
        render_chat_template(template, [{"role": "user", "content": ""}])
        == _transformers_render(template, [{"role": "user", "content": ""}])
        == "start\n    inner\nend"
    )

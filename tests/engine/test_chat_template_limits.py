"""Chat templates render in bounded time and space: loops, macros and repetition that would
hang or exhaust the server stop with a ChatTemplateError, and ordinary templates render as
before."""

from __future__ import annotations

import time

import pytest

from tallow.engine.chat_template import ChatTemplateError, ChatTemplateTimeout, render_chat_template

MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(60) }}",
        "{% for i in range(100000) %}{% for m in messages %}{% for j in range(100000) %}"
        "{{ m.content }}{% endfor %}{% endfor %}{% endfor %}",
    ],
)
def test_a_render_past_its_time_limit_is_stopped(template: str) -> None:
    started = time.monotonic()
    with pytest.raises(ChatTemplateTimeout, match="within 0.3 s"):
        render_chat_template(template, MSGS, time_limit_s=0.3)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    "template, match",
    [
        ('{{ "a" * 1000000000 }}', "repeat a sequence"),
        ("{{ [1] * 100000000 }}", "repeat a sequence"),
        ("{{ 2 ** 100000000 }}", "power over 1000"),
    ],
)
def test_runaway_repetition_is_refused(template: str, match: str) -> None:
    with pytest.raises(ChatTemplateError, match=match):
        render_chat_template(template, MSGS)


def test_ordinary_templates_render_as_before() -> None:
    template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content * 2 }}{% endfor %}"
        "{{ range(3)|list }}{{ range(4)|length }}{{ 2 ** 3 }}{{ [0] * 2 }}"
    )
    assert render_chat_template(template, MSGS) == "<user>hihi[0, 1, 2]48[0, 0]"


def test_the_time_limit_belongs_to_one_render() -> None:
    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(ChatTemplateTimeout):
        render_chat_template(slow, MSGS, time_limit_s=0.2)
    time.sleep(0.3)  # a later render starts with a budget of its own
    assert (
        render_chat_template("{% for i in range(50000) %}{% endfor %}ok", MSGS, time_limit_s=5)
        == "ok"
    )

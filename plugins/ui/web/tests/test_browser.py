"""The chat UI in a real browser (Debian's chromium, headless, through Playwright) against a
live ``tallow serve --ui`` of the embedded default model, with an API key.

One server serves the whole module (the ``server`` fixture): the xdist group keeps these tests
on one worker. Generations are short (a few dozen tokens) so the module stays quick on a CPU.
"""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any

import pytest

from ui_fixtures import API_KEY, IMAGES, Ui, new_ui

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tallow-ui-web-browser")]

#: what the model is made to write (through the JSON-schema constraint of the real server)
XSS = "<img src=x onerror=window.pwned=1> [go](javascript:window.pwned=2)"
CODE_PROMPT = "Write a Python function add(a, b)."


def _conversations(ui: Ui) -> list[dict[str, Any]]:
    raw = ui.page.evaluate("localStorage.getItem('tallow-ui:conversations')")
    return json.loads(raw) if raw else []


def _chat_requests(ui: Ui) -> list[Any]:
    return [r for r in ui.requests if r.url.endswith("/v1/chat/completions")]


def test_api_key_is_asked_for_kept_and_sent_in_a_header(make_ui: Any) -> None:
    ui = make_ui(key=False)
    assert f"tallow: web UI at {ui.server.url}/ui/" in ui.server.log_text()
    ui.page.goto(f"{ui.server.url}/")
    assert ui.page.url == f"{ui.server.url}/ui/"
    dialog = ui.page.locator("#api-key-dialog")
    dialog.wait_for(state="visible", timeout=10_000)
    ui.page.fill("#api-key", "sk-wrong")
    ui.page.click("#api-key-form button[value=save]")
    ui.page.wait_for_function(
        "() => document.getElementById('api-key-title').textContent.includes('refused')"
    )
    assert dialog.is_visible()
    ui.page.fill("#api-key", API_KEY)
    ui.page.press("#api-key", "Enter")
    ui.page.wait_for_selector("#model option", state="attached", timeout=10_000)
    assert ui.page.input_value("#model") == "Qwen2.5-Coder-0.5B-Instruct"
    assert ui.page.evaluate("localStorage.getItem('tallow-ui:api-key')") == API_KEY

    ui.settings(**{"max-tokens": 2})
    ui.send("Hi")
    ui.wait_done()
    assert ui.answer().locator(".notice.error").count() == 0
    api = [r for r in ui.requests if "/v1/" in r.url]
    headers = [r.all_headers().get("authorization") for r in api]
    assert headers[:2] == [None, "Bearer sk-wrong"]  # the first try, then the wrong key
    assert headers[2:] and all(h == f"Bearer {API_KEY}" for h in headers[2:]), headers
    assert _chat_requests(ui)[-1].all_headers()["authorization"] == f"Bearer {API_KEY}"
    assert not any(API_KEY in r.url or "sk-wrong" in r.url for r in ui.requests)


def test_answer_streams_into_a_growing_dom_and_survives_a_reload(make_ui: Any) -> None:
    ui = make_ui().open()
    ui.settings(**{"max-tokens": 40, "temperature": 0})
    ui.send("Write two short paragraphs about the sea.")
    content = ui.answer().locator(".content")
    lengths: list[int] = []
    first_chunk_marked = False
    while ui.page.is_visible("#stop"):
        lengths.append(content.evaluate("e => e.textContent.length"))
        if not first_chunk_marked and content.locator(".md-chunk").count() > 1:
            # a chunk that is complete is never rebuilt: the mark survives the rest of the stream
            content.locator(".md-chunk").first.evaluate("e => { e.dataset.probe = 'kept'; }")
            first_chunk_marked = True
        time.sleep(0.05)
    ui.wait_done()
    growth = sorted(set(lengths))
    # (Markdown syntax is consumed as it closes, so the text may lose a character or two)
    assert len(growth) >= 4, f"the answer did not grow in the page while streaming: {lengths}"
    if first_chunk_marked:
        assert content.locator(".md-chunk").first.get_attribute("data-probe") == "kept"
    answer = content.inner_text()
    assert len(answer) > growth[0]

    ui.page.reload()
    ui.page.wait_for_selector(".message.assistant")
    assert ui.answer().locator(".content").inner_text() == answer
    assert (
        ui.page.locator(".message.user .bubble").inner_text()
        == "Write two short paragraphs about the sea."
    )
    assert ui.page.locator("#conversations .conversation").count() == 1

    # rename and delete from the list; both stick across a reload
    ui.page.click("#conversations .rename")
    ui.page.fill(".rename-input", "The sea")
    ui.page.press(".rename-input", "Enter")
    assert ui.page.locator("#conversations .open").inner_text() == "The sea"
    ui.page.reload()
    assert ui.page.locator("#conversations .open").inner_text() == "The sea"
    ui.expected_dialogs.append("delete")
    ui.page.click("#conversations .delete")
    ui.page.wait_for_selector("#conversations .conversation", state="detached")
    assert _conversations(ui) == [] and ui.page.locator(".message").count() == 0


def test_stop_aborts_the_request_and_the_server_frees_its_blocks(make_ui: Any) -> None:
    ui = make_ui().open()
    ui.settings(**{"max-tokens": 1000})
    ui.send("Count from 1 to 500, one number per line.")
    ui.page.wait_for_function(
        "() => document.querySelector('.message.assistant .content').textContent.length > 5",
        timeout=60_000,
    )
    during = ui.server.metrics()
    assert during["tallow_num_requests_running"] == 1
    assert during["tallow_kv_cache_free_blocks"] < during["tallow_kv_cache_total_blocks"]
    ui.page.click("#stop")
    ui.wait_done(timeout=10)
    assert ui.answer().locator(".notice").inner_text() == "Stopped."
    deadline = time.monotonic() + 10
    while True:
        after = ui.server.metrics()
        freed = (
            after["tallow_num_requests_running"] == 0
            and after["tallow_num_requests_waiting"] == 0
            and after["tallow_kv_cache_free_blocks"] == after["tallow_kv_cache_total_blocks"]
        )
        if freed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert freed, after
    # the stopped answer is kept, marked stopped
    saved = _conversations(ui)[0]["messages"][-1]
    assert saved["stopped"] is True and saved["content"]


def test_a_script_the_model_writes_runs_nothing(make_ui: Any) -> None:
    ui = make_ui().open()
    schema = {"type": "string", "enum": [XSS]}
    ui.settings(structured=True, schema=json.dumps(schema), **{"max-tokens": 80})
    ui.send("Say something.")
    ui.wait_done()
    body = _chat_requests(ui)[-1].post_data_json
    assert body["response_format"]["json_schema"]["schema"] == schema
    content = ui.answer().locator(".content")
    text = content.inner_text()
    assert "<img src=x onerror=window.pwned=1>" in text  # shown, as text
    assert content.locator("img, script, iframe, object, embed, svg").count() == 0
    assert content.locator("a").count() == 0  # the javascript: link is text
    assert content.locator(".unsafe-link").inner_text() == "go"
    assert ui.page.evaluate("window.pwned") is None
    assert ui.page.evaluate("window.__cspViolations || []") == []
    ui.settings(structured=False)


#: written straight into the renderer: the whole Markdown surface against what a page must
#: never hold
RENDERER_PAYLOADS = [
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "<svg onload=alert(1)>",
    '<a href="javascript:alert(1)">x</a>',
    "<iframe src=//example.com></iframe>",
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x]( javascript:alert(1))",
    "[x](java\tscript:alert(1))",
    "[x](data:text/html,<script>alert(1)</script>)",
    "[x](vbscript:msgbox(1))",
    "![i](javascript:alert(1))",
    "![i](http://example.com/a.png)",
    "<javascript:alert(1)>",
    "[x](<javascript:alert(1)>)",
    "[x](/relative)",
    '[ok](https://example.com/ "t") <mailto:a@example.com> http://example.com/"onmouseover="x',
    "**<b onmouseover=alert(1)>b</b>** _<i>i</i>_ `<code>`",
    '```"><img src=x onerror=alert(1)>\n<script>alert(1)</script>\n```',
    "| a | <img src=x onerror=alert(1)> |\n|---|:-:|\n| [x](javascript:1) | b |",
    "> <img src=x onerror=alert(1)>\n- <script>x</script>\n  1. [y](javascript:y)",
    "# <h1 onclick=alert(1)>t</h1>\n\n---\n\n[[x](javascript:1)](http://example.com)",
]


def test_the_renderer_keeps_only_safe_elements_and_links(make_ui: Any) -> None:
    ui = make_ui().open()
    report = ui.page.evaluate(
        """async (payloads) => {
        const { renderBlocks } = await import('./markdown.js');
        const allowed = new Set(['P','BR','STRONG','EM','DEL','CODE','PRE','A','SPAN','DIV',
          'BUTTON','H1','H2','H3','H4','H5','H6','HR','BLOCKQUOTE','UL','OL','LI','TABLE',
          'THEAD','TBODY','TR','TH','TD']);
        const attrs = new Set(['href','target','rel','class','type','aria-label','data-lang',
          'start','style']);
        const out = [];
        for (const text of payloads) {
          const box = document.createElement('div');
          box.append(renderBlocks(text));
          for (const e of box.querySelectorAll('*')) {
            if (!allowed.has(e.tagName)) out.push(`${text}: element ${e.tagName}`);
            for (const a of e.attributes) {
              if (!attrs.has(a.name)) out.push(`${text}: attribute ${a.name}`);
              if (a.name === 'href' && !/^(https?|mailto):/.test(a.value))
                out.push(`${text}: href ${a.value}`);
              if (a.name === 'style' && !/^text-align: (center|right);$/.test(a.value))
                out.push(`${text}: style ${a.value}`);
            }
          }
          out.push('TEXT ' + box.textContent);
          out.push('LINKS ' + [...box.querySelectorAll('a')].map((a) => a.href).join(' '));
        }
        return out;
    }""",
        RENDERER_PAYLOADS,
    )
    problems = [r for r in report if not r.startswith(("TEXT ", "LINKS "))]
    assert problems == []
    texts = "\n".join(r for r in report if r.startswith("TEXT "))
    assert "<img src=x onerror=alert(1)>" in texts and "<script>alert(1)</script>" in texts
    links = " ".join(r[6:] for r in report if r.startswith("LINKS ")).split()
    assert links == [
        "http://example.com/a.png",
        "https://example.com/",
        "mailto:a@example.com",
        "http://example.com/",
        "http://example.com/",
    ]


@pytest.fixture(scope="module")
def code_conversation(browser: Any, server: Any) -> dict[str, Any]:
    """A conversation in which the model answered with a code block: the storage state of the
    browser context that had it (also the screenshots' content)."""
    ui = new_ui(browser, server, key=True).open()
    # greedy: the model's answer is a sentence, then the function in a fenced block
    ui.settings(temperature=0, **{"max-tokens": 45})
    ui.send(CODE_PROMPT)
    ui.wait_done()
    state = ui.context.storage_state()
    errors = ui.errors
    ui.context.close()
    assert not errors, errors
    return state


def test_code_is_highlighted_and_copied(make_ui: Any, code_conversation: Any) -> None:
    ui = make_ui(
        storage_state=code_conversation, permissions=["clipboard-read", "clipboard-write"]
    ).open()
    block = ui.page.locator(".message.assistant .code-block").first
    block.wait_for()
    code = block.locator("pre code")
    assert "def add(a, b)" in code.inner_text()
    assert code.locator(".tok-keyword", has_text="def").count() >= 1
    assert code.locator(".tok-keyword", has_text="return").count() >= 1
    assert code.locator(".tok-function", has_text="add").count() >= 1
    keyword = code.locator(".tok-keyword").first.evaluate("e => getComputedStyle(e).color")
    plain = code.evaluate("e => getComputedStyle(e).color")
    assert keyword != plain  # the colours are applied, not just the classes
    block.locator("button.copy").click()
    ui.page.wait_for_function(
        "() => document.querySelector('.code-block button.copy').textContent === 'Copied'"
    )
    copied = ui.page.evaluate("navigator.clipboard.readText()")
    assert copied == code.text_content()


def test_regenerate_and_edit_and_resend(make_ui: Any) -> None:
    ui = make_ui().open()
    ui.settings(temperature=0, system="Be brief.", **{"top-p": 0.9, "max-tokens": 3})
    ui.send("Say hello.")
    ui.wait_done()
    first = _chat_requests(ui)[-1].post_data_json
    assert first["messages"][0] == {"role": "system", "content": "Be brief."}
    assert (first["temperature"], first["top_p"], first["max_tokens"]) == (0, 0.9, 3)
    assert first["model"] == "Qwen2.5-Coder-0.5B-Instruct" and first["stream"] is True
    ui.page.click(".message.assistant button.regenerate")
    ui.page.wait_for_selector("#stop", state="visible")
    ui.wait_done()
    assert ui.page.locator(".message").count() == 2
    regenerated = _chat_requests(ui)[-1].post_data_json["messages"]
    assert regenerated == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
    ]

    ui.page.click(".message.user button.edit")
    ui.page.fill(".message.user .edit-area", "Say goodbye.")
    ui.page.click(".message.user button.save")
    ui.page.wait_for_selector("#stop", state="visible")
    ui.wait_done()
    assert ui.page.locator(".message").count() == 2
    assert ui.page.locator(".message.user .bubble").inner_text() == "Say goodbye."
    assert _chat_requests(ui)[-1].post_data_json["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say goodbye."},
    ]
    saved = _conversations(ui)[0]["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"]
    assert saved[0]["content"] == "Say goodbye." and saved[1]["content"]
    # keyboard: the composer is focused after an answer, and Enter sends
    assert ui.page.evaluate("document.activeElement.id") == "prompt"


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_screenshots(make_ui: Any, code_conversation: Any, scheme: str, size: str) -> None:
    viewport = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}[
        size
    ]
    ui = make_ui(
        storage_state=code_conversation,
        color_scheme=scheme,
        viewport=viewport,
        is_mobile=size == "phone",
        has_touch=size == "phone",
    ).open()
    ui.page.wait_for_selector(".message.assistant .code-block")
    background = ui.page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == ("rgb(255, 255, 255)" if scheme == "light" else "rgb(24, 24, 27)")
    # nothing wider than the screen: no sideways scrolling on a phone
    assert ui.page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
    sidebar = ui.page.locator("#sidebar")
    assert sidebar.is_visible() == (size == "desktop")
    IMAGES.mkdir(parents=True, exist_ok=True)
    ui.page.screenshot(path=str(IMAGES / f"ui-{size}-{scheme}.png"))
    if size == "phone":  # the conversation list opens over the chat
        ui.page.click("#open-sidebar")
        sidebar.wait_for(state="visible")
        ui.page.wait_for_timeout(300)
        ui.page.keyboard.press("Escape")
        ui.page.wait_for_function("() => !document.body.classList.contains('sidebar-open')")


MARKDOWN = """# Title with `code`

Some **bold**, *em*, _em too_, ~~gone~~ and snake__case__name; a [link](https://example.com/x).
A second line.

- one
- two with `a|b`
  1. nested
  2. nested two

> quoted *text*

| name | n |
|:-----|--:|
| a    | 1 |

```python
def f(x):  # comment
    return "s" + 1
```

~~~
plain ``` inside
~~~

---

3. three
4. four
"""


def test_streamed_markdown_ends_as_rendered_whole(make_ui: Any) -> None:
    ui = make_ui().open()
    result = ui.page.evaluate(
        """async (text) => {
        const { StreamingMarkdown, renderMarkdown } = await import('./markdown.js');
        const whole = document.createElement('div');
        renderMarkdown(whole, text);
        const outs = [];
        for (let seed = 1; seed <= 20; seed++) {
          let state = seed;
          const rand = () => (state = (state * 1103515245 + 12345) % 2147483648) / 2147483648;
          const box = document.createElement('div');
          const md = new StreamingMarkdown(box);
          for (let i = 0; i < text.length;) {
            const n = 1 + Math.floor(rand() * 12);
            md.source += text.slice(i, i + n);  // as append(), rendered at once
            md.render();
            i += n;
          }
          outs.push(box.innerHTML === whole.innerHTML);
        }
        const q = (s) => [...whole.querySelectorAll(s)].map((e) => e.textContent);
        return { same: outs, h1: q('h1'), strong: q('strong'), em: q('em'), del: q('del'),
                 links: [...whole.querySelectorAll('a')].map((a) => a.href),
                 lists: [...whole.querySelectorAll('ol')].map((o) => [o.start, o.children.length]),
                 ulItems: whole.querySelectorAll('ul > li').length, quote: q('blockquote em'),
                 cells: q('td'), align: [...whole.querySelectorAll('td')].map((t) => t.style.textAlign),
                 code: q('pre code'), comment: q('.tok-comment'), string: q('.tok-string'),
                 hr: whole.querySelectorAll('hr').length, br: whole.querySelectorAll('p br').length,
                 text: whole.textContent };
    }""",
        MARKDOWN,
    )
    assert result["same"] == [True] * 20  # the incremental DOM equals the one-shot DOM
    assert result["h1"] == ["Title with code"]
    assert result["strong"] == ["bold"] and result["del"] == ["gone"]
    assert result["em"] == ["em", "em too", "text"]
    assert "snake__case__name" in result["text"]
    assert result["links"] == ["https://example.com/x"]
    assert result["lists"] == [[1, 2], [3, 2]] and result["ulItems"] == 2
    assert result["quote"] == ["text"]
    assert result["cells"] == ["a", "1"] and result["align"] == ["", "right"]
    assert result["code"] == ['def f(x):  # comment\n    return "s" + 1', "plain ``` inside"]
    assert result["comment"] == ["# comment"] and result["string"] == ['"s"']
    assert result["hr"] == 1 and result["br"] == 1


#: a stream with what the default model does not write: reasoning, a tool the server ran (with
#: its result) and a client tool call in two parts, each carrying markup
STREAM_PARTS = [
    {"role": "assistant", "reasoning_content": "Think <img src=x onerror=window.pwned=3>"},
    {"reasoning_content": " twice."},
    {
        "server_tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "provider": "mcp",
                "round": 1,
                "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'},
            }
        ]
    },
    {
        "server_tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "result": {"content": "<script>window.pwned=4</script>12:00", "is_error": False},
            }
        ]
    },
    {
        "tool_calls": [
            {
                "index": 0,
                "id": "c2",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q":'},
            }
        ]
    },
    {"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]},
    {"content": "It is noon."},
]


def test_reasoning_and_tool_calls_are_shown_as_such(make_ui: Any) -> None:
    """The page's rendering of stream fields the default model never sends, from a stream
    the browser is handed in place of the server's (the server's side of them has its own
    tests)."""
    ui = make_ui().open()
    events = (
        "".join(
            f"data: {json.dumps({'choices': [{'index': 0, 'delta': d}]})}\n\n" for d in STREAM_PARTS
        )
        + "data: [DONE]\n\n"
    )
    ui.page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=events
        ),
    )
    ui.send("What time is it?", wait_start=False)
    ui.page.wait_for_selector(".message.assistant .tool-call")
    ui.wait_done()
    answer = ui.answer()
    reasoning = answer.locator("details.reasoning")
    assert reasoning.is_visible() and reasoning.get_attribute("open") is None  # folded
    assert (
        reasoning.locator(".reasoning-text").text_content()
        == "Think <img src=x onerror=window.pwned=3> twice."
    )
    calls = answer.locator(".tool-call")
    assert calls.count() == 2
    server = calls.nth(0)
    assert server.locator(".tool-kind").inner_text() == "Tool (server)"
    assert server.locator(".tool-name").inner_text() == "get_time"
    assert server.locator(".tool-args").inner_text() == '{"tz": "UTC"}'
    assert (
        server.locator(".tool-result pre").text_content() == "<script>window.pwned=4</script>12:00"
    )
    client = calls.nth(1)
    assert client.locator(".tool-kind").inner_text() == "Tool call"
    assert client.locator(".tool-name").inner_text() == "lookup"
    assert client.locator(".tool-args").inner_text() == '{"q": "x"}'
    assert answer.locator(".content").inner_text() == "It is noon."
    assert answer.locator("img, script").count() == 0
    assert ui.page.evaluate("window.pwned") is None

    # an error answer is shown on the message, and kept
    ui.page.unroute("**/v1/chat/completions")
    ui.page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=400,
            headers={"content-type": "application/json"},
            body=json.dumps({"error": {"message": "'max_tokens' is too large", "code": None}}),
        ),
    )
    ui.send("Again", wait_start=False)
    ui.page.wait_for_selector(".message.assistant .notice.error")
    ui.wait_done()
    assert ui.answer().locator(".notice.error").inner_text() == "Error: 'max_tokens' is too large"
    assert _conversations(ui)[0]["messages"][-1]["error"] == "'max_tokens' is too large"


def test_keyboard_reaches_every_control(make_ui: Any, code_conversation: Any) -> None:
    ui = make_ui(storage_state=code_conversation).open()
    ui.page.wait_for_selector(".code-block")
    assert ui.page.evaluate("document.activeElement.id") == "prompt"  # ready to type
    seen: list[str] = []
    ui.page.evaluate("document.activeElement.blur()")
    for _ in range(30):
        ui.page.keyboard.press("Tab")
        seen.append(
            ui.page.evaluate("""() => {
            const e = document.activeElement;
            return e.id || e.className || e.tagName; }""")
        )
    for control in (
        "new-chat",
        "open",
        "icon rename",
        "icon delete",
        "model",
        "open-settings",
        "copy",
        "edit",
        "regenerate",
        "attach",
        "prompt",
        "send",
    ):
        assert control in seen, (control, seen)
    # every control says what it does
    unnamed = ui.page.evaluate("""() => [...document.querySelectorAll('button, select, textarea')]
        .filter((e) => e.offsetParent !== null)
        .filter((e) => !(e.getAttribute('aria-label') || e.textContent.trim() || e.labels?.length))
        .map((e) => e.outerHTML)""")
    assert unnamed == []
    # the settings open from the keyboard and Escape closes them
    ui.page.focus("#open-settings")
    ui.page.keyboard.press("Enter")
    ui.page.wait_for_selector("#settings", state="visible")
    assert ui.page.evaluate("document.activeElement.closest('dialog')?.id") == "settings"
    ui.page.keyboard.press("Escape")
    ui.page.wait_for_selector("#settings", state="hidden")


def _image(width: int, height: int, fmt: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (30, 140, 200)).save(out, fmt)
    return out.getvalue()


def test_an_attached_image_is_sent_as_an_image_url_part(make_ui: Any) -> None:
    """The attach button takes a PNG, JPEG or WebP file, shows its thumbnail and sends it as an
    OpenAI image_url part with a data: URL; the text-only default model's 400 is shown on the
    answer."""
    ui = make_ui().open()
    png, jpeg = _image(12, 8, "PNG"), _image(20, 10, "JPEG")
    ui.page.set_input_files(
        "#attach-input",
        files=[
            {"name": "blue.png", "mimeType": "image/png", "buffer": png},
            {"name": "wide.jpg", "mimeType": "image/jpeg", "buffer": jpeg},
        ],
    )
    thumbs = ui.page.locator("#attachments .thumb")
    thumbs.nth(1).wait_for(state="visible")
    # the thumbnails load under the page's Content-Security-Policy
    assert [
        thumbs.nth(i).evaluate("img => img.complete && img.naturalWidth") for i in range(2)
    ] == [12, 20]
    ui.page.click("#attachments .remove >> nth=1")
    assert thumbs.count() == 1 and thumbs.first.get_attribute("alt") == "blue.png"
    # a file of another type is not attached, and the page says why
    ui.page.set_input_files(
        "#attach-input",
        files=[{"name": "anim.gif", "mimeType": "image/gif", "buffer": _image(4, 4, "GIF")}],
    )
    ui.page.wait_for_function(
        "() => document.getElementById('status').textContent.includes('anim.gif')"
    )
    assert "not a PNG, JPEG or WebP" in ui.page.inner_text("#status")
    assert thumbs.count() == 1

    ui.send("What is in this picture?", wait_start=False)
    ui.page.wait_for_selector(".message.assistant .notice.error", timeout=60_000)
    ui.wait_done()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    request = _chat_requests(ui)[-1]
    assert request.post_data_json["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }
    response = request.response()
    assert response is not None and response.status == 400
    error = response.json()["error"]
    assert "image" in error["message"]  # the server read the part and refused it by name
    assert ui.answer().locator(".notice.error").inner_text() == f"Error: {error['message']}"
    # the composer is empty again; the sent message shows its image, also after a reload
    assert ui.page.locator("#attachments").is_hidden() and thumbs.count() == 0
    sent = ui.page.locator(".message.user .thumb")
    assert sent.evaluate("img => img.complete && img.naturalWidth") == 12
    saved = _conversations(ui)[0]["messages"]
    assert saved[0]["images"] == [url] and saved[-1]["error"] == error["message"]
    ui.page.reload()
    ui.page.wait_for_selector(".message.user .thumb")
    assert ui.page.locator(".message.user .thumb").evaluate("img => img.naturalWidth") == 12

    # an image alone (no text) is sent as a single image part
    ui.page.set_input_files(
        "#attach-input", files=[{"name": "wide.jpg", "mimeType": "image/jpeg", "buffer": jpeg}]
    )
    thumbs.first.wait_for(state="visible")
    ui.page.click("#send")
    ui.page.wait_for_function(
        "() => document.querySelectorAll('.message.assistant .notice.error').length === 2",
        timeout=60_000,
    )
    ui.wait_done()
    assert _chat_requests(ui)[-1].post_data_json["messages"][-1]["content"] == [
        {
            "type": "image_url",
            "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()},
        }
    ]

"""Chat messages: checked against OpenAI's shapes and normalized for the chat template.

What the template receives:

- ``content`` is always a string (text parts joined; ``None`` becomes ``""``), except that an
  assistant message carrying ``tool_calls`` keeps ``None`` when it had no text;
- ``developer`` messages are rendered as ``system`` (chat templates know no developer role);
- assistant ``tool_calls[].function.arguments`` are parsed from JSON text into objects, because
  templates serialize them themselves (``arguments | tojson``);
- ``tool`` messages keep ``tool_call_id`` (and ``name`` when given);
- an assistant message's reasoning (``reasoning_content``, the field tallow's responses carry)
  is given to the template as ``reasoning_content`` (Qwen3's templates read it) and, when the
  message has no content, also as ``thinking`` (gpt-oss's template reads that, and refuses a
  tool-call message that has both content and ``thinking``).

Image parts (``image_url``) are kept for a model that takes images (``images=True``): the
message's ``content`` is then a list of ``{"type": "text", "text": ...}`` and
``{"type": "image"}`` parts in their order (the form chat templates of vision-language models
render), and :func:`image_urls` lists the URLs. ``detail`` is accepted and not used (Qwen2-VL
sizes an image by its pixels alone). For a text-only model, and always for audio and file
parts, the legacy ``function`` role and an assistant's legacy ``function_call``, the request
is refused with a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Sequence

from .errors import invalid, unsupported

_ROLES = ("system", "developer", "user", "assistant", "tool")


_DETAILS = ("auto", "low", "high")


def _image_url(part: dict[str, object], at: str) -> str:
    """The URL of an ``image_url`` part (checked)."""
    ref = part.get("image_url")
    if not isinstance(ref, dict) or not isinstance(ref.get("url"), str):
        raise invalid(
            f"{at}.image_url",
            f"Invalid value for '{at}.image_url': expected an object with a string 'url'.",
        )
    detail = ref.get("detail")
    if detail is not None and detail not in _DETAILS:
        raise invalid(
            f"{at}.image_url.detail",
            f"Invalid value for '{at}.image_url.detail': expected one of {', '.join(_DETAILS)}.",
        )
    return str(ref["url"])


def image_urls(messages: Sequence[object], param: str = "messages") -> list[tuple[str, str]]:
    """``(url, parameter path)`` of every ``image_url`` part of ``messages``, in order."""
    out: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                at = f"{param}[{i}].content[{j}]"
                out.append((_image_url(part, at), f"{at}.image_url.url"))
    return out


def _content_of(content: object, where: str, images: bool) -> object:
    """A message's ``content`` for the template: its text, or, when it holds images (and the
    model takes them), its text and image parts in order."""
    if (
        not images
        or not isinstance(content, list)
        or not any(isinstance(p, dict) and p.get("type") == "image_url" for p in content)
    ):
        return _text_of(content, where)
    parts: list[dict[str, object]] = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "image_url":
            _image_url(part, f"{where}[{j}]")
            parts.append({"type": "image"})
            continue
        # checked in place (its index in the error), the image parts read as empty text
        text = _text_of([{"type": "text", "text": ""}] * j + [part], where)
        parts.append({"type": "text", "text": text or ""})
    return parts


def _text_of(content: object, where: str, *, allow_none: bool = False) -> str | None:
    """The text of a message's ``content`` (a string or a list of text parts)."""
    if content is None:
        if allow_none:
            return None
        raise invalid(
            where,
            f"Invalid value for {where!r}: expected a string or a list of content parts, got null.",
        )
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(
            where,
            f"Invalid value for {where!r}: expected a string or a list of "
            f"content parts, got {type(content).__name__}.",
        )
    texts: list[str] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise invalid(at, f"Invalid value for {at!r}: expected a content part object.")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise invalid(f"{at}.text", f"Invalid value for '{at}.text': expected a string.")
            texts.append(text)
        elif kind == "refusal":
            texts.append(str(part.get("refusal") or ""))
        elif kind in ("image_url", "input_audio", "file"):
            raise unsupported(
                f"{at}.type",
                f"content parts of type {kind!r} need a "
                "multimodal model; the served model reads text only",
            )
        else:
            raise invalid(
                f"{at}.type", f"Invalid value for '{at}.type': expected 'text', got {kind!r}."
            )
    return "".join(texts)


def _tool_calls(calls: object, where: str) -> list[dict[str, object]]:
    if not isinstance(calls, list):
        raise invalid(where, f"Invalid value for {where!r}: expected a list of tool calls.")
    out: list[dict[str, object]] = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise invalid(at, f"Invalid value for {at!r}: expected a tool call object.")
        if call.get("type", "function") != "function":
            raise unsupported(f"{at}.type", "only 'function' tool calls exist in tallow")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise invalid(f"{at}.function", f"Missing required parameter: '{at}.function'.")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(
                f"{at}.function.name",
                f"Invalid value for '{at}.function.name': expected a non-empty string.",
            )
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise invalid(
                    f"{at}.function.arguments",
                    f"Invalid value for '{at}.function.arguments': not valid JSON ({exc}).",
                ) from None
        if not isinstance(args, dict):
            raise invalid(
                f"{at}.function.arguments",
                f"Invalid value for '{at}.function.arguments': expected a JSON object.",
            )
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise invalid(f"{at}.id", f"Invalid value for '{at}.id': expected a string.")
        out.append(
            {
                "id": call_id or f"call_{j}",
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
        )
    return out


def reasoning_fields(reasoning: str | None, content: object) -> dict[str, str]:
    """The keys that carry an assistant message's ``reasoning`` to chat templates (see the
    module docstring); none without reasoning."""
    if not reasoning:
        return {}
    fields = {"reasoning_content": reasoning}
    if not content:
        fields["thinking"] = reasoning
    return fields


def normalize_messages(
    messages: Sequence[object], param: str = "messages", *, images: bool = False
) -> list[dict[str, object]]:
    """Check ``messages`` and return them in the form the chat template expects; ``images``:
    the model takes images (their parts are kept, see the module docstring)."""
    out: list[dict[str, object]] = []
    for i, msg in enumerate(messages):
        at = f"{param}[{i}]"
        if not isinstance(msg, dict):
            raise invalid(at, f"Invalid value for {at!r}: expected a message object.")
        role = msg.get("role")
        if role is None:
            raise invalid(
                f"{at}.role",
                f"Missing required parameter: '{at}.role'.",
                code="missing_required_parameter",
            )
        if role == "function":
            raise unsupported(f"{at}.role", "the legacy 'function' role is replaced by 'tool'")
        if role not in _ROLES:
            raise invalid(
                f"{at}.role",
                f"Invalid value for '{at}.role': unknown role {role!r}; "
                f"expected one of {', '.join(_ROLES)}.",
                code="invalid_role",
            )
        norm: dict[str, object] = {"role": "system" if role == "developer" else role}
        if isinstance(msg.get("name"), str):
            norm["name"] = msg["name"]
        if role == "assistant":
            if msg.get("function_call") is not None:
                raise unsupported(f"{at}.function_call", "use 'tool_calls'")
            calls = msg.get("tool_calls")
            text = _text_of(msg.get("content"), f"{at}.content", allow_none=True)
            if calls:
                norm["tool_calls"] = _tool_calls(calls, f"{at}.tool_calls")
                norm["content"] = text or None
            else:
                norm["content"] = text or ""
            thought = msg.get("reasoning_content")
            if thought is not None and not isinstance(thought, str):
                raise invalid(
                    f"{at}.reasoning_content",
                    f"Invalid value for '{at}.reasoning_content': expected a string.",
                )
            norm.update(reasoning_fields(thought, norm["content"]))
        elif role == "user":
            norm["content"] = _content_of(msg.get("content"), f"{at}.content", images)
        else:
            norm["content"] = _text_of(msg.get("content"), f"{at}.content")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str):
                raise invalid(
                    f"{at}.tool_call_id",
                    f"Missing required parameter: '{at}.tool_call_id' (a string).",
                    code="missing_required_parameter",
                )
            norm["tool_call_id"] = call_id
        out.append(norm)
    return out

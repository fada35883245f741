"""What the model reads of an MCP tool result: its content blocks as text."""

from __future__ import annotations

import json
from typing import Any


def result_text(result: Any) -> str:
    """The text of a ``CallToolResult``: text blocks as they are, embedded text resources by
    their text, other blocks (images, audio, blobs, links) as a one-line description; with no
    content blocks, the structured content as JSON."""
    parts = [_block_text(block) for block in (result.content or [])]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        size = len(getattr(block, "data", "") or "") * 3 // 4  # base64
        return f"[{kind} {getattr(block, 'mime_type', '?')}, {size} bytes, not shown]"
    if kind == "resource_link":
        return f"[resource {block.uri}{': ' + block.name if getattr(block, 'name', '') else ''}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return text
        return (
            f"[resource {resource.uri}, {getattr(resource, 'mime_type', None) or 'binary'}, "
            "not shown]"
        )
    return f"[{kind or type(block).__name__} content, not shown]"

"""The tokenizer and generation settings that travel with a Hugging Face model directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tallow.plugin import ModelFileError

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; {} when the file is absent; a clear error when malformed."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ModelFileError(path, None, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelFileError(path, None, f"expected a JSON object, got {type(data).__name__}")
    return data


def _token_text(value: Any) -> Any:
    """``"<s>"`` from either ``"<s>"`` or a serialized AddedToken ``{"content": "<s>", ...}``."""
    if isinstance(value, dict) and "content" in value:
        return value["content"]
    return value


def read_tokenizer_config(root: Path) -> dict[str, Any]:
    """``tokenizer_config.json``, normalised for tallow.

    Special tokens become plain strings (missing ones are taken from
    ``special_tokens_map.json``). ``chat_template`` is a string: the file's own, else
    ``chat_template.jinja``, else ``chat_template.json``; a list of named templates keeps the
    one named ``default`` as ``chat_template`` and all of them under ``chat_templates``.
    """
    cfg = read_json(root / "tokenizer_config.json")
    special = read_json(root / "special_tokens_map.json")
    for key in SPECIAL_KEYS:
        if cfg.get(key) is None and special.get(key) is not None:
            cfg[key] = special[key]
        if key in cfg:
            cfg[key] = _token_text(cfg[key])
    template = cfg.get("chat_template")
    if template is None:
        jinja = root / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        else:
            template = read_json(root / "chat_template.json").get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        cfg["chat_templates"] = named
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ModelFileError(
            root,
            "chat_template",
            f"must be a string or a list of {{name, template}}, got {type(template).__name__}",
        )
    if template is not None:
        cfg["chat_template"] = template
    return cfg


def read_tokenizer(root: Path) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json``, or None when there is none."""
    path = root / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises bare Exceptions
        raise ModelFileError(
            path, None, f"cannot be read by the tokenizers library ({exc})"
        ) from exc

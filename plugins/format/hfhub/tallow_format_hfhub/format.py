"""The ``hfhub`` weight format: download (or find in the cache) a hub repository, then read it
as a safetensors model directory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import ClassVar

from tallow.plugin import Checkpoint, WeightFormat
from tallow_format_safetensors.files import INDEX_NAME
from tallow_format_safetensors.loader import load_directory
from tallow_format_safetensors.tokenizer_files import read_json

# What a model needs, and nothing else a repository may carry (PyTorch .bin copies, ONNX...).
METADATA_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    INDEX_NAME,
    # sentence-transformers: how the model's embeddings are pooled and normalized
    "modules.json",
    "sentence_bert_config.json",
    "*_Pooling/config.json",
]
WEIGHT_PATTERNS = ["*.safetensors"]

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class HubOfflineError(RuntimeError):
    """The repository is not in the local cache and the hub may not be contacted."""


class HubDownloadError(RuntimeError):
    """The hub could not provide the repository."""


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks for no network (read now, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "on", "yes", "true"}


def is_repo_id(source: str) -> bool:
    """``org/name`` that is not an existing local path."""
    return bool(_REPO_ID.match(source)) and not os.path.exists(source)


class HFHubFormat(WeightFormat):
    """A Hugging Face hub id ``org/name`` holding a safetensors checkpoint."""

    name: ClassVar[str] = "hfhub"

    @classmethod
    def claims(cls, source: str) -> bool:
        return is_repo_id(source)

    def load(self, source: str, *, revision: str | None = None) -> Checkpoint:
        """Fetch ``source`` at ``revision`` (default: main) into the hub cache, or find it there
        when ``HF_HUB_OFFLINE`` is set, and read it as a model directory."""
        if not is_repo_id(source):
            raise ValueError(f"model source {source!r} is not a hub id of the form 'org/name'")
        path = self.snapshot(source, revision)
        checkpoint = load_directory(path, source=source)
        checkpoint.extra["revision"] = revision
        return checkpoint

    def snapshot(self, repo_id: str, revision: str | None) -> str:
        """The local snapshot directory of ``repo_id``: metadata first, then only the weight
        files the checkpoint uses (the shards its index names, else every safetensors file)."""
        path = _download(repo_id, revision, METADATA_PATTERNS)
        weight_map = read_json(Path(path) / INDEX_NAME).get("weight_map")
        patterns = (
            sorted(set(weight_map.values()))
            if isinstance(weight_map, dict) and weight_map
            else WEIGHT_PATTERNS
        )
        return _download(repo_id, revision, patterns)


def _download(repo_id: str, revision: str | None, patterns: list[str]) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = hub_offline()
    at = f" at revision {revision!r}" if revision else ""
    try:
        return snapshot_download(
            repo_id, revision=revision, allow_patterns=patterns, local_files_only=offline
        )
    except LocalEntryNotFoundError as exc:
        if offline:
            raise HubOfflineError(
                f"model {repo_id!r}{at} is not in the Hugging Face cache and the hub is offline "
                "(HF_HUB_OFFLINE is set): download it once with network access, or point "
                "--model at a local directory"
            ) from exc
        raise HubDownloadError(
            f"model {repo_id!r}{at} is not in the Hugging Face cache and could not be "
            f"downloaded from the hub: {exc}"
        ) from exc
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise HubDownloadError(
            f"model {repo_id!r} cannot be fetched from the hub (missing, private or gated): {exc}"
        ) from exc
    except RevisionNotFoundError as exc:
        raise HubDownloadError(f"model {repo_id!r} has no revision {revision!r}") from exc

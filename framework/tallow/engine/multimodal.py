"""Images in prompts: loading, hashing and placeholder expansion (the engine's host side).

A prompt for a vision-language model carries one ``image_token_id`` per image (the chat
template renders an image part as ``<|vision_start|><|image_pad|><|vision_end|>``), in the
order of the images. At admission each of them is expanded into as many copies as the image
has tokens (:meth:`PromptImages.expand`), the image is processed for the model's encoder and
hashed, and the model's positions of the whole prompt are computed once. The result, a
:class:`MultimodalPrompt`, rides on the request's sequences:

* the prefix cache keys every block that holds image tokens on the hashes of those images as
  well as the token ids (:meth:`MultimodalPrompt.block_key`), so two prompts with the same
  placeholder ids but different images never share K/V;
* the model runner looks up the encoder outputs of the image tokens each step computes
  (:mod:`tallow.engine.encoder_cache`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from tallow.layers import PlacedImage, ProcessedImage, VisionLanguageModel

from .errors import AdmissionError

__all__ = [
    "ImageInput",
    "MultimodalPrompt",
    "PromptImages",
    "load_image",
    "image_digest",
    "decode_data_url",
    "chat_images",
]

#: what a caller may pass as an image
ImageInput = Any  # a PIL image, a path (str / os.PathLike) or the bytes of a PNG/JPEG/WebP


def load_image(image: ImageInput, what: str = "image") -> Any:
    """A PIL image of ``image``: a PIL image (kept), a path or encoded bytes (decoded)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image
    try:
        if isinstance(image, (bytes, bytearray, memoryview)):
            loaded = Image.open(io.BytesIO(bytes(image)))
        elif isinstance(image, (str, os.PathLike)):
            loaded = Image.open(os.fspath(image))
        else:
            raise ValueError(
                f"{what}: expected a PIL image, a path or image bytes, got {type(image).__name__}"
            )
        loaded.load()
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"{what}: not a readable image ({exc})") from None
    return loaded


def decode_data_url(url: str, what: str = "url") -> bytes:
    """The bytes of a base64 ``data:`` URL (``data:image/png;base64,...``); ValueError naming
    ``what`` for anything else."""
    if not isinstance(url, str) or not url.startswith("data:"):
        raise ValueError(f"{what}: expected a data: URL (data:image/...;base64,...)")
    header, sep, payload = url[5:].partition(",")
    if not sep or not header.endswith(";base64"):
        raise ValueError(
            f"{what}: a data: URL must be base64 encoded (data:image/<type>;base64,<data>)"
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what}: the data: URL's payload is not valid base64") from None


def chat_images(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """(the messages with each image content part as ``{"type": "image"}`` for the chat
    template, the images in order). Image parts are ``{"type": "image", "image": <PIL image,
    path or bytes>}`` and OpenAI's ``{"type": "image_url", "image_url": {"url":
    "data:..."}}``."""
    images: list[Any] = []
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts: list[Any] = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            where = f"messages[{i}].content[{j}]"
            if kind == "image":
                if part.get("image") is None:
                    raise ValueError(f"{where}.image: an image part needs its image")
                images.append(part["image"])
                parts.append({"type": "image"})
            elif kind == "image_url":
                ref = part.get("image_url")
                url = ref.get("url") if isinstance(ref, dict) else ref
                images.append(decode_data_url(str(url or ""), f"{where}.image_url.url"))
                parts.append({"type": "image"})
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return out, images


def image_digest(image: Any) -> bytes:
    """sha256 of an image's decoded pixels (mode, size, bytes): the same picture sent as PNG or
    as WebP hashes alike, two different pictures never do."""
    h = hashlib.sha256()
    h.update(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    h.update(image.tobytes())
    return h.digest()


@dataclass(frozen=True)
class PromptImage:
    """One image of an expanded prompt."""

    digest: bytes
    placed: PlacedImage

    @property
    def offset(self) -> int:
        return self.placed.offset

    @property
    def end(self) -> int:
        return self.placed.end

    @property
    def processed(self) -> ProcessedImage:
        return self.placed.image


@dataclass
class MultimodalPrompt:
    """The images of an expanded prompt, in prompt order, and its model positions."""

    images: list[PromptImage]
    #: ``[axes, prompt_len]`` int64 rotary positions of the prompt (host)
    positions: torch.Tensor
    #: what positions past the prompt add to their index
    delta: int = 0
    #: each image's tokens must be computed in one step (the model's ``whole_images``)
    whole_images: bool = False
    _ends: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._ends = [im.end for im in self.images]

    def overlapping(self, start: int, end: int) -> list[PromptImage]:
        """The images with a token in ``start .. end - 1``."""
        first = bisect_right(self._ends, start)
        out = []
        for im in self.images[first:]:
            if im.offset >= end:
                break
            out.append(im)
        return out

    def chunk_end(self, start: int, num_tokens: int) -> int:
        """``num_tokens`` or fewer, so that a chunk of tokens ``start .. start + n - 1`` does
        not end inside an image when ``whole_images`` (0: the chunk cannot start here)."""
        if not self.whole_images:
            return num_tokens
        end = start + num_tokens
        for im in self.overlapping(end - 1, end):
            if im.end > end:
                return max(0, im.offset - start)
        return num_tokens

    def block_key(self, start: int, end: int) -> bytes:
        """What a prefix-cache block over tokens ``start .. end - 1`` adds to its hash: the
        digests of the images it holds tokens of, with where each starts (empty: none)."""
        return b"".join(
            im.digest + im.offset.to_bytes(8, "little") for im in self.overlapping(start, end)
        )

    def positions_of(self, start: int, end: int) -> torch.Tensor:
        """``[axes, end - start]`` positions of tokens ``start .. end - 1`` (past the prompt:
        the index plus ``delta`` on every axis)."""
        length = self.positions.shape[1]
        inside = self.positions[:, start : min(end, length)]
        if end <= length:
            return inside
        tail = torch.arange(max(start, length), end, dtype=torch.int64) + self.delta
        return torch.cat([inside, tail.expand(self.positions.shape[0], -1)], dim=1)


class PromptImages:
    """Expands the images of prompts for one vision-language model."""

    def __init__(self, model: VisionLanguageModel, *, max_images: int | None = None) -> None:
        self.model = model
        self.token_id = int(model.placeholder_token_id)
        self.max_images = max_images

    def expand(
        self, token_ids: Sequence[int], images: Sequence[ImageInput]
    ) -> tuple[list[int], MultimodalPrompt]:
        """(the prompt with each image placeholder expanded, its :class:`MultimodalPrompt`).
        The prompt must hold exactly one ``image_token_id`` per image."""
        ids = list(token_ids)
        slots = [i for i, t in enumerate(ids) if t == self.token_id]
        if len(slots) != len(images):
            raise AdmissionError(
                f"the prompt has {len(slots)} image placeholder token(s) (id {self.token_id}) "
                f"for {len(images)} image(s): each image needs exactly one",
                field="images",
            )
        if self.max_images is not None and len(images) > self.max_images:
            raise AdmissionError(
                f"{len(images)} images; at most {self.max_images} per request", field="images"
            )
        out: list[int] = []
        placed: list[PromptImage] = []
        prev = 0
        for n, (slot, raw) in enumerate(zip(slots, images)):
            try:
                pil = load_image(raw, f"images[{n}]")
            except ValueError as exc:
                raise AdmissionError(str(exc), field="images") from None
            processed = self.model.process_image(pil)
            out.extend(ids[prev:slot])
            tokens, start = self.model.expand_image(processed)
            placed.append(PromptImage(image_digest(pil), PlacedImage(len(out) + start, processed)))
            out.extend(tokens)
            prev = slot + 1
        out.extend(ids[prev:])
        positions, delta = self.model.prompt_positions(out, [p.placed for p in placed])
        return out, MultimodalPrompt(
            placed,
            positions.to(torch.int64),
            int(delta),
            whole_images=bool(self.model.whole_images),
        )

"""The operator's limits on image inputs (:class:`ImagePolicy`) and the 400 for a file over
its byte limit; shared by the decoder (:mod:`tallow.server.images`) and the fetcher
(:mod:`tallow.server.image_fetch`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tallow.config.hosts import parse_host_rule

from .errors import invalid

#: the settings as an operator sets them, named in error messages
BYTES_SETTING = "server.max_image_bytes, --max-image-bytes"
PIXELS_SETTING = "server.max_image_pixels, --max-image-pixels"
HOSTS_SETTING = "server.allowed_image_hosts, --allowed-image-hosts"
TIMEOUT_SETTING = "server.image_fetch_timeout_s, --image-fetch-timeout"


@dataclass(frozen=True)
class ImagePolicy:
    """What the server accepts of image inputs.

    ``allowed_hosts``: the hosts http(s) image URLs may name (``host``, ``host:port``,
    ``[v6addr]:port`` or ``*.domain``; see :mod:`tallow.server.image_fetch`); empty refuses
    every http(s) URL. ``max_bytes``: the largest image file; ``max_pixels``: the largest
    width × height; ``timeout_s``: the whole fetch of one URL, redirects included.
    """

    allowed_hosts: tuple[str, ...] = ()
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 8192 * 8192
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise ValueError(
                f"ImagePolicy.max_bytes: expected a positive byte count, got {self.max_bytes!r}"
            )
        if self.max_pixels <= 0:
            raise ValueError(
                f"ImagePolicy.max_pixels: expected a positive pixel count, got {self.max_pixels!r}"
            )
        for entry in self.allowed_hosts:
            try:
                parse_host_rule(entry)
            except ValueError as exc:
                raise ValueError(f"ImagePolicy.allowed_hosts: {exc}") from None
        if not self.timeout_s > 0:
            raise ValueError(
                f"ImagePolicy.timeout_s: expected a positive number of seconds, "
                f"got {self.timeout_s!r}"
            )


def policy_from_config(config: Any) -> ImagePolicy:  # Any: TallowConfig or a stand-in
    """The :class:`ImagePolicy` of ``config.server`` (defaults for what it lacks)."""
    server = getattr(config, "server", None)
    default = ImagePolicy()
    return ImagePolicy(
        allowed_hosts=tuple(getattr(server, "allowed_image_hosts", None) or ()),
        max_bytes=int(getattr(server, "max_image_bytes", default.max_bytes)),
        max_pixels=int(getattr(server, "max_image_pixels", default.max_pixels)),
        timeout_s=float(getattr(server, "image_fetch_timeout_s", default.timeout_s)),
    )


def too_many_bytes(
    param: str, size: int | None, policy: ImagePolicy, *, about: bool = False
) -> Exception:
    """The 400 for an image over ``max_bytes`` (``size`` None: the download passed the limit
    and was stopped; ``about``: ``size`` is estimated from the encoded length)."""
    what = (
        f"is {'about ' if about else ''}{size:,} bytes"
        if size is not None
        else f"is larger than {policy.max_bytes:,} bytes (the download was stopped there)"
    )
    return invalid(
        param,
        f"The image at {param!r} {what}; the limit is {policy.max_bytes:,} ({BYTES_SETTING}).",
        code="image_too_large",
    )

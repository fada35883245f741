"""The entries of ``server.allowed_image_hosts``: which hosts image URLs may name.

An entry is one of:

- ``host`` — that host exactly (compared case-insensitively, IDNA-encoded, a trailing dot
  ignored), on any port; ``images.example.com`` does not allow ``cdn.images.example.com``;
- ``host:port`` — that host on that port only;
- ``*.domain`` (optionally ``:port``) — every subdomain of ``domain`` at any depth, not
  ``domain`` itself;
- an IP address (``127.0.0.1``, ``::1``, ``[::1]:8080``) — that address written as the URL's
  host.

A comma-separated value is split into entries, so ``--allowed-image-hosts a.com,b.org`` and a
repeated flag mean the same.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class HostRule:
    """One parsed entry: ``host`` (lowercase ASCII; the domain of a wildcard; an IP address in
    its compressed form), ``port`` (None: any), ``wildcard`` (subdomains of ``host``) and
    ``address`` (``host`` is an IP address)."""

    host: str
    port: int | None = None
    wildcard: bool = False
    address: bool = False

    def matches(self, host: str, port: int) -> bool:
        """Whether a URL's ``host`` (normalised by :func:`normalise_host`) and ``port``
        (explicit or the scheme's default) fall under this entry."""
        if self.port is not None and port != self.port:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (
            ("*." if self.wildcard else "")
            + host
            + (f":{self.port}" if self.port is not None else "")
        )


def normalise_host(host: str) -> str:
    """``host`` as entries are compared: lowercase ASCII (IDNA), no trailing dot, an IP
    address in compressed form (brackets of an IPv6 address removed)."""
    text = host.strip().rstrip(".").lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    try:
        return text.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ValueError(f"{host!r} is not a valid host name ({exc})") from None


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [v6addr] or [v6addr]:port
        close = entry.find("]")
        if close < 0:
            raise ValueError(f"{entry!r}: an IPv6 address opened with '[' needs its ']'")
        host, rest = entry[: close + 1], entry[close + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"{entry!r}: expected ':port' after ']'")
        return host, _port(entry, rest[1:])
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(entry, port)
    return entry, None  # a name, or a bare IPv6 address (several colons, no port)


def _port(entry: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535, got {text!r}")
    return int(text)


def parse_host_rule(entry: str) -> HostRule:
    """The :class:`HostRule` of one entry; a ValueError saying what is wrong with it."""
    text = entry.strip()
    if not text:
        raise ValueError("expected a host name, not an empty entry")
    if "/" in text or "@" in text or "?" in text or "#" in text:
        raise ValueError(
            f"{entry!r}: expected a host (host, host:port, *.domain or an IP address), not a URL"
        )
    wildcard = text.startswith("*.")
    host_text, port = _split_port(text[2:] if wildcard else text)
    host = normalise_host(host_text)
    try:
        ipaddress.ip_address(host)
        is_address = True
    except ValueError:
        is_address = False
    if is_address and wildcard:
        raise ValueError(f"{entry!r}: '*.' takes a domain name, not an IP address")
    if not is_address:
        labels = host.split(".")
        if "*" in host or not all(_LABEL.match(label) for label in labels):
            raise ValueError(
                f"{entry!r}: {host_text!r} is not a valid host name ('*.' may only start an entry)"
            )
    return HostRule(host=host, port=port, wildcard=wildcard, address=is_address)


def split_host_entries(values: list[str] | str | None) -> list[str]:
    """Entries of a list whose items may hold several comma-separated entries, checked by
    :func:`parse_host_rule` and given back in its normal form, duplicates dropped."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    entries: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"expected host names (strings), got {item!r}")
        for part in item.split(","):
            if part.strip():
                text = str(parse_host_rule(part))
                if text not in entries:
                    entries.append(text)
    return entries

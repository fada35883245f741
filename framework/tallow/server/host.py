"""Where the server listens: ``--host`` in its four spellings.

- ``0.0.0.0`` / ``localhost`` / ``::1`` — an address; the port comes from ``--port``;
- ``host:port`` — an address and a port (the port wins over ``--port``);
- ``[ipv6]:port`` or ``[ipv6]`` — an IPv6 address, bracketed;
- ``unix:///path/to/socket`` — a Unix domain socket (``--port`` is ignored).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class BindAddress:
    """A TCP ``host``/``port`` or a Unix socket path ``uds`` (then host and port are unused)."""

    host: str = "0.0.0.0"
    port: int = 2000
    uds: str | None = None

    def url(self) -> str:
        """A URL a local client can use to reach this address."""
        if self.uds:
            return f"unix://{self.uds}"
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


def _port(text: str, spec: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError(
            f"--host {spec!r}: the port must be a number from 0 to 65535, got {text!r}"
        )
    return int(text)


def _check_host(host: str, spec: str) -> str:
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if not _NAME.match(host):
        raise ValueError(
            f"--host {spec!r}: {host!r} is neither an IP address nor a host name "
            "(expected host, host:port, [ipv6]:port or unix:///path)"
        )
    return host


def parse_bind(spec: str, port: int = 2000) -> BindAddress:
    """Parse ``--host`` (with ``port`` as the default port); a ``ValueError`` names the problem."""
    spec = spec.strip()
    if not spec:
        raise ValueError("--host: expected an address, got an empty string")
    if spec.startswith("unix:"):
        path = spec[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise ValueError(
                f"--host {spec!r}: a Unix socket needs an absolute path, as in "
                "unix:///run/tallow.sock"
            )
        return BindAddress(uds=path)
    if spec.startswith("["):
        end = spec.find("]")
        if end < 0:
            raise ValueError(f"--host {spec!r}: an unclosed '[' (expected [ipv6]:port)")
        host, rest = spec[1:end], spec[end + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"--host {spec!r}: {host!r} is not an IPv6 address") from None
        if rest and not rest.startswith(":"):
            raise ValueError(f"--host {spec!r}: expected ':port' after ']', got {rest!r}")
        return BindAddress(host=host, port=_port(rest[1:], spec) if rest else port)
    if spec.count(":") > 1:  # a bare IPv6 address such as ::1 or ::
        try:
            ipaddress.IPv6Address(spec)
        except ValueError:
            raise ValueError(
                f"--host {spec!r}: not an IPv6 address (write [ipv6]:port to give a port)"
            ) from None
        return BindAddress(host=spec, port=port)
    if ":" in spec:
        host, _, text = spec.partition(":")
        return BindAddress(host=_check_host(host, spec), port=_port(text, spec))
    return BindAddress(host=_check_host(spec, spec), port=port)

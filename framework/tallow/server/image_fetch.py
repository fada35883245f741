"""Fetching the http(s) image URLs of ``image_url`` parts, from allowed hosts only.

The server must not become a proxy into the network it runs in (SSRF), so a URL is fetched
only when all of these hold, and each refusal is a 400 naming the setting at fault:

- the scheme is http or https, and the URL carries no user name or password;
- its host (and port) match an entry of ``server.allowed_image_hosts`` (see
  :mod:`tallow.config.hosts` for the entry syntax: exact hosts, ``host:port``, ``*.domain``);
  an empty list refuses every URL;
- the host's addresses are resolved once and the connection goes to a resolved address (the
  request names the host in its ``Host`` header and, over TLS, in SNI and certificate checks),
  so a second DNS answer cannot send the request elsewhere. The address rule: a host named by
  an exact entry is the operator's explicit choice and may resolve to any address (an image
  store on the private network, a test server on 127.0.0.1), except that a host *name*
  resolving to a link-local address (169.254.0.0/16, fe80::/10: cloud metadata services) is
  refused unless the entry is that address itself. A host allowed only through a ``*.domain``
  entry must resolve to public addresses only: private, loopback, link-local, shared,
  multicast, reserved and unspecified addresses are refused;
- redirects are followed by hand, at most :data:`MAX_REDIRECTS`, and every hop is checked as
  above (a redirect to a host that is not allowed is refused);
- the answer is a 200 whose Content-Type is ``image/*``; the body is streamed and the download
  stops as soon as it passes ``max_bytes`` (a declared Content-Length over the limit is refused
  before reading);
- the whole fetch, redirects included, ends within ``timeout_s``.

Proxy variables of the environment are ignored (``trust_env=False``): a proxy would resolve
the host itself, past the address rule.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import anyio
import httpx
import tallow
from tallow.config.hosts import HostRule, normalise_host, parse_host_rule

from .errors import invalid
from .image_policy import HOSTS_SETTING, TIMEOUT_SETTING, ImagePolicy, too_many_bytes

#: redirects followed for one image URL
MAX_REDIRECTS = 3
_REDIRECTS = (301, 302, 303, 307, 308)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_CHUNK = 64 * 1024

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


async def resolve(host: str, port: int) -> list[str]:
    """The addresses of ``host`` (tests replace this to play a DNS server)."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _unmapped(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (::ffff:a.b.c.d) as the IPv4 address it reaches."""
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def _is_public(address: Address) -> bool:
    return address.is_global and not address.is_multicast


def _refuse(param: str, why: str, code: str = "image_url_not_allowed") -> Exception:
    return invalid(param, f"The image URL at {param!r} is refused: {why}.", code=code)


def _allowed_rule(url: httpx.URL, rules: tuple[HostRule, ...], param: str, hop: str) -> HostRule:
    """The entry that allows ``url`` (a 400 when none does, or the URL's shape is refused)."""
    if url.scheme not in _DEFAULT_PORTS:
        raise _refuse(param, f"{hop}the scheme {url.scheme!r} is not http or https")
    if url.userinfo:
        raise _refuse(param, f"{hop}URLs with a user name or password are not fetched")
    host = normalise_host(url.host)
    port = url.port or _DEFAULT_PORTS[url.scheme]
    for rule in rules:
        if rule.matches(host, port):
            return rule
    allowed = ", ".join(map(str, rules))
    raise _refuse(
        param,
        f"{hop}the host {host}:{port} is not in the allowed image hosts "
        f"({HOSTS_SETTING}: {allowed})",
    )


async def _address(url: httpx.URL, rule: HostRule, param: str, hop: str) -> str:
    """The address to connect to for ``url`` under the address rule of the module."""
    host = normalise_host(url.host)
    port = url.port or _DEFAULT_PORTS[url.scheme]
    try:
        found = await resolve(host, port)
    except OSError as exc:
        raise _refuse(
            param, f"{hop}the host {host!r} cannot be resolved ({exc})", code="image_fetch_failed"
        ) from None
    addresses = [_unmapped(ipaddress.ip_address(a.split("%", 1)[0])) for a in found]
    if not addresses:
        raise _refuse(param, f"{hop}the host {host!r} has no address", code="image_fetch_failed")
    for address in addresses:
        if rule.wildcard and not _is_public(address):
            raise _refuse(
                param,
                f"{hop}{host} resolves to {address}, a non-public address; "
                f"a host allowed by the wildcard entry {rule} must resolve to public "
                f"addresses only (name it exactly in {HOSTS_SETTING} to allow it)",
            )
        if not rule.address and address.is_link_local:
            raise _refuse(
                param,
                f"{hop}{host} resolves to {address}, a link-local address "
                f"(cloud metadata services live there); only an entry naming the "
                f"address itself in {HOSTS_SETTING} allows it",
            )
    return str(addresses[0])


def _content_type_error(param: str, url: httpx.URL, ctype: str) -> Exception:
    return invalid(
        param,
        f"The URL at {param!r} ({url.host}) answered with Content-Type "
        f"{ctype or '(none)'!r}; expected an image (image/*).",
        code="invalid_image",
    )


async def _read_body(response: httpx.Response, host: str, policy: ImagePolicy, param: str) -> bytes:
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        # the limit is on the bytes that are decoded: a compressed body is not inflated here
        raise _refuse(
            param,
            f"{host} sent it with Content-Encoding {encoding!r}; "
            "images are fetched uncompressed (identity)",
            code="image_fetch_failed",
        )
    declared = response.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > policy.max_bytes:
        raise too_many_bytes(param, int(declared), policy)
    body = bytearray()
    async for chunk in response.aiter_raw(_CHUNK):
        body += chunk
        if len(body) > policy.max_bytes:
            raise too_many_bytes(param, None, policy)
    return bytes(body)


async def _fetch(url: str, rules: tuple[HostRule, ...], policy: ImagePolicy, param: str) -> bytes:
    try:
        current = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise _refuse(param, f"it is not a valid URL ({exc})", code="invalid_image_url") from None
    headers = {
        "Accept": "image/png, image/jpeg, image/webp",
        "User-Agent": f"tallow/{tallow.__version__} (image fetcher)",
        "Accept-Encoding": "identity",
    }
    # no pooled connection outlives one request: a TLS session set up for one host name is
    # never reused for another name with the same address
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(
        trust_env=False, follow_redirects=False, limits=limits, timeout=policy.timeout_s
    ) as client:
        for hops in range(MAX_REDIRECTS + 1):
            hop = f"after {hops} redirect{'s' if hops > 1 else ''}, " if hops else ""
            rule = _allowed_rule(current, rules, param, hop)
            address = await _address(current, rule, param, hop)
            target = current.copy_with(host=address)
            extensions: dict[str, Any] = {}
            if current.scheme == "https":
                extensions["sni_hostname"] = current.raw_host.decode("ascii")
            request = client.build_request(
                "GET",
                target,
                headers={**headers, "Host": current.netloc.decode("ascii")},
                extensions=extensions,
            )
            try:
                response = await client.send(request, stream=True)
            except httpx.TimeoutException:
                raise TimeoutError from None
            except httpx.HTTPError as exc:
                raise _refuse(
                    param,
                    f"{hop}fetching it from {current.host} failed ({type(exc).__name__}: {exc})",
                    code="image_fetch_failed",
                ) from None
            try:
                if response.status_code in _REDIRECTS:
                    location = response.headers.get("location")
                    if not location:
                        raise _refuse(
                            param,
                            f"{hop}{current.host} answered "
                            f"{response.status_code} without a Location",
                            code="image_fetch_failed",
                        )
                    try:
                        current = current.join(location)
                    except httpx.InvalidURL as exc:
                        raise _refuse(
                            param,
                            f"{hop}it redirects to an invalid URL ({exc})",
                            code="image_fetch_failed",
                        ) from None
                    continue
                if response.status_code != 200:
                    raise _refuse(
                        param,
                        f"{hop}{current.host} answered "
                        f"{response.status_code} {response.reason_phrase}",
                        code="image_fetch_failed",
                    )
                ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if not ctype.startswith("image/"):
                    raise _content_type_error(param, current, ctype)
                try:
                    return await _read_body(response, current.host, policy, param)
                except httpx.TimeoutException:
                    raise TimeoutError from None
                except httpx.HTTPError as exc:
                    raise _refuse(
                        param,
                        f"{hop}reading the image from {current.host} failed "
                        f"({type(exc).__name__}: {exc})",
                        code="image_fetch_failed",
                    ) from None
            finally:
                await response.aclose()
    raise _refuse(param, f"it redirects more than {MAX_REDIRECTS} times", code="image_fetch_failed")


async def fetch_image(url: str, policy: ImagePolicy, *, param: str) -> bytes:
    """The body of the http(s) image ``url`` under ``policy`` (rules in the module's doc);
    every refusal is a 400 naming ``param`` and the setting at fault."""
    if not policy.allowed_hosts:
        raise _refuse(
            param,
            "this server fetches no image links: no host is allowed "
            f"({HOSTS_SETTING} is empty); send the image as a data: URL instead",
        )
    rules = tuple(parse_host_rule(entry) for entry in policy.allowed_hosts)
    try:
        with anyio.fail_after(policy.timeout_s):
            return await _fetch(url, rules, policy, param)
    except TimeoutError:
        raise invalid(
            param,
            f"The image at {param!r} was not fetched within "
            f"{policy.timeout_s:g} s; the limit is {policy.timeout_s:g} s "
            f"({TIMEOUT_SETTING}).",
            code="image_fetch_timeout",
        ) from None

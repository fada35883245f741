"""http(s) image URLs (tallow.server.image_fetch) against a real HTTP server on 127.0.0.1: an
allowed small PNG loads; a host that is not allowed, a redirect to one, a 50 MB body (declared
or streamed), a 40k × 40k pixel bomb, a non-image type and a slow server are 400s naming the
limit or setting; the address rule (SSRF) holds for wildcard entries and link-local names."""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
from image_samples import encoded, gradient, png_bomb

from tallow.server import image_fetch
from tallow.server.errors import APIError
from tallow.server.images import ImagePolicy, load_image_url

FIELD = "messages[0].content[1].image_url.url"
SMALL = encoded(gradient(11, 6), "PNG")
BIG = 50 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen_hosts: list[str] = []

    def log_message(self, *args: Any) -> None:  # keep the test output quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "image/png", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, total: int, chunk: bytes, pause: float = 0.0, length: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        if length:
            self.send_header("Content-Length", str(total))
        self.send_header("Connection", "close")
        self.end_headers()
        sent = 0
        try:
            while sent < total:
                self.wfile.write(chunk)
                self.wfile.flush()
                sent += len(chunk)
                if pause:
                    time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading: what the tests expect
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        _Handler.seen_hosts.append(self.headers.get("Host", ""))
        port = self.server.server_address[1]
        path = self.path
        if path == "/small.png":
            self._send(200, SMALL)
        elif path == "/big-declared":
            self._stream(BIG, b"\0" * 65536, length=True)
        elif path == "/big-streamed":  # no Content-Length: read until the connection closes
            self._stream(BIG, b"\0" * 65536)
        elif path == "/bomb.png":
            self._send(200, png_bomb())
        elif path == "/page.html":
            self._send(200, b"<html>not an image</html>", "text/html; charset=utf-8")
        elif path == "/gzip.png":
            self._send(200, SMALL, Content_Encoding="gzip")
        elif path == "/slow-start":
            time.sleep(3)
            self._send(200, SMALL)
        elif path == "/slow-body":  # every read is quick; the whole takes 4 s
            self._stream(40, b"\0", pause=0.1, length=True)
        elif path == "/redirect-out":
            self._send(302, b"", "text/plain", Location=f"http://localhost:{port}/small.png")
        elif path == "/redirect-in":
            self._send(302, b"", "text/plain", Location="/small.png")
        elif path.startswith("/chain/"):
            left = int(path.rsplit("/", 1)[1])
            target = "/small.png" if left == 0 else f"/chain/{left - 1}"
            self._send(307, b"", "text/plain", Location=target)
        elif path == "/redirect-ftp":
            self._send(301, b"", "text/plain", Location="ftp://127.0.0.1/x.png")
        else:
            self._send(404, b"no such image", "text/plain")


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def policy(origin: str, **limits: Any) -> ImagePolicy:
    return ImagePolicy(allowed_hosts=(origin,), **limits)


def load(url: str, pol: ImagePolicy) -> Any:
    return asyncio.run(load_image_url(url, pol, param=FIELD))


def refused(url: str, pol: ImagePolicy) -> APIError:
    with pytest.raises(APIError) as info:
        load(url, pol)
    error = info.value
    assert error.status == 400 and error.param == FIELD, error.body()
    assert FIELD in error.message
    return error


def test_an_allowed_small_png_loads_with_its_size(origin: str) -> None:
    image = load(f"http://{origin}/small.png", policy(origin))
    assert image.mode == "RGB" and image.size == (11, 6)
    assert image.tobytes() == gradient(11, 6).tobytes()


def test_a_host_not_allowed_is_refused(origin: str) -> None:
    error = refused(f"http://{origin}/small.png", ImagePolicy(allowed_hosts=("example.org",)))
    assert f"the host {origin} is not in the allowed image hosts" in error.message
    assert "--allowed-image-hosts" in error.message and "example.org" in error.message
    port = origin.rsplit(":", 1)[1]
    other_port = str(int(port) % 60000 + 1)
    error = refused(
        f"http://{origin}/small.png", ImagePolicy(allowed_hosts=(f"127.0.0.1:{other_port}",))
    )
    assert "not in the allowed image hosts" in error.message


def test_no_allowed_host_refuses_every_link(origin: str) -> None:
    error = refused(f"http://{origin}/small.png", ImagePolicy())
    assert "server.allowed_image_hosts, --allowed-image-hosts is empty" in error.message


def test_an_entry_without_a_port_allows_every_port(origin: str) -> None:
    assert load(f"http://{origin}/small.png", ImagePolicy(allowed_hosts=("127.0.0.1",))).size == (
        11,
        6,
    )


def test_a_redirect_to_a_host_not_allowed_is_refused(origin: str) -> None:
    error = refused(f"http://{origin}/redirect-out", policy(origin))
    assert "after 1 redirect, the host localhost" in error.message
    assert "--allowed-image-hosts" in error.message


def test_redirects_within_allowed_hosts_are_followed_up_to_three(origin: str) -> None:
    assert load(f"http://{origin}/redirect-in", policy(origin)).size == (11, 6)
    assert load(f"http://{origin}/chain/2", policy(origin)).size == (11, 6)  # 3 redirects
    error = refused(f"http://{origin}/chain/3", policy(origin))
    assert "redirects more than 3 times" in error.message
    error = refused(f"http://{origin}/redirect-ftp", policy(origin))
    assert "the scheme 'ftp' is not http or https" in error.message


def test_a_50_mb_body_is_refused_without_reading_it(origin: str) -> None:
    started = time.monotonic()
    error = refused(f"http://{origin}/big-declared", policy(origin))
    assert f"is {BIG:,} bytes; the limit is {20 * 1024 * 1024:,}" in error.message
    assert "--max-image-bytes" in error.message
    assert time.monotonic() - started < 5


def test_a_50_mb_streamed_body_is_cut_at_the_limit(origin: str) -> None:
    error = refused(f"http://{origin}/big-streamed", policy(origin, max_bytes=1 << 20))
    assert "larger than 1,048,576 bytes (the download was stopped there)" in error.message
    assert "the limit is 1,048,576 (server.max_image_bytes, --max-image-bytes)" in error.message


def test_a_40k_by_40k_pixel_bomb_is_refused(origin: str) -> None:
    error = refused(f"http://{origin}/bomb.png", policy(origin))
    assert "40,000×40,000 = 1,600,000,000 pixels; the limit is 67,108,864" in error.message
    assert "--max-image-pixels" in error.message


def test_a_non_image_content_type_is_refused(origin: str) -> None:
    error = refused(f"http://{origin}/page.html", policy(origin))
    assert "Content-Type 'text/html'; expected an image (image/*)" in error.message


def test_a_compressed_body_is_refused(origin: str) -> None:
    error = refused(f"http://{origin}/gzip.png", policy(origin))
    assert "127.0.0.1 sent it with Content-Encoding 'gzip'" in error.message


def test_an_error_status_is_refused(origin: str) -> None:
    assert "answered 404" in refused(f"http://{origin}/missing.png", policy(origin)).message


@pytest.mark.parametrize("path", ["/slow-start", "/slow-body"])
def test_a_slow_server_hits_the_total_timeout(origin: str, path: str) -> None:
    started = time.monotonic()
    error = refused(f"http://{origin}{path}", policy(origin, timeout_s=1.0))
    assert time.monotonic() - started < 2.5
    assert "not fetched within 1 s; the limit is 1 s" in error.message
    assert "server.image_fetch_timeout_s, --image-fetch-timeout" in error.message
    assert error.code == "image_fetch_timeout"


def test_credentials_in_the_url_are_refused(origin: str) -> None:
    error = refused(f"http://user:pw@{origin}/small.png", policy(origin))
    assert "user name or password" in error.message


# ---- the address rule (SSRF): a fake DNS, the request still goes to the test server --------
@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}

    async def resolve(host: str, port: int) -> list[str]:
        if host in names:
            return names[host]
        raise OSError(f"unknown host {host}")

    monkeypatch.setattr(image_fetch, "resolve", resolve)
    return names


def test_an_exactly_named_host_connects_to_its_resolved_address(
    origin: str, dns: dict[str, list[str]]
) -> None:
    port = origin.rsplit(":", 1)[1]
    dns["images.test"] = ["127.0.0.1"]
    _Handler.seen_hosts.clear()
    image = load(
        f"http://images.test:{port}/small.png", ImagePolicy(allowed_hosts=("images.test",))
    )
    assert image.size == (11, 6)
    assert _Handler.seen_hosts == [f"images.test:{port}"]  # the name, sent to the address


def test_a_wildcard_host_must_resolve_to_public_addresses(
    origin: str, dns: dict[str, list[str]]
) -> None:
    port = origin.rsplit(":", 1)[1]
    pol = ImagePolicy(allowed_hosts=("*.example.test",))
    for address in (
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.4",
        "169.254.169.254",
        "::1",
        "fd00::1",
        "::ffff:10.0.0.1",
        "100.64.0.1",
        "0.0.0.0",
    ):
        dns["cdn.example.test"] = ["93.184.215.14", address]  # one public, one not
        error = refused(f"http://cdn.example.test:{port}/small.png", pol)
        assert "a non-public address" in error.message, address
        assert "wildcard entry *.example.test" in error.message
    # the domain itself is not a subdomain of itself
    dns["example.test"] = ["127.0.0.1"]
    assert "not in the allowed" in refused(f"http://example.test:{port}/small.png", pol).message


def test_a_name_resolving_to_link_local_is_refused_even_when_listed(
    origin: str, dns: dict[str, list[str]]
) -> None:
    for address in ("169.254.169.254", "fe80::1", "::ffff:169.254.169.254"):
        dns["meta.test"] = [address]
        error = refused(
            "http://meta.test/latest/meta-data", ImagePolicy(allowed_hosts=("meta.test",))
        )
        assert "link-local" in error.message and "--allowed-image-hosts" in error.message


def test_an_unresolvable_host_is_refused(dns: dict[str, list[str]]) -> None:
    error = refused("https://nowhere.test/a.png", ImagePolicy(allowed_hosts=("nowhere.test",)))
    assert "cannot be resolved" in error.message

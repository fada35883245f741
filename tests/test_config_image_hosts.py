"""server.allowed_image_hosts and the image limits: the entry syntax and matching rules
(tallow.config.hosts), the flags, the environment and the YAML file, and the ImagePolicy the
server's state builds from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tallow.config import ConfigError, load_config
from tallow.config.hosts import HostRule, parse_host_rule, split_host_entries
from tallow.server.images import ImagePolicy, policy_from_config

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize(
    "entry, rule",
    [
        ("Images.Example.COM.", HostRule("images.example.com")),
        ("a.com:8080", HostRule("a.com", 8080)),
        ("*.cdn.net", HostRule("cdn.net", wildcard=True)),
        ("*.cdn.net:443", HostRule("cdn.net", 443, wildcard=True)),
        ("127.0.0.1", HostRule("127.0.0.1", address=True)),
        ("127.0.0.1:9000", HostRule("127.0.0.1", 9000, address=True)),
        ("::1", HostRule("::1", address=True)),
        ("[0:0::1]:81", HostRule("::1", 81, address=True)),
        ("bücher.de", HostRule("xn--bcher-kva.de")),
    ],
)
def test_entries_parse(entry: str, rule: HostRule) -> None:
    assert parse_host_rule(entry) == rule
    assert parse_host_rule(str(rule)) == rule  # the normal form reads back the same


@pytest.mark.parametrize(
    "entry, problem",
    [
        ("", "empty entry"),
        ("http://a.com/x", "not a URL"),
        ("a.com:0", "port"),
        ("a.com:http", "port"),
        ("a*.com", "not a valid host name"),
        ("*.10.0.0.1", "not an IP"),
        ("[::1", "needs its ']'"),
        ("-a.com", "not a valid host name"),
        ("user@a.com", "not a URL"),
    ],
)
def test_bad_entries_say_what_is_wrong(entry: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_host_rule(entry)


def test_matching_is_exact_unless_wildcard_and_ports_restrict() -> None:
    exact, port, wild = (parse_host_rule(e) for e in ("a.com", "b.com:8443", "*.c.org"))
    assert exact.matches("a.com", 80) and exact.matches("a.com", 9999)
    assert not exact.matches("img.a.com", 443) and not exact.matches("xa.com", 443)
    assert port.matches("b.com", 8443) and not port.matches("b.com", 443)
    assert wild.matches("x.c.org", 443) and wild.matches("y.x.c.org", 80)
    assert not wild.matches("c.org", 443) and not wild.matches("xc.org", 443)


def test_split_entries_accepts_commas_and_drops_duplicates() -> None:
    assert split_host_entries(["a.com, B.com", "a.com", "*.c.org"]) == ["a.com", "b.com", "*.c.org"]
    assert split_host_entries("x.net") == ["x.net"] and split_host_entries(None) == []


def test_flags_environment_and_file(tmp_path: Path) -> None:
    config = load_config(
        [
            "--allowed-image-hosts",
            "a.com,b.org:8080",
            "--allowed-image-hosts",
            "*.cdn.net",
            "--max-image-bytes",
            "1000",
            "--max-image-pixels",
            "4096",
            "--image-fetch-timeout",
            "2.5",
        ],
        env={},
    )
    server = config.server
    assert server.allowed_image_hosts == ["a.com", "b.org:8080", "*.cdn.net"]
    assert (server.max_image_bytes, server.max_image_pixels, server.image_fetch_timeout_s) == (
        1000,
        4096,
        2.5,
    )
    assert policy_from_config(config) == ImagePolicy(
        ("a.com", "b.org:8080", "*.cdn.net"), 1000, 4096, 2.5
    )
    env = load_config([], env={"TALLOW_SERVER__ALLOWED_IMAGE_HOSTS": "x.com, 127.0.0.1:80"})
    assert env.server.allowed_image_hosts == ["x.com", "127.0.0.1:80"]
    path = tmp_path / "tallow.yaml"
    path.write_text(
        "server:\n  allowed_image_hosts: [img.example.com, 'cdn.example.com:443']\n"
        "  max_image_pixels: 1000000\n  image_fetch_timeout_s: 3\n"
    )
    from_file = load_config(["--config", str(path)], env={})
    assert from_file.server.allowed_image_hosts == ["img.example.com", "cdn.example.com:443"]
    assert policy_from_config(from_file).max_pixels == 1_000_000


def test_defaults_refuse_every_link() -> None:
    config = load_config([], env={})
    assert policy_from_config(config) == ImagePolicy()
    assert ImagePolicy().allowed_hosts == () and policy_from_config(None) == ImagePolicy()


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--allowed-image-hosts", "http://a.com/x"], "server.allowed_image_hosts"),
        (["--max-image-bytes", "0"], "server.max_image_bytes"),
        (["--max-image-pixels", "-5"], "server.max_image_pixels"),
        (["--image-fetch-timeout", "0"], "server.image_fetch_timeout_s"),
    ],
)
def test_bad_values_are_config_errors(args: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(args, env={})


def test_server_state_carries_the_policy() -> None:
    sys.path.insert(0, str(Path(__file__).parent / "server"))
    from server_fakes import FakeEngine

    from tallow.server.state import ServerState

    config = load_config(["--allowed-image-hosts", "img.test", "--max-image-bytes", "77"], env={})
    state = ServerState(FakeEngine(), config)
    assert state.image_policy == ImagePolicy(("img.test",), 77)


def test_documented() -> None:
    api = (DOCS / "api.md").read_text()
    for needle in (
        "--allowed-image-hosts",
        "--max-image-bytes",
        "--max-image-pixels",
        "--image-fetch-timeout",
        "*.",
        "link-local",
        "redirect",
    ):
        assert needle in api, needle

"""``--host`` spellings and the ``tallow serve`` command line."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tallow.server.host import BindAddress, parse_bind


@pytest.mark.parametrize(
    "spec,port,expected",
    [
        ("0.0.0.0", 2000, BindAddress("0.0.0.0", 2000)),
        ("localhost", 8080, BindAddress("localhost", 8080)),
        ("127.0.0.1:9000", 2000, BindAddress("127.0.0.1", 9000)),
        ("my-host.example:1", 2000, BindAddress("my-host.example", 1)),
        ("[::1]:8000", 2000, BindAddress("::1", 8000)),
        ("[::]", 2001, BindAddress("::", 2001)),
        ("::1", 2002, BindAddress("::1", 2002)),
        ("unix:///run/tallow.sock", 2000, BindAddress(uds="/run/tallow.sock")),
        ("unix:/tmp/t.sock", 2000, BindAddress(uds="/tmp/t.sock")),
        ("127.0.0.1:0", 2000, BindAddress("127.0.0.1", 0)),
    ],
)
def test_parse_bind(spec, port, expected) -> None:
    assert parse_bind(spec, port) == expected


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("127.0.0.1:http", "port"),
        ("127.0.0.1:70000", "port"),
        ("[::1", "unclosed"),
        ("[nothost]:80", "IPv6"),
        ("[::1]80", "':port'"),
        ("unix://relative.sock", "absolute"),
        ("bad host", "neither"),
        ("", "empty"),
        ("1:2:3:zz", "IPv6"),
    ],
)
def test_parse_bind_errors_name_the_problem(spec, needle) -> None:
    with pytest.raises(ValueError, match="--host") as info:
        parse_bind(spec)
    assert needle in str(info.value)


def test_urls() -> None:
    assert BindAddress("0.0.0.0", 5).url() == "http://127.0.0.1:5"
    assert BindAddress("::", 5).url() == "http://[::1]:5"
    assert BindAddress(uds="/x.sock").url() == "unix:///x.sock"


def test_serve_parser_has_every_engine_setting() -> None:
    from tallow.config import load_config, setting_flags
    from tallow.server.cli import add_parser, run

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    serve = add_parser(sub)
    flags = {s for action in serve._actions for s in action.option_strings}
    for flag in (
        "--host",
        "--port",
        "--model",
        "--config",
        "--api-key",
        "--tool-parser",
        "--dtype",
        "--max-num-seqs",
        "--block-size",
        "--max-body-bytes",
    ):
        assert flag in flags, flag
    for _, _, flag, _ in setting_flags():
        assert flag is None or flag in flags
    args = parser.parse_args(
        ["serve", "--host", "[::1]:9", "--api-key", "a", "--api-key", "b", "--max-num-seqs", "4"]
    )
    assert args.func is run
    config = load_config(args, env={})
    assert config.server.api_keys == ["a", "b"] and config.scheduler.max_num_seqs == 4
    assert parse_bind(config.server.host, config.server.port) == BindAddress("::1", 9)


def test_bad_host_exits_before_loading_anything() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tallow", "serve", "--host", "nope:port"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--host 'nope:port'" in proc.stderr and "port" in proc.stderr


def test_a_model_that_cannot_load_is_a_clear_error() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tallow",
            "serve",
            "--model",
            "/nonexistent/model.gguf",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "tallow: cannot serve the model:" in proc.stderr
    assert "/nonexistent/model.gguf" in proc.stderr and "Traceback" not in proc.stderr

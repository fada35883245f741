"""``tallow quantize`` against llama.cpp itself: the same GGML type for every tensor and the same
bytes for every block.

This is the authority for the file writer (the rules of ``quantize_mix`` and the block
quantizers of ``quantize`` / ``quantize_kquants``): llama.cpp's ``llama_model_quantize`` (the
function behind ``llama-quantize``, from the pinned ``llama-cpp-python``) and tallow quantize the
same small float GGUF models to every file type tallow writes, and the two files must agree
tensor by tensor. The models cover dense ``llama`` (16 layers, so every layer-position rule
selects something; all rows whole 256-blocks; an untied head; grouped-query attention 2) and
``qwen2`` (9 layers; rows of 288 and 208 weights that need llama.cpp's fallback types, 208 not
even whole 32-blocks; a tied head; GQA 4; q/k/v biases), with F16 and BF16 tensors among the
F32 ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_cpp_oracle import TinyModel, llama_cpp_quantize, tensors_of, write_float_gguf
from tallow_quant_gguf.quantize_file import quantize_checkpoint
from tallow_quant_gguf.quantize_mix import FILE_TYPES, LLAMA_FILE_TYPES

pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python (the core's test extra) is the llama.cpp oracle"
)

MODELS = {
    "llama": TinyModel(
        "llama", layers=16, hidden=256, intermediate=256, heads=4, kv_heads=2, vocab=288, tied=False
    ),
    "qwen2": TinyModel(
        "qwen2", layers=9, hidden=288, intermediate=208, heads=4, kv_heads=1, vocab=300, tied=True
    ),
}


#: 80 layers: llama.cpp's 70B class (for llama only with grouped-query attention), whose Q3_K /
#: Q4_K attn_v it raises to Q5_K; rows of 32 weights keep the files small (every k-quant falls
#: back to a 32-block type, Q5_K's fallback Q5_1 showing the raise)
LARGE = {
    "llama-80-gqa": TinyModel(
        "llama", layers=80, hidden=32, intermediate=32, heads=2, kv_heads=1, vocab=64, tied=False
    ),
    "llama-80-mha": TinyModel(
        "llama", layers=80, hidden=32, intermediate=32, heads=2, kv_heads=2, vocab=64, tied=False
    ),
    "qwen2-80": TinyModel(
        "qwen2", layers=80, hidden=32, intermediate=32, heads=2, kv_heads=2, vocab=64, tied=True
    ),
}


@pytest.fixture(autouse=True)
def one_thread():
    """tallow's CPU quantizer is a stream of small tensor operations; on a shared runner torch's
    intra-op threads spin more than they help, so these tests quantize on one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("float-gguf")
    return {
        name: write_float_gguf(folder / f"{name}-f32.gguf", m, seed=i)
        for i, (name, m) in enumerate(MODELS.items())
    }


def _tallow_quantize(src: Path, out: Path, file_type: str) -> dict:
    from tallow_format_gguf.format import GGUFFormat

    return quantize_checkpoint(GGUFFormat().load(str(src)), out, file_type, progress=False)


def _compare(theirs: Path, ours: Path) -> list[str]:
    """What differs, tensor by tensor (types, then bytes with the first differing block)."""
    import gguf

    want, got = tensors_of(theirs), tensors_of(ours)
    problems = []
    if set(want) != set(got):
        problems.append(
            f"tensor names differ: only llama.cpp {sorted(set(want) - set(got))}, "
            f"only tallow {sorted(set(got) - set(want))}"
        )
    for name in sorted(set(want) & set(got)):
        (wtype, wdata), (gtype, gdata) = want[name], got[name]
        if wtype != gtype:
            problems.append(f"{name}: type {gtype}, llama.cpp {wtype}")
        elif wdata != gdata:
            size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[wtype]][1]
            bad = [
                i for i in range(0, len(wdata), size) if wdata[i : i + size] != gdata[i : i + size]
            ]
            problems.append(
                f"{name} ({wtype}): {len(bad)} of {len(wdata) // size} blocks differ, "
                f"first at byte {bad[0]}"
            )
    return problems


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("file_type", [t for t in FILE_TYPES if t not in ("q3_k", "q5_k")])
def test_tallow_quantize_writes_llama_cpps_types_and_bytes(
    sources: dict[str, Path], tmp_path: Path, model: str, file_type: str
) -> None:
    theirs, ours = tmp_path / "llama-cpp.gguf", tmp_path / "tallow.gguf"
    llama_cpp_quantize(sources[model], theirs, LLAMA_FILE_TYPES[file_type])
    _tallow_quantize(sources[model], ours, file_type)
    assert _compare(theirs, ours) == []
    from gguf import GGUFReader

    assert (
        GGUFReader(ours).fields["general.file_type"].contents()
        == GGUFReader(theirs).fields["general.file_type"].contents()
    )


@pytest.mark.parametrize("model", list(LARGE))
@pytest.mark.parametrize("file_type", ["q2_k", "q3_k_m", "q4_k_s", "q4_k_m"])
def test_70b_class_models_get_llama_cpps_attn_v_types(
    tmp_path: Path, model: str, file_type: str
) -> None:
    src = write_float_gguf(tmp_path / "f32.gguf", LARGE[model], seed=3)
    theirs, ours = tmp_path / "llama-cpp.gguf", tmp_path / "tallow.gguf"
    llama_cpp_quantize(src, theirs, LLAMA_FILE_TYPES[file_type])
    _tallow_quantize(src, ours, file_type)
    assert _compare(theirs, ours) == []
    if file_type == "q4_k_s" and model != "llama-80-mha":  # the raise shows: Q5_K -> Q5_1
        assert tensors_of(ours)["blk.40.attn_v.weight"][0] == "Q5_1"


def test_the_comparison_sees_a_wrong_type_and_a_wrong_block(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    """The check above can fail: a Q4_K_M file differs from Q5_K_M's in types, and two
    quantizers of the same type (Q4_0 via llama.cpp, Q4_0 of perturbed weights) in bytes."""
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    llama_cpp_quantize(sources["llama"], a, LLAMA_FILE_TYPES["q4_k_m"])
    _tallow_quantize(sources["llama"], b, "q5_k_m")
    problems = _compare(a, b)
    assert any("blk.0.attn_q.weight: type Q5_K, llama.cpp Q4_K" in p for p in problems)
    c = tmp_path / "c.gguf"
    write_float_gguf(tmp_path / "other.gguf", MODELS["llama"], seed=7)
    _tallow_quantize(tmp_path / "other.gguf", c, "q4_0")
    llama_cpp_quantize(sources["llama"], a, LLAMA_FILE_TYPES["q4_0"])
    assert any("blocks differ" in p for p in _compare(a, c))

"""FP8 checkpoints on the CPU: tiny random Llama models saved as real checkpoints with their
``quantization_config`` (compressed-tensors' own writer; the HF ``fp8`` format written from its
definition, see ``fp8_checkpoints.py``), loaded by tallow, against transformers running the
same model with the weights dequantized to float32:

- weights only (decode batches, ``gemv_max_rows`` and fewer rows): transformers on the
  dequantized weights;
- W8A8 (``gemv_max_rows: 0``, every product quantizes its activations): compressed-tensors'
  own forward, which fake-quantizes the activations by its scheme (per token, per 128-column
  group, or with the checkpoint's static scale);
- the engine's rule at once (a long prompt quantizes its activations, its decode steps do
  not): transformers with plain-torch hooks that quantize inputs of more than 16 rows.

Logits agree within float32 rounding and greedy tokens are equal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fp8_checkpoints import (
    FakeQuantActivations,
    calibration_inputs,
    oracle_logits,
    tiny_llama,
    write_compressed_tensors,
    write_hf_fp8,
)
from tallow.config import config_from_mapping
from tallow.engine.llm_engine import LLMEngine
from tallow import LLM, SamplingParams
from tallow.plugin.testing.paged_runner import PagedRunner

pytest.importorskip("compressed_tensors", reason="compressed-tensors writes the checkpoints")

PROMPT = [3, 17, 250, 9, 64, 101, 7]
LONG_PROMPT = [(i * 37 + 11) % 300 + 3 for i in range(24)]  # 24 rows: more than 16
CALIBRATION = list(range(3, 60))
STEPS = 6


@pytest.fixture(scope="module")
def float_model():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def checkpoints(float_model, tmp_path_factory):
    """name -> (directory, oracle model with weights dequantized as the format defines)."""
    root = tmp_path_factory.mktemp("fp8")
    out = {}
    for preset in ("FP8", "FP8_DYNAMIC", "FP8_BLOCK"):
        out[preset] = (
            root / preset,
            write_compressed_tensors(float_model, preset, root / preset, CALIBRATION),
        )
    for name, block, static in (
        ("hf-tensor-static", False, True),
        ("hf-tensor", False, False),
        ("hf-block", True, False),
    ):
        dequantized = write_hf_fp8(
            float_model, root / name, block=block, static=static, calibration=CALIBRATION
        )
        oracle = tiny_llama(0)
        oracle.load_state_dict(dequantized, strict=False)
        out[name] = (root / name, oracle)
    return out


def engine_config(directory: Path, **settings):
    return config_from_mapping(
        {
            "model": {
                "source": str(directory),
                "device": "cpu",
                "dtype": "float32",
                "max_model_len": 128,
            },
            "cache": {"num_blocks": 32},
            "plugins": {"settings": {"tallow-quant-fp8": settings}} if settings else {},
        }
    )


def engine(directory: Path, **settings) -> LLMEngine:
    return LLMEngine.from_config(engine_config(directory, **settings))


def tallow_greedy(eng: LLMEngine, prompt: list[int]):
    return PagedRunner(eng.parts.loaded.model).greedy(0, prompt, STEPS)


def assert_close_but_rare_flips(got, expected, scale: float, what: str) -> None:
    """Every logit within 2e-3 of the largest. Activations quantized to e4m3 amplify the last
    bit of a float32 sum: where a value sits on a rounding boundary, the two sides' matrix
    libraries (their summation orders) can round it a whole e4m3 step apart, which moves the
    logits of that position and of the steps after it by up to ~5e-4 of the largest (a
    3-layer model on two CPUs' BLAS), far above float32's noise and far below a wrong scale
    or layout."""
    diff = float((got - expected).abs().max())
    assert diff <= 2e-3 * scale, f"{what}: a logit {diff:.3g} away (largest logit {scale:.3g})"


def assert_same_run(got, expected, what: str) -> None:
    tokens, step_logits, prompt_logits = got
    ref_tokens, ref_prompt, ref_steps = expected
    scale = float(ref_prompt.abs().max())
    assert_close_but_rare_flips(prompt_logits, ref_prompt, scale, f"{what}, prompt logits")
    for i, (a, b) in enumerate(zip(step_logits, ref_steps)):
        assert_close_but_rare_flips(a, b, scale, f"{what}, step {i} logits")
    assert tokens == ref_tokens, what


@pytest.mark.parametrize(
    "name,expected",
    [
        ("FP8", "fp8: e4m3 per tensor, static activation scales; 8 layers, 1 dense"),
        ("FP8_DYNAMIC", "fp8: e4m3 per channel, activations per token; 8 layers, 1 dense"),
        (
            "FP8_BLOCK",
            "fp8: e4m3 128x128 blocks, activations per token and 128 columns; 8 layers, 1 dense",
        ),
        (
            "hf-block",
            "fp8: e4m3 128x128 blocks, activations per token and 128 columns; 8 layers, 1 dense",
        ),
    ],
)
def test_the_scheme_is_chosen_and_keeps_the_weights_in_float8(checkpoints, name, expected):
    eng = engine(checkpoints[name][0])
    loaded = eng.parts.loaded
    assert loaded.quant.summary() == expected
    qkv = loaded.model.model.layers[0].self_attn.qkv_proj
    assert qkv.qweight.dtype == torch.float8_e4m3fn and qkv.qweight.shape == (512, 256)
    # the head the quantizer left out stays dense
    assert loaded.model.lm_head.dense_weight.dtype == torch.float32


@pytest.mark.parametrize(
    "name", ["FP8", "FP8_DYNAMIC", "FP8_BLOCK", "hf-tensor-static", "hf-tensor", "hf-block"]
)
def test_decode_batches_equal_the_dequantized_model(checkpoints, name):
    directory, oracle = checkpoints[name]
    from compressed_tensors.quantization import disable_quantization

    oracle.apply(disable_quantization)  # compressed-tensors' model: weights as dequantized
    got = tallow_greedy(engine(directory), PROMPT)
    assert_same_run(got, oracle_logits(oracle, PROMPT, STEPS), f"{name}, weights only")


@pytest.mark.parametrize("name", ["FP8", "FP8_DYNAMIC", "FP8_BLOCK"])
def test_w8a8_equals_compressed_tensors_fake_quantization(checkpoints, name):
    directory, oracle = checkpoints[name]
    from compressed_tensors.quantization import disable_quantization, enable_quantization

    oracle.apply(enable_quantization)
    try:
        expected = oracle_logits(oracle, PROMPT, STEPS)
    finally:
        oracle.apply(disable_quantization)
    got = tallow_greedy(engine(directory, gemv_max_rows=0), PROMPT)
    assert_same_run(got, expected, f"{name}, W8A8 at every row count")


@pytest.mark.parametrize(
    "name,mode", [("hf-block", "group"), ("hf-tensor-static", "static"), ("FP8_DYNAMIC", "token")]
)
def test_long_prompts_quantize_activations_and_decode_steps_do_not(
    checkpoints, float_model, name, mode
):
    directory, oracle = checkpoints[name]
    from compressed_tensors.quantization import disable_quantization

    oracle.apply(disable_quantization)
    static = None
    if mode == "static":
        static = {k: v / 448.0 for k, v in calibration_inputs(float_model, CALIBRATION).items()}
    hooks = FakeQuantActivations(oracle, mode, gemv_max_rows=16, static_scales=static)
    try:
        expected = oracle_logits(oracle, LONG_PROMPT, STEPS)
    finally:
        hooks.remove()
    got = tallow_greedy(engine(directory), LONG_PROMPT)
    assert_same_run(got, expected, f"{name}, 24-token prompt")
    # and the activation quantization did change the prompt's logits
    plain = oracle_logits(oracle, LONG_PROMPT, 0)[1]
    assert (got[2] - plain).abs().max() > 1e-3 * plain.abs().max()


def test_transformers_reads_the_block_checkpoint_as_written(checkpoints):
    """transformers' own FP8 loader (``FineGrainedFP8Config(dequantize=True)``) dequantizes the
    block-wise checkpoint to the values the test's writer meant."""
    import transformers

    directory, oracle = checkpoints["hf-block"]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        directory,
        quantization_config=transformers.FineGrainedFP8Config(dequantize=True),
        dtype=torch.float32,
    )
    for name, value in oracle.state_dict().items():
        torch.testing.assert_close(
            theirs.state_dict()[name].float(),
            value,
            rtol=0,
            atol=0,
            msg=lambda m, name=name: f"{name}: {m}",
        )


def test_the_engine_generates_the_oracle_tokens(checkpoints):
    directory, oracle = checkpoints["FP8_DYNAMIC"]
    from compressed_tensors.quantization import disable_quantization

    oracle.apply(disable_quantization)
    llm = LLM.from_config(engine_config(directory))
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    (out,) = llm.generate([PROMPT], params)
    assert list(out.outputs[0].token_ids) == oracle_logits(oracle, PROMPT, STEPS)[0]


def test_a_bad_config_stops_the_load_naming_file_and_field(checkpoints, tmp_path):
    import json
    import shutil

    from tallow.plugin import ModelFileError

    directory = tmp_path / "bad"
    shutil.copytree(checkpoints["hf-block"][0], directory)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [64, 64]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelFileError,
        match=r"config\.json: quant scheme 'fp8' .*: "
        r"quantization_config\.weight_block_size: only "
        r"\[128, 128\]",
    ):
        engine(directory)

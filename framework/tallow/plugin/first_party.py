"""Which first-party plugin distribution provides a component, so that an error about a
component that is not installed can name the package to install.

The core keeps this table (it knows its own first-party plugins); it is consulted only to
word error messages, never to load anything. Third-party components are not listed: for them
the registry's message lists what is registered.
"""

from __future__ import annotations

import difflib

#: kind (a registry's ``kind``) → component name → the distribution that registers it
FIRST_PARTY: dict[str, dict[str, str]] = {
    "architecture": {
        **dict.fromkeys(
            ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"],
            "tallow-model-llama",
        ),
        "Glm4ForCausalLM": "tallow-model-glm4",
        "GraniteForCausalLM": "tallow-model-granite",
        "Olmo2ForCausalLM": "tallow-model-olmo2",
        "Phi3ForCausalLM": "tallow-model-phi3",
        **dict.fromkeys(["BertModel", "RobertaModel", "XLMRobertaModel"], "tallow-model-bert"),
        **dict.fromkeys(
            ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeLiteForCausalLM"],
            "tallow-model-deepseek",
        ),
        **dict.fromkeys(
            [
                "Gemma2ForCausalLM",
                "Gemma3ForCausalLM",
                "Gemma3ForConditionalGeneration",
                "Gemma4ForCausalLM",
                "Gemma4ForConditionalGeneration",
            ],
            "tallow-model-gemma",
        ),
        "Glm4MoeForCausalLM": "tallow-model-glm4-moe",
        "GptOssForCausalLM": "tallow-model-gpt-oss",
        **dict.fromkeys(["GPTNeoXForCausalLM", "StableLmForCausalLM"], "tallow-model-gptneox"),
        "MixtralForCausalLM": "tallow-model-mixtral",
        "MiniMaxM2ForCausalLM": "tallow-model-minimax-m2",
        **dict.fromkeys(
            [
                "Qwen2_5_VLForConditionalGeneration",
                "Qwen2VLForConditionalGeneration",
                "Qwen3VLForConditionalGeneration",
            ],
            "tallow-model-qwen2-vl",
        ),
        **dict.fromkeys(
            ["Llama4ForCausalLM", "Llama4ForConditionalGeneration"], "tallow-model-llama4"
        ),
        **dict.fromkeys(["Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"], "tallow-model-qwen-moe"),
        **dict.fromkeys(
            [
                "Qwen3NextForCausalLM",
                "Qwen3_5ForCausalLM",
                "Qwen3_5MoeForCausalLM",
                "Qwen3_5ForConditionalGeneration",
                "Qwen3_5MoeForConditionalGeneration",
            ],
            "tallow-model-qwen3-next",
        ),
    },
    # the ``general.architecture`` of a GGUF file → the model plugin that reads it
    "gguf_architecture": {
        "llama": "tallow-model-llama",
        "qwen2": "tallow-model-llama",
        "qwen3": "tallow-model-llama",
        "glm4": "tallow-model-glm4",
        "granite": "tallow-model-granite",
        "gemma2": "tallow-model-gemma",
        "gemma3": "tallow-model-gemma",
        "gemma4": "tallow-model-gemma",
        "qwen2moe": "tallow-model-qwen-moe",
        "qwen3moe": "tallow-model-qwen-moe",
        "olmo2": "tallow-model-olmo2",
        "phi3": "tallow-model-phi3",
        "qwen3next": "tallow-model-qwen3-next",
        "qwen35": "tallow-model-qwen3-next",
        "qwen35moe": "tallow-model-qwen3-next",
    },
    "weight_format": {
        "gguf": "tallow-format-gguf",
        "safetensors": "tallow-format-safetensors",
        "hfhub": "tallow-format-hfhub",
    },
    "quant_scheme": {
        "fp4": "tallow-quant-fp4",
        "fp8": "tallow-quant-fp8",
        "gguf": "tallow-quant-gguf",
        "int4": "tallow-quant-int4",
    },
    # a checkpoint's ``quantization_config.quant_method`` → the quant scheme plugin serving it
    # (compressed-tensors is served by several, by its content, so it is not listed)
    "quant_method": {
        "fp8": "tallow-quant-fp8",
        "mxfp4": "tallow-quant-fp4",
        **dict.fromkeys(
            ["gptq", "gptq_marlin", "awq", "awq_marlin", "marlin"], "tallow-quant-int4"
        ),
    },
    "tool_parser": {
        "gemma4": "tallow-tool-gemma4",
        "glm45": "tallow-tool-glm",
        "harmony": "tallow-reasoning-harmony",
        "hermes": "tallow-tool-hermes",
        "json": "tallow-tool-json",
        "llama3_json": "tallow-tool-llama3",
        "minimax_m2": "tallow-tool-minimax",
        "mistral": "tallow-tool-mistral",
        "pythonic": "tallow-tool-pythonic",
        "qwen3_coder": "tallow-tool-qwen3-coder",
    },
    "reasoning_parser": {
        "think": "tallow-reasoning-think",
        "deepseek_r1": "tallow-reasoning-think",
        "harmony": "tallow-reasoning-harmony",
        "gemma4": "tallow-reasoning-gemma4",
    },
    "grammar_backend": {
        "xgrammar": "tallow-grammar-xgrammar",
        "llguidance": "tallow-grammar-llguidance",
    },
    "kv_codec": {
        "fp8": "tallow-kvcache-fp8",
        "fp8_e4m3": "tallow-kvcache-fp8",
        "fp8_e5m2": "tallow-kvcache-fp8",
        "turbo8": "tallow-kvcache-turboquant",
        "turbo4": "tallow-kvcache-turboquant",
        "turbo3": "tallow-kvcache-turboquant",
    },
    "attention_backend": {
        "triton": "tallow-attention-triton",
        "flashinfer": "tallow-attention-flashinfer",
    },
    "tool_provider": {"mcp": "tallow-mcp-client"},
    "speculator": {"ngram": "tallow-speculator-ngram", "replay": "tallow-speculator-ngram"},
}


def provider_of(kind: str, name: str) -> str | None:
    """The first-party distribution that provides the ``kind`` component ``name``, if any."""
    return FIRST_PARTY.get(kind, {}).get(name)


def install_hint(kind: str, name: str, registered: list[str], unloaded: str = "") -> str:
    """The end of an error about the ``kind`` component ``name``, which is not registered.

    ``unloaded`` is what the plugin manager says of installed plugins that did not load and may
    provide it (``Registry.missing_hint``). A first-party component is named with its
    distribution and, unless ``unloaded`` explains why it is missing, the pip command; another
    name gets the names it may be a typo of (``registered`` and the first-party names of the
    kind); ``unloaded`` follows."""
    dist = provider_of(kind, name)
    if dist is not None:
        if unloaded:  # it names the installed plugin and why it did not load
            return unloaded
        return f"; it is provided by the first-party plugin {dist}: pip install {dist}"
    known = sorted(set(registered) | set(FIRST_PARTY.get(kind, {})))
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    typo = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return typo + unloaded

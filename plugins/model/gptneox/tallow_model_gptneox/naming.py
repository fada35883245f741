"""How Hugging Face checkpoint names map onto the GPT-NeoX model's parameters.

The tallow model keeps the Hugging Face names, so most rules map a name onto itself. Two
differ: Pythia checkpoints call the output head ``embed_out`` (newer transformers writes
``lm_head``), and the fused ``query_key_value`` projection stores its rows per head
(``[head][q | k | v][head_dim]``), which :meth:`GPTNeoXForCausalLM.split_heads_qkv` reorders
into tallow's ``[q heads | k heads | v heads]`` before loading.
"""

from tallow.layers import WeightNameMap, WeightRule

_L = "gpt_neox.layers.{i}"


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names of ``GPTNeoXForCausalLM``."""
    return WeightNameMap(
        [
            WeightRule("gpt_neox.embed_in.weight", "gpt_neox.embed_in.weight"),
            WeightRule(f"{_L}.input_layernorm.{{p}}", f"{_L}.input_layernorm.{{p}}"),
            WeightRule(
                f"{_L}.post_attention_layernorm.{{p}}", f"{_L}.post_attention_layernorm.{{p}}"
            ),
            WeightRule(
                f"{_L}.attention.query_key_value.{{p}}",
                f"{_L}.attention.query_key_value.{{p}}",
                transform="split_heads_qkv",
                rowwise=True,
            ),
            WeightRule(f"{_L}.attention.dense.{{p}}", f"{_L}.attention.dense.{{p}}"),
            WeightRule(f"{_L}.mlp.dense_h_to_4h.{{p}}", f"{_L}.mlp.dense_h_to_4h.{{p}}"),
            WeightRule(f"{_L}.mlp.dense_4h_to_h.{{p}}", f"{_L}.mlp.dense_4h_to_h.{{p}}"),
            # buffers older checkpoints saved: the causal mask and the rotary frequencies
            WeightRule(f"{_L}.attention.bias"),
            WeightRule(f"{_L}.attention.masked_bias"),
            WeightRule(f"{_L}.attention.rotary_emb.inv_freq"),
            WeightRule("gpt_neox.final_layer_norm.{p}", "gpt_neox.final_layer_norm.{p}"),
            WeightRule("embed_out.weight", "lm_head.weight"),
            WeightRule("lm_head.weight", "lm_head.weight"),
        ]
    )

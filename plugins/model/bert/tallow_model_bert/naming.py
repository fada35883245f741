"""How Hugging Face BERT checkpoint names map onto the parameters of the tallow model.

Parameters (layer ``i``)::

    embeddings.word_embeddings.weight               [vocab, hidden]
    embeddings.position_embeddings.weight           [max_positions, hidden]
    embeddings.token_type_embeddings.weight         [type_vocab, hidden]
    embeddings.LayerNorm.{weight,bias}              [hidden]
    encoder.layer.i.attention.self.qkv_proj.*       [3 * hidden, hidden]   shards q, k, v
    encoder.layer.i.attention.output.dense.*        [hidden, hidden]
    encoder.layer.i.attention.output.LayerNorm.*    [hidden]
    encoder.layer.i.intermediate.dense.*            [intermediate, hidden]
    encoder.layer.i.output.dense.*                  [hidden, intermediate]
    encoder.layer.i.output.LayerNorm.*              [hidden]

Checkpoint names are the same except ``attention.self.{query,key,value}`` (the q, k, v shards
of ``qkv_proj``) and the ``gamma``/``beta`` of older LayerNorms (``weight``/``bias``). A
checkpoint saved from a task model carries the base model's prefix (``bert.``, ``roberta.``),
which the loader removes (``base_model_prefix``). BERT's ``pooler`` (a dense layer and tanh over
the first token, trained for next-sentence prediction) and masked-LM heads (``cls.*``,
``lm_head.*``) take no part in embeddings and are passed over.
"""

from __future__ import annotations

from tallow.layers import WeightNameMap, WeightRule

_L = "encoder.layer.{i}"


def _norm(at: str) -> list[WeightRule]:
    return [
        WeightRule(f"{at}.LayerNorm.weight", f"{at}.LayerNorm.weight"),
        WeightRule(f"{at}.LayerNorm.bias", f"{at}.LayerNorm.bias"),
        WeightRule(f"{at}.LayerNorm.gamma", f"{at}.LayerNorm.weight"),
        WeightRule(f"{at}.LayerNorm.beta", f"{at}.LayerNorm.bias"),
    ]


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names of BertModel, RobertaModel, XLMRobertaModel."""
    return WeightNameMap(
        [
            WeightRule("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
            WeightRule(
                "embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"
            ),
            WeightRule(
                "embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"
            ),
            *_norm("embeddings"),
            WeightRule("embeddings.position_ids"),
            WeightRule("embeddings.token_type_ids"),
            WeightRule(
                f"{_L}.attention.self.query.{{p}}", f"{_L}.attention.self.qkv_proj.{{p}}", shard="q"
            ),
            WeightRule(
                f"{_L}.attention.self.key.{{p}}", f"{_L}.attention.self.qkv_proj.{{p}}", shard="k"
            ),
            WeightRule(
                f"{_L}.attention.self.value.{{p}}", f"{_L}.attention.self.qkv_proj.{{p}}", shard="v"
            ),
            WeightRule(f"{_L}.attention.output.dense.{{p}}", f"{_L}.attention.output.dense.{{p}}"),
            *_norm(f"{_L}.attention.output"),
            WeightRule(f"{_L}.intermediate.dense.{{p}}", f"{_L}.intermediate.dense.{{p}}"),
            WeightRule(f"{_L}.output.dense.{{p}}", f"{_L}.output.dense.{{p}}"),
            *_norm(f"{_L}.output"),
            WeightRule("pooler.dense.{p}"),
            WeightRule("cls.{a}.{b}"),
            WeightRule("cls.{a}.{b}.{c}"),
            WeightRule("cls.{a}.{b}.{c}.{d}"),
            WeightRule("lm_head.{a}"),
            WeightRule("lm_head.{a}.{b}"),
        ]
    )

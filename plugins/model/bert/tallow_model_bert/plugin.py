"""Registration of the BERT-family encoders (lazy targets: no torch imported here)."""

from __future__ import annotations

from tallow.plugin import hookimpl

_MODEL = "tallow_model_bert.model"

# HF architectures name -> class
ARCHITECTURES: dict[str, str] = {
    "BertModel": "BertModel",
    "RobertaModel": "RobertaModel",
    "XLMRobertaModel": "XLMRobertaModel",
}


@hookimpl
def tallow_register_architectures(registry) -> None:
    for hf_name, cls in ARCHITECTURES.items():
        registry.register(hf_name, f"{_MODEL}:{cls}")

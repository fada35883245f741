"""tallow-model-bert registers its encoders lazily, through its entry point, as embedding-only
architectures; the random all-MiniLM-L6-v2 shape is served for embeddings."""

from __future__ import annotations

from tallow.plugin import ArchitectureRegistry
from tallow.plugin.testing import modules_imported_by_registration


def test_registration_imports_no_torch() -> None:
    assert (
        modules_imported_by_registration(
            "tallow_model_bert.plugin", "tallow_register_architectures", "ArchitectureRegistry"
        )
        == []
    )


def test_every_architecture_is_registered_to_its_class() -> None:
    from tallow_model_bert import model, plugin

    registry = ArchitectureRegistry()
    plugin.tallow_register_architectures(registry)
    for name in ("BertModel", "RobertaModel", "XLMRobertaModel"):
        cls = registry.entry(name).load()
        assert cls is getattr(model, name) and name in cls.hf_architectures
        assert cls.tasks == ("embed",) and cls.default_pooling == "mean"


def test_the_installed_plugin_serves_the_random_minilm_shape() -> None:
    from tallow import LLM

    llm = LLM("random:all-minilm-l6-v2", device="cpu", max_model_len=32, max_num_seqs=4)
    assert llm.engine.task == "embed" and llm.engine.max_model_len == 32
    assert llm.engine.parts.loaded.architecture.distribution == "tallow-model-bert"
    (out,) = llm.embed([[101, 7592, 2088, 102]])
    assert len(out.embedding) == 384
    assert abs(sum(x * x for x in out.embedding) - 1.0) < 1e-5

"""Registration of {{ cookiecutter.project_slug }}'s components.

tallow imports this module at start-up (it is named by the entry point), so it stays cheap:
components are registered as lazy "module:attr" strings and imported only when used.
"""

from __future__ import annotations

from typing import Any

from tallow.plugin import hookimpl

DISTRIBUTION = "{{ cookiecutter.project_slug }}"
COMPONENT = "{{ cookiecutter.component_name }}"

#: settings read from the config's plugins.settings["{{ cookiecutter.project_slug }}"]
settings: dict[str, Any] = {}
{% if cookiecutter.kind == "tool-parser" %}

@hookimpl
def tallow_register_tool_parsers(registry: Any) -> None:
    registry.register(COMPONENT, "{{ cookiecutter.package_name }}.parser:CallLineParser")
{% elif cookiecutter.kind == "model" %}

@hookimpl
def tallow_register_architectures(registry: Any) -> None:
    # the Hugging Face ``architectures`` name in config.json
    registry.register(COMPONENT, "{{ cookiecutter.package_name }}.model:ArceeForCausalLM")
{% elif cookiecutter.kind == "weight-format" %}

@hookimpl
def tallow_register_weight_formats(registry: Any) -> None:
    registry.register(COMPONENT, "{{ cookiecutter.package_name }}.npz_format:NpzFormat",
                      priority=20)
{% elif cookiecutter.kind == "quant-scheme" %}

@hookimpl
def tallow_register_quant_schemes(registry: Any) -> None:
    # Checkpoints whose config.json says quantization_config.quant_method: COMPONENT come to
    # this scheme. quant_methods=("compressed-tensors", ...) would add methods that other
    # schemes serve too; the scheme's detect() then claims its own checkpoints among them.
    registry.register(COMPONENT, "{{ cookiecutter.package_name }}.scheme:RowInt8Scheme",
                      quant_methods=())
{% elif cookiecutter.kind == "kv-codec" %}

@hookimpl
def tallow_register_kv_codecs(registry: Any) -> None:
    # bits: what one K or V element takes, listed by `tallow plugins list`
    registry.register(COMPONENT, "{{ cookiecutter.package_name }}.codec:Float16KVCodec", bits=16)
{% elif cookiecutter.kind == "attention-backend" %}

@hookimpl
def tallow_register_attention_backends(registry: Any) -> None:
    # below the core's triton backend, above its torch reference (priority -100)
    registry.register(COMPONENT, "{{ cookiecutter.package_name }}.backend:DenseTorchBackend",
                      priority=-50)
{% elif cookiecutter.kind == "tool-provider" %}

@hookimpl
def tallow_register_tool_providers(registry: Any) -> None:
    registry.register(COMPONENT, "{{ cookiecutter.package_name }}.provider:ClockToolProvider")
{% elif cookiecutter.kind == "routes" %}

@hookimpl
def tallow_register_routes(registry: Any) -> None:
    registry.register(COMPONENT, "{{ cookiecutter.package_name }}.routes:status_page",
                      methods=("GET",))
{% elif cookiecutter.kind == "grammar-backend" %}

@hookimpl
def tallow_register_grammar_backends(registry: Any) -> None:
    # below tallow-grammar-xgrammar (priority 100): name it in runner.grammar_backend to use it
    registry.register(COMPONENT, "{{ cookiecutter.package_name }}.grammar:ScanBackend",
                      priority=-50)
{% endif %}

@hookimpl
def tallow_configure(config: Any) -> None:
    settings.clear()
    settings.update(config.plugins.settings.get(DISTRIBUTION, {}))

"""Keep the component module of the chosen kind; remove the others."""

from pathlib import Path

MODULES = {
    "tool-parser": "parser.py",
    "model": "model.py",
    "weight-format": "npz_format.py",
    "quant-scheme": "scheme.py",
    "kv-codec": "codec.py",
    "attention-backend": "backend.py",
    "tool-provider": "provider.py",
    "routes": "routes.py",
    "grammar-backend": "grammar.py",
}
package = Path("{{ cookiecutter.package_name }}")
for kind, module in MODULES.items():
    if kind != "{{ cookiecutter.kind }}":
        (package / module).unlink()

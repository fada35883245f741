"""What tests/test_plugins_alone.py runs inside one plugin's isolated environment.

Run by that environment's interpreter with one JSON argument (``report``: where to write the
findings; ``package``: the plugin's top-level module; ``hidden``: the modules of the first-party
plugins this environment must not see; ``pytest``: pytest's arguments, or null). In order:

1. the plugin's tests (``pytest.main``), first, so that they start from a fresh interpreter;
2. which tallow distributions the environment's metadata holds, and which hidden modules
   import machinery would still find (both must show the construction leaks nothing);
3. every module of the plugin's package imported (an import of an undeclared first-party
   plugin fails here);
4. ``tallow plugins list --json --import-components``: the plugin manager discovers the entry
   points, loads and registers each plugin, and imports every registered component.

The report (with the seconds each step took) is written after each step, so a crash leaves
what was found so far.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as metadata
import importlib.util
import io
import json
import pkgutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _write(path: Path, report: dict[str, Any]) -> None:
    path.write_text(json.dumps(report, indent=2))


def _tallow_distributions() -> list[str]:
    names = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "tallow" or name.startswith("tallow-"):
            names.add(name)
    return sorted(names)


def _import_all(package: str) -> dict[str, str]:
    """Import ``package`` and every module under it; module → the error of each that fails."""
    failures: dict[str, str] = {}

    def failed(name: str) -> None:
        failures[name] = traceback.format_exc(limit=-3)

    try:
        root = importlib.import_module(package)
    except Exception:
        failed(package)
        return failures
    for info in pkgutil.walk_packages(root.__path__, f"{package}.", onerror=failed):
        try:
            importlib.import_module(info.name)
        except Exception:
            failed(info.name)
    return failures


def main() -> int:
    spec = json.loads(sys.argv[1])
    path = Path(spec["report"])
    report: dict[str, Any] = {"seconds": {}}
    clock = time.monotonic()

    def done(step: str) -> None:
        nonlocal clock
        report["seconds"][step] = round(time.monotonic() - clock, 2)
        clock = time.monotonic()
        _write(path, report)

    if spec["pytest"] is not None:
        import pytest

        report["pytest"] = int(pytest.main(spec["pytest"]))
        done("pytest")
    report["distributions"] = _tallow_distributions()
    report["visible_hidden_modules"] = [
        m for m in spec["hidden"] if importlib.util.find_spec(m) is not None
    ]
    report["import_failures"] = _import_all(spec["package"])
    done("import")

    from tallow.cli import main as tallow_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = tallow_main(["plugins", "list", "--json", "--import-components"])
    report["plugins_list"] = {"status": status, "stderr": err.getvalue()[-4000:]}
    if status == 0:
        report["plugins_list"]["plugins"] = json.loads(out.getvalue())
    done("plugins_list")
    return 0


if __name__ == "__main__":
    sys.exit(main())

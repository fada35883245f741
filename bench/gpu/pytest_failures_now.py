"""A pytest plugin for runs on the GPU machine: every failure's report is appended to the file
named by ``TALLOW_FAILURES_LOG`` as soon as it happens, so a run stopped by the call's time limit
still brings back its tracebacks (pytest prints them only at the end).

Load it with ``-p pytest_failures_now`` and ``bench/gpu`` on ``PYTHONPATH``."""

from __future__ import annotations

import os

import pytest

_config: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def _write(title: str, text: str) -> None:
    path = os.environ.get("TALLOW_FAILURES_LOG")
    # xdist workers forward their reports to the controller, which writes them once
    if not path or (_config is not None and hasattr(_config, "workerinput")):
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"==== {title}\n{text[-6000:]}\n\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _write(f"{report.nodeid} ({report.when})", report.longreprtext)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write(f"collecting {report.nodeid}", report.longreprtext)

"""Damaged model files are refused with :class:`tallow.plugin.ModelFileError`, before anything
is allocated from their contents.

The corpus (:mod:`model_file_corpus`, beside this module) damages two tiny intact models — a
``llama`` GGUF and a Hugging Face safetensors directory — in every way the formats can be
damaged: truncations, flipped bytes in the magic, the counts, key lengths, dimensions and
types, corrupt safetensors headers, and counts that disagree with the tensors. Every case goes
through the engine's loader (:func:`tallow.engine.loader.load_model`, the path ``tallow serve``
takes) and must raise ``ModelFileError`` naming the damaged file and the field at fault.

**Memory, hangs and crashes.** All cases run in one worker process (a crash there cannot take
pytest down, and the process as a whole has a timeout). The worker first loads both intact
models — importing everything and reaching the steady memory of a load — and then runs each
case under:

- ``tracemalloc``: the peak of memory allocated during the case through Python's allocators,
  numpy arrays included (numpy reports its data buffers to tracemalloc). This is exact and
  independent of the machine's load. The budget of a case is the size of its file plus a fixed
  1 MiB for the Python objects of parsing a header: a count read from a corrupt file and
  trusted (a 4,278,190,104-layer model, a 2**40-item array) exceeds it by orders of magnitude.
- the process's peak resident size (``ru_maxrss``), which also sees memory that tracemalloc
  does not (torch tensors, the tokenizers library): it may grow by no more than the file's
  size plus 32 MiB of allocator noise.
- a per-case alarm (a case must finish in seconds) and an address-space limit 2 GiB above the
  warmed-up process, so that a runaway allocation fails inside the worker instead of
  exhausting the machine.

Two sweeps damage every byte of a header in turn, and items 5 and 6 of the robustness issue
have their own regression tests at the end.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys
from typing import Any

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from model_file_corpus import (  # noqa: E402
    BLOCKS,
    CASE_IDS,
    FLIPPED_24,
    Case,
    GGUFLayout,
    build_corpus,
    put_value,
    vocabulary,
    write_gguf,
    write_hf_dir,
    xor_byte,
)

CASE_SECONDS = 20
WORKER_SECONDS = 300
TRACED_SLACK = 1 << 20
RSS_SLACK = 32 << 20


# ---------------------------------------------------------------------------------------------
# The worker: loads every case in a process of its own and measures it
# ---------------------------------------------------------------------------------------------
class CaseTimeout(Exception):
    """A case ran past :data:`CASE_SECONDS`."""


def _max_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _limit_address_space(extra: int) -> None:
    import resource

    with open("/proc/self/status") as status:
        vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, resource.RLIM_INFINITY))


def run_worker(spec_path: str) -> None:
    """Load the intact models, then every case; print one JSON result per case."""
    import gc
    import signal
    import time
    import tracemalloc

    import torch

    from tallow.engine.loader import load_model
    from tallow.plugin.testing import isolated_plugin_manager

    spec = json.loads(pathlib.Path(spec_path).read_text())
    pm = isolated_plugin_manager(
        ("tallow-format-gguf", "tallow_format_gguf.plugin"),
        ("tallow-format-safetensors", "tallow_format_safetensors.plugin"),
        ("tallow-model-llama", "tallow_model_llama.plugin"),
        builtins=True,
    )
    cpu = torch.device("cpu")
    for source in spec["intact"]:
        load_model(pm.registries, source, device=cpu)
    gc.collect()
    _limit_address_space(2 << 30)

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"still loading after {CASE_SECONDS} s")

    signal.signal(signal.SIGALRM, on_alarm)
    tracemalloc.start()
    for case in spec["cases"]:
        rss_before = _max_rss()
        tracemalloc.reset_peak()
        traced_before = tracemalloc.get_traced_memory()[0]
        started = time.monotonic()
        signal.alarm(CASE_SECONDS)
        error: BaseException | None = None
        try:
            load_model(pm.registries, case["source"], device=cpu)
        except BaseException as exc:  # noqa: BLE001 - every outcome is reported to the test
            error = exc
        finally:
            signal.alarm(0)
        result = {
            "id": case["id"],
            "seconds": time.monotonic() - started,
            "traced_peak": tracemalloc.get_traced_memory()[1] - traced_before,
            "rss_growth": _max_rss() - rss_before,
            "error_classes": [c.__name__ for c in type(error).__mro__] if error else [],
            "message": str(error) if error else "",
        }
        del error
        print(json.dumps(result), flush=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Case], dict[str, Any]]:
    """Every case with the worker's result for it."""
    root = tmp_path_factory.mktemp("model-files")
    intact, cases = build_corpus(root)
    spec = root / "spec.json"
    spec.write_text(
        json.dumps({"intact": intact, "cases": [{"id": c.id, "source": c.source} for c in cases]})
    )
    proc = subprocess.run(
        [sys.executable, __file__, str(spec)],
        capture_output=True,
        text=True,
        timeout=WORKER_SECONDS,
        env={**os.environ, "TALLOW_PLUGINS": ""},
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            results[item["id"]] = item
    assert proc.returncode == 0, (
        f"the worker ended with status {proc.returncode} after {len(results)} of {len(cases)} "
        f"cases:\n{proc.stderr[-4000:]}"
    )
    return {c.id: c for c in cases}, results


def _check(case: Case, result: dict[str, Any]) -> None:
    message = result["message"]
    assert "ModelFileError" in result["error_classes"], (
        f"{case.id}: expected ModelFileError, got {result['error_classes'][:1] or 'no error'}: "
        f"{message}"
    )
    assert case.at_fault in message, (
        f"{case.id}: the message does not name {case.at_fault}: {message}"
    )
    problem = message.replace(case.at_fault, "")  # case ids name their damage: not a clue
    for fragment in case.fragments:
        assert fragment in problem, f"{case.id}: {fragment!r} not in: {message}"
    assert result["traced_peak"] <= case.size + TRACED_SLACK, (
        f"{case.id}: {result['traced_peak']:,} bytes allocated for a file of {case.size:,}"
    )
    assert result["rss_growth"] <= case.size + RSS_SLACK, (
        f"{case.id}: resident memory grew by {result['rss_growth']:,} bytes"
    )
    assert result["seconds"] < CASE_SECONDS


@pytest.mark.timeout(WORKER_SECONDS + 60)
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_damaged_file_is_refused_naming_the_file(corpus, case_id: str) -> None:
    cases, results = corpus
    assert case_id in results, f"{case_id}: the worker reported no result"
    _check(cases[case_id], results[case_id])


# ---------------------------------------------------------------------------------------------
# Every byte of a header, damaged in turn
# ---------------------------------------------------------------------------------------------
#: flipped bits by position: the lowest (a count one off), the highest, all
_MASKS = (0x01, 0x80, 0xFF)


def _flipped(data: bytes, upto: int) -> Any:
    for at in range(upto):
        yield at, xor_byte(data, at, _MASKS[at % len(_MASKS)])


def _write_fresh(path: pathlib.Path, data: bytes) -> None:
    # a new file each time: an earlier file's memory map stays valid
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.mark.timeout(240)
def test_every_damaged_byte_of_a_gguf_header_is_read_or_refused(tmp_path) -> None:
    """A flipped byte anywhere before the tensor data either leaves a readable model (a
    token's spelling, a float) whose every tensor dequantizes, or is refused with
    ModelFileError naming the file; never another exception. A small vocabulary keeps the
    header (and so the sweep) short."""
    from tallow_format_gguf.format import GGUFFormat

    intact = write_gguf(tmp_path / "intact.gguf", tokens_cut=len(vocabulary()[0]) - 12)[0]
    layout = GGUFLayout.of(intact)
    path = tmp_path / "damaged.gguf"
    failures, refused = [], 0
    for at, data in _flipped(layout.data, layout.data_start):
        _write_fresh(path, data)
        try:
            checkpoint = GGUFFormat().load(str(path))
            for _ in checkpoint.tensors():
                pass
        except Exception as exc:  # noqa: BLE001 - what matters is which
            refused += 1
            if not (type(exc).__name__ == "ModelFileError" and str(path) in str(exc)):
                failures.append(f"byte {at}: {type(exc).__name__}: {exc}")
    assert not failures, f"{len(failures)} damaged bytes escaped:\n" + "\n".join(failures[:10])
    assert refused > layout.data_start // 3  # the sweep reached the structure, not only text


@pytest.mark.timeout(240)
def test_every_damaged_byte_of_a_safetensors_header_is_judged_as_the_library_judges_it(
    tmp_path,
) -> None:
    """A flipped byte in the length or the JSON header: tallow refuses the file (naming it)
    exactly when the safetensors library cannot read it, and reads every tensor otherwise."""
    from safetensors import safe_open

    from tallow_format_safetensors.loader import load_directory

    root = write_hf_dir(tmp_path / "m")
    path = root / "model.safetensors"
    intact = path.read_bytes()
    header_end = 8 + struct.unpack_from("<Q", intact)[0]
    failures = []
    for at, data in _flipped(intact, header_end):
        _write_fresh(path, data)
        try:
            with safe_open(str(path), framework="pt") as f:
                library = {name: f.get_tensor(name).shape for name in f.keys()}
        except Exception:  # noqa: BLE001 - the library's verdict: unreadable
            library = None
        try:
            checkpoint = load_directory(root)
            ours = {name: t.shape for name, t in checkpoint.tensors()}
        except Exception as exc:  # noqa: BLE001
            ours = None
            if not (type(exc).__name__ == "ModelFileError" and str(path) in str(exc)):
                failures.append(f"byte {at}: {type(exc).__name__}: {exc}")
                continue
            detail = str(exc)
        if (library is None) != (ours is None):
            verdict = "refused" if ours is None else "accepted"
            failures.append(
                f"byte {at}: tallow {verdict} what the library "
                f"{'reads' if library is not None else 'refuses'}"
                + (f" ({detail})" if ours is None else "")
            )
        elif ours is not None:
            assert ours == library, at
    assert not failures, f"{len(failures)} disagreements:\n" + "\n".join(failures[:10])


# ---------------------------------------------------------------------------------------------
# Regression tests: items 5 and 6 of the robustness issue
# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(WORKER_SECONDS + 60)
def test_item5_corrupt_block_count_fails_before_the_model_is_built(corpus) -> None:
    """4,278,190,104 blocks were attempted: now the count is checked against the tensors."""
    cases, results = corpus
    result = results["block-count-flipped"]
    _check(cases["block-count-flipped"], result)
    assert f"tensors for {BLOCKS} blocks" in result["message"]
    assert result["traced_peak"] < 1 << 20 and result["seconds"] < 5


@pytest.mark.timeout(WORKER_SECONDS + 60)
def test_item6_damaged_metadata_names_the_file_and_key(corpus) -> None:
    """A bare ``IndexError`` from the gguf package, with no file name, before."""
    cases, results = corpus
    for case_id in ("array-length-huge", "string-length-huge", "truncated-in-metadata"):
        _check(cases[case_id], results[case_id])
        assert "IndexError" not in results[case_id]["message"]


@pytest.mark.timeout(WORKER_SECONDS + 60)
def test_item6_truncated_gguf_says_truncated(corpus) -> None:
    """ "cannot reshape array" before."""
    cases, results = corpus
    for case_id in ("truncated-in-data", "truncated-last-byte"):
        _check(cases[case_id], results[case_id])
        assert "reshape" not in results[case_id]["message"]


@pytest.mark.timeout(WORKER_SECONDS + 60)
def test_item6_safetensors_header_errors_name_the_file(corpus) -> None:
    cases, results = corpus
    for case_id in (
        "st-header-length-past-end",
        "st-header-not-json",
        "st-dtype-unknown",
        "st-offsets-out-of-range",
    ):
        _check(cases[case_id], results[case_id])


@pytest.mark.timeout(WORKER_SECONDS + 60)
def test_item6_wrong_block_count_names_the_metadata_field(corpus) -> None:
    """A list of "missing parameters" before, instead of the inconsistent field."""
    cases, results = corpus
    for case_id in ("block-count-plus-one", "block-count-minus-one"):
        result = results[case_id]
        _check(cases[case_id], result)
        assert "missing parameters" not in result["message"]


@pytest.mark.timeout(300)
def test_the_server_reports_a_damaged_model_in_one_line(tmp_path) -> None:
    """``tallow serve`` on a damaged GGUF exits at start-up naming the file and the field,
    without a traceback."""
    intact = write_gguf(tmp_path / "model.gguf")[0]
    layout = GGUFLayout.of(intact)
    intact.write_bytes(put_value(layout.data, layout.values["llama.block_count"], "<I", FLIPPED_24))
    proc = subprocess.run(
        [sys.executable, "-m", "tallow", "serve", "--model", str(intact), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "TALLOW_CACHE_DIR": str(tmp_path)},
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("tallow:")]
    assert line == (
        f"tallow: cannot serve the model: {intact}: metadata 'llama.block_count': "
        "4278190104, but the file holds tensors for 2 blocks (blk.0 ... blk.1)"
    )


if __name__ == "__main__":
    run_worker(sys.argv[1])

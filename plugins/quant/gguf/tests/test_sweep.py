"""The tuning sweep of ``bench/gpu/quant_micro.py`` on a CPU with a fake timer: every candidate
of every cell is tried, the ones that fail to compile, raise or compute a wrong product are
reported and never chosen, slow ones are not timed further, and the table it writes (after
every shape) is the fastest valid candidate per cell, in the format the plugin reads."""

from __future__ import annotations

import argparse
import importlib.util
import json
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tallow_quant_gguf.reference import dequantize_ref
from tallow_quant_gguf.tuning import TunedTable, bucket, candidates

SCRIPT = Path(__file__).resolve().parents[4] / "bench" / "gpu" / "quant_micro.py"
N, K = 64, 512


@pytest.fixture
def sweep(monkeypatch):
    spec = importlib.util.spec_from_file_location("quant_micro_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "DEVICE", "cpu")
    return module


def fake_time(choice) -> float:
    """A made-up, fixed time per configuration (microseconds' worth of seconds)."""
    return 1e-6 * (1 + zlib.crc32(repr(choice).encode()) % 1000)  # 1 us to 1 ms


def test_sweep_skips_failures_and_writes_the_fastest_valid_choice(
    sweep, monkeypatch, tmp_path, capsys
):
    cells = [(qtype, m) for qtype in ("Q4_K", "Q8_0") for m in (1, 4, 64)]
    # per cell, the three fastest candidates fail: one at compile time, one raises, one is wrong
    doomed = {}
    for qtype, m in cells:
        ranked = sorted(candidates(qtype, N, K, m), key=fake_time)
        doomed[(qtype, m)] = ranked[:3]
    not_compiled = {sweep._variant_key(q, K, c[0]): "boom" for (q, _), c in doomed.items()}
    # a variant key covers several candidates (split counts); those are all left out
    compiled_out = {
        (q, m): [c for c in candidates(q, N, K, m) if sweep._variant_key(q, K, c) in not_compiled]
        for q, m in cells
    }
    last = {}

    def fake_run(x, p, choice):
        last["choice"] = choice
        q, m = p.type_name, x.shape[0]
        if choice == doomed[(q, m)][1]:
            raise RuntimeError("out of resources")
        y = F.linear(x.float(), dequantize_ref(p))
        return torch.zeros_like(y) if choice == doomed[(q, m)][2] else y

    def fake_seconds(fn, copies, iters=10):
        last["choice"] = None  # the engine's choice and bf16 do not go through _run
        fn(0)
        return fake_time(last["choice"])

    def fake_once(fn):
        fn()
        return fake_time(last["choice"])

    monkeypatch.setattr(sweep, "_run", fake_run)
    monkeypatch.setattr(sweep, "seconds", fake_seconds)
    monkeypatch.setattr(sweep, "once", fake_once)
    monkeypatch.setattr(sweep, "precompile", lambda cells, jobs: dict(not_compiled))
    saves = []
    args = argparse.Namespace(
        types="Q4_K,Q8_0",
        shapes=f"tiny={N}:{K}",
        rows="1,4,64",
        sweep=True,
        table=str(tmp_path / "t.json"),
        output=str(tmp_path / "all.json"),
        budget=1e9,
        jobs=1,
    )
    results = sweep.run(args, lambda r: (saves.append(len(r)), sweep.save(args, r)))
    sweep.save(args, results)

    assert saves == [2, 4, 5, 6]  # after each shape of each pass: rows 1 and 4, then 64
    table = TunedTable.load(tmp_path / "t.json")
    assert len(table.entries) == len(cells)
    printed = capsys.readouterr().out
    for row in results:
        q, m = row["type"], row["m"]
        refused = {
            c
            for c in candidates(q, N, K, m)
            if c in compiled_out[(q, m)] or c in doomed[(q, m)][1:]
        }
        valid = [c for c in candidates(q, N, K, m) if c not in refused]
        fastest = min(valid, key=fake_time)
        chosen = table.choose(q, N, K, m)
        assert chosen is not None and (chosen.path, chosen.config) == (fastest.path, fastest.config)
        assert {w for w, _ in row["wrong"]} == {str(c) for c in refused}
        for c in refused:
            assert f"!! {c}" in printed
        # the candidates timed further are within SLOW_FACTOR of the best found before them
        assert row["candidates"][0][0] == row["best_s"] == fake_time(fastest)
        assert len(row["candidates"]) + len(row["slow"]) + len(row["wrong"]) == len(
            candidates(q, N, K, m)
        )
        assert all(
            t > max(sweep.SLOW_FACTOR * row["best_s"], sweep.SLOW_FLOOR) for t, *_ in row["slow"]
        )
    assert any(row["slow"] for row in results)
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["device"] == "cpu" and written["format"] == 1
    assert {(e["type"], e["m"]) for e in written["entries"]} == set(cells)
    assert bucket(4) == 4 and json.loads((tmp_path / "all.json").read_text())["results"]


def test_sweep_stops_at_its_budget_and_keeps_what_it_has(sweep, monkeypatch, tmp_path):
    monkeypatch.setattr(sweep, "precompile", lambda cells, jobs: {})
    monkeypatch.setattr(sweep, "seconds", lambda fn, copies, iters=10: (fn(0), 1e-5)[1])
    args = argparse.Namespace(
        types="Q4_0",
        shapes=f"a={N}:{K},b={N}:{K}",
        rows="1",
        sweep=False,
        table=None,
        output=None,
        budget=-1.0,
        jobs=1,
    )
    assert sweep.run(args) == []
    args.budget = 1e9
    assert [r["shape"] for r in sweep.run(args)] == ["a", "b"]


def test_a_restricted_sweep_merges_its_cells_into_an_existing_table(sweep, monkeypatch, tmp_path):
    """``--rows 16,64 --merge`` (the ``quanttunelarge`` item): the cells timed replace the
    base table's entries of their buckets, every other entry is kept as it was."""
    from tallow_quant_gguf.tuning import table_json

    monkeypatch.setattr(sweep, "precompile", lambda cells, jobs: {})
    monkeypatch.setattr(sweep, "seconds", lambda fn, copies, iters=10: (fn(0), 1e-5)[1])
    monkeypatch.setattr(sweep, "once", lambda fn: (fn(), 1e-5)[1])
    monkeypatch.setattr(sweep, "_run", lambda x, p, choice: F.linear(x.float(), dequantize_ref(p)))
    kept = [
        dict(
            type="Q4_K",
            n=N,
            k=K,
            m=m,
            path="mma",
            config=[16, 32, 8, 2, 3, 1, 1],
            us=7.0,
            bf16_us=5.0,
        )
        for m in (1, 4, 16, 64)
    ]
    kept[0].update(path="gemv", config=[4, 1, 1, True])
    other_shape = dict(kept[2], n=2 * N)
    base = tmp_path / "shipped.json"
    base.write_text(json.dumps(table_json(kept + [other_shape], "cpu")))
    args = argparse.Namespace(
        types="Q4_K",
        shapes=f"tiny={N}:{K}",
        rows="16,64",
        sweep=True,
        table=str(tmp_path / "t.json"),
        output=None,
        budget=1e9,
        jobs=1,
        merge=str(base),
    )
    sweep.save(args, sweep.run(args))
    table = json.loads((tmp_path / "t.json").read_text())
    cells = {(e["n"], e["m"]): e for e in table["entries"]}
    assert set(cells) == {(N, 1), (N, 4), (N, 16), (N, 64), (2 * N, 16)}
    assert cells[(N, 1)] == kept[0] and cells[(N, 4)] == kept[1]  # not timed: kept
    assert cells[(2 * N, 16)] == other_shape
    for m in (16, 64):  # timed: the sweep's fastest (all equal here: the first candidate)
        assert cells[(N, m)]["us"] == 10.0 and cells[(N, m)]["path"] in ("mma", "dequant")
    # a table of another GPU is not merged
    base.write_text(json.dumps(table_json(kept, "NVIDIA H100")))
    with pytest.raises(SystemExit, match="a table of 'NVIDIA H100'"):
        sweep.tuned_table([], str(base))

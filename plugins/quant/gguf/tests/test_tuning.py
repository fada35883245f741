"""How a quantized matmul picks its kernel: row buckets, the defaults, tuned tables (reading,
validation, overrides by the settings) and the sweep's candidates."""

from __future__ import annotations

import json

import pytest

from tallow_quant_gguf.tuning import (
    BUCKETS,
    CONFIG_LENGTHS,
    DEQUANT_MIN_ROWS,
    Choice,
    TunedTable,
    bucket,
    candidates,
    choose,
    default_choice,
    table_json,
)

LLAMA_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]


def test_rows_fall_in_buckets():
    assert [bucket(m) for m in (1, 2, 4, 5, 16, 17, 64, 65, 256, 257, 512, 513, 9000)] == [
        1,
        4,
        4,
        16,
        16,
        64,
        64,
        256,
        256,
        512,
        512,
        4096,
        4096,
    ]
    assert BUCKETS[0] == 1


def test_defaults_by_rows():
    assert default_choice("Q4_K", 28672, 4096, 1).path == "gemv"
    # few row blocks: the one-row GEMV splits K so that every SM gets work
    assert default_choice("Q4_K", 4096, 14336, 1).config[2] > 1
    assert default_choice("Q4_K", 128256, 4096, 1).config[2] == 1
    assert default_choice("Q8_0", 4096, 4096, 7).path == "mma"
    assert default_choice("Q8_0", 4096, 4096, 300).path == "mma"
    assert default_choice("Q8_0", 4096, 4096, 2048).path == "dequant"


def test_sweep_table_round_trip(tmp_path):
    best = [
        dict(
            type="Q4_K",
            n=4096,
            k=4096,
            m=1,
            path="gemv",
            config=[8, 2, 1, True],
            us=3.1,
            bf16_us=9.5,
        ),
        dict(type="Q4_K", n=4096, k=4096, m=16, path="mma", config=[16, 64, 8, 4, 3, 2, 1]),
        dict(type="Q4_K", n=4096, k=4096, m=512, path="dequant", config=[]),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table_json(best, "NVIDIA H200", triton="3.6.0")))
    table = TunedTable.load(path)
    assert table.choose("q4_k", 4096, 4096, 1) == Choice("gemv", (8, 2, 1, True))
    assert table.choose("Q4_K", 4096, 4096, 9) == Choice("mma", (16, 64, 8, 4, 3, 2, 1))
    assert table.choose("Q4_K", 4096, 4096, 100) is None  # no entry for that bucket
    assert table.choose("Q8_0", 4096, 4096, 1) is None
    assert list(table.shapes()) == [("Q4_K", 4096, 4096)]
    # the settings' overrides
    assert choose(table, "Q4_K", 4096, 4096, 1).config == (8, 2, 1, True)
    assert choose(table, "Q4_K", 4096, 4096, 400).path == "dequant"
    assert choose(table, "Q4_K", 4096, 4096, 400, matmul="fused").path == "mma"
    assert choose(table, "Q4_K", 4096, 4096, 400, dequant_min_rows=1000).path == "mma"
    assert choose(table, "Q4_K", 4096, 4096, 16, dequant_min_rows=16).path == "dequant"
    assert choose(table, "Q4_K", 4096, 4096, 1, matmul="dequant").path == "dequant"


def test_rows_between_two_measured_paths_take_the_one_estimated_faster():
    """Q4_K gate_up of the H200 table at 1ac7cb4: the tensor-core kernel at 256 rows (501 us,
    bf16 90 us), the workspace at 512 (795 us, bf16 157 us)."""
    mma = Choice("mma", (64, 128, 4, 8, 3, 1, 2))
    cells = [
        dict(
            type="Q4_K",
            n=28672,
            k=4096,
            m=256,
            path="mma",
            config=list(mma.config),
            us=501.04,
            bf16_us=90.15,
        ),
        dict(
            type="Q4_K", n=28672, k=4096, m=512, path="dequant", config=[], us=795.04, bf16_us=157.1
        ),
    ]
    table = TunedTable.from_json(table_json(cells, "NVIDIA H200"))
    # 300 rows: mma ~587 us (grows with M), workspace ~740 us (its decoding + bf16 at 300)
    assert table.choose("Q4_K", 28672, 4096, 300) == mma
    # 450 rows: mma ~881 us, workspace ~779 us
    assert table.choose("Q4_K", 28672, 4096, 450) == Choice("dequant")
    assert table.choose("Q4_K", 28672, 4096, 512) == Choice("dequant")  # measured there
    # without the times (a hand-written table) the bucket's entry stands
    bare = [{k: v for k, v in c.items() if k not in ("us", "bf16_us")} for c in cells]
    assert TunedTable.from_json(table_json(bare, "x")).choose("Q4_K", 28672, 4096, 300) == Choice(
        "dequant"
    )
    # the same path on both sides: the bucket's entry, whatever the times
    same = [dict(cells[0], m=64), cells[0]]
    assert TunedTable.from_json(table_json(same, "x")).choose("Q4_K", 28672, 4096, 65) == mma
    # a one-row entry is never the row below
    one = [
        dict(
            type="Q4_K",
            n=28672,
            k=4096,
            m=1,
            path="gemv",
            config=[8, 2, 1, False],
            us=44.5,
            bf16_us=52.6,
        ),
        dict(cells[1], m=4),
    ]
    assert TunedTable.from_json(table_json(one, "x")).choose("Q4_K", 28672, 4096, 2) == Choice(
        "dequant"
    )
    # the engine's choice passes through the same rule
    assert choose(table, "Q4_K", 28672, 4096, 300) == mma


def test_the_sweep_times_the_workspace_above_the_decode_buckets():
    assert DEQUANT_MIN_ROWS == 17
    for m in (16, 17, 40):
        paths = {c.path for c in candidates("Q4_K", 4096, 4096, m)}
        assert ("dequant" in paths) == (m >= 17), m


@pytest.mark.parametrize(
    "entry, message",
    [
        (dict(n=1, k=32, m=1, path="gemv", config=[4, 1, 1, True]), "'type' must be a str"),
        (dict(type="Q4_K", n=1, k=32, m=1, path="fast", config=[]), "path must be one of"),
        (dict(type="Q4_K", n=1, k=32, m=1, path="gemv", config=[4, 1]), "list of 4 integers"),
        (dict(type="Q4_K", n=1, k=32, m=0, path="dequant", config=[]), "must be positive"),
    ],
)
def test_bad_tables_are_refused_with_the_field(entry, message):
    with pytest.raises(ValueError, match=message):
        TunedTable.from_json({"format": 1, "entries": [entry]}, "t.json")
    with pytest.raises(ValueError, match="format 7"):
        TunedTable.from_json({"format": 7, "entries": []})


def test_candidates_are_valid_configurations():
    for n, k in LLAMA_8B:
        for qtype in ("Q4_K", "Q8_0"):
            for m in (1, 4, 16, 64, 256, 512, 4096):
                found = candidates(qtype, n, k, m)
                assert found and len(set(found)) == len(found)
                for c in found:
                    assert len(c.config) == CONFIG_LENGTHS[c.path]
                    assert c.path != "gemv" or m == 1
                paths = {c.path for c in found}
                assert ("gemv" in paths) == (m == 1) and ("dequant" in paths) == (m >= 17)
                assert default_choice(qtype, n, k, m).path in paths
    corners = candidates("Q4_K", 4096, 4096, 1, corners=True)
    assert {c.path for c in corners} == {"gemv", "mma"} and len(corners) <= 6

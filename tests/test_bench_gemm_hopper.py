"""benchmarks/bench_gemm_hopper.py (CPU; torch is needed only on the GPU machine): how it takes
turns between the two sides and how its table reports them."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_gemm_hopper as bench  # noqa: E402


def test_rounds_flip_the_side_timed_first_and_heat_each_side_before_its_timing():
    calls = []

    def side(name):
        def timed(ms):
            calls.append((name, ms))
            return float(len(calls))
        return timed

    ours, theirs = bench.paired_rounds(side("ours"), side("theirs"), rounds=3, timed_ms=700, heat_ms=300)
    assert [name for name, _ in calls] == ["ours", "ours", "theirs", "theirs", "theirs", "theirs", "ours", "ours",
                                           "ours", "ours", "theirs", "theirs"]
    # each kept timing is the second of its pair: the first ran untimed, as heat, for heat_ms
    assert [ms for _, ms in calls] == [300, 700] * 6
    assert ours == [2.0, 8.0, 10.0] and theirs == [4.0, 6.0, 12.0]
    calls.clear()
    assert bench.paired_rounds(side("ours"), side("theirs"), rounds=2) == ([1.0, 4.0], [2.0, 3.0])
    assert [ms for _, ms in calls] == [100.0] * 4


def test_settling_turns_alternate_untimed_before_the_first_round():
    calls = []

    def side(name):
        def timed(ms):
            calls.append(name)
            return float(len(calls))
        return timed

    ours, theirs = bench.paired_rounds(side("ours"), side("theirs"), rounds=2, settle=3)
    assert calls[:6] == ["ours", "theirs"] * 3
    # the rounds start after them, in the usual flipping order, and keep none of their times
    assert calls[6:] == ["ours", "theirs", "theirs", "ours"]
    assert ours == [7.0, 10.0] and theirs == [8.0, 9.0]


def test_the_table_gives_each_ratio_with_the_spread_of_its_pairs():
    row = {"case": "fp16 4096³ NN", "best_config": "Config[matmul_wgmma](...)", "ms": 0.2, "tflops": 690,
           "cublas_ms": 0.19, "cublas_tflops": 720, "ratio": 0.95, "round_ratios": [0.9 + 0.01 * i for i in range(11)],
           "graph_ms": 0.21, "cublas_graph_ms": 0.2, "graph_ratio": 0.952, "graph_round_ratios": [0.95, 0.96],
           "same_clock_ms": 0.2, "cublas_same_clock_ms": 0.2, "same_clock_ratios": [1.0, 1.0],
           "family_ms": {"matmul_wgmma": 0.2, "matmul_tc": 0.34, "dlight": 1.7, "gemv": None}, "tune_s": 4.2}
    short = dict(row, case="decode 1×4096×4096")
    for key in ("same_clock_ms", "cublas_same_clock_ms", "same_clock_ratios"):
        short.pop(key)
    text = bench.markdown([row, short, {"case": "odd", "error": "ValueError: no"}], "H100")
    lines = text.splitlines()
    assert "| 0.95× (0.91–0.99) |" in lines[4] and "| 1.00× (1.00–1.00) |" in lines[4]
    assert "| – |" in lines[5]  # no samples at one clock for a kernel timed in graphs only
    assert lines[6].startswith("| odd | FAILED: ValueError: no") and lines[6].count("|") == lines[2].count("|")

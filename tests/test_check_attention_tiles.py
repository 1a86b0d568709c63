"""check_attention_tiles (CPU): its tile syntax, refusals, clock windows and table, without a GPU."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "check_attention_tiles.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_setup  # noqa: E402
import check_attention_tiles as cat  # noqa: E402


def test_tiles_parse_into_configs_and_a_bad_one_is_named():
    configs = cat.parse_tiles("128x128x3p, 128x64x2")
    assert [(c.block, c.pipeline_stages, c.persistent) for c in configs] == [((128, 128), 3, True), ((128, 64), 2, False)]
    assert cat.label_of(configs[0]) == "128x128, 3 stages, persistent"
    assert "'128x'" in cat.parse_tiles("128x128x2,128x")
    mma, mma32 = cat.parse_tiles("128x64x2m,128x64x2m32")  # the mma.sync kernel's
    assert mma.kind == "attention_mma" and cat.label_of(mma) == "mma.sync (warps of 16) 128x64, 2 stages"
    assert mma32.warp == (32,) and cat.label_of(mma32) == "mma.sync (warps of 32) 128x64, 2 stages"
    assert "dividing the block's" in cat.parse_tiles("24x64x2m")


def test_a_bad_tile_or_case_is_one_line_and_exit_2():
    for argv in (["--tiles", "12x3"], ["--only", "prefill_9k"]):
        done = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_each_timer_keeps_its_windows_and_the_sampler_averages_inside_them():
    windows = {}
    timers = cat.watched({"a": lambda ms: ms / 10, "b": lambda ms: ms / 5}, windows)
    medians, errors = bench_setup.timed_rounds(timers, rounds=3, round_ms=30.0)
    assert medians == {"a": 3.0, "b": 6.0} and not errors
    assert len(windows["a"]) == len(windows["b"]) == 6  # an untimed run and a timed one a round
    sampler = bench_setup.Sampler.__new__(bench_setup.Sampler)
    sampler.samples = [(1.0, 1500.0, 600.0), (2.0, 1700.0, 500.0), (3.5, 1600.0, 650.0)]
    assert sampler.within([(0.5, 1.5), (3.0, 4.0)]) == {"clock_mhz": 1550.0, "power_w": 625.0}
    assert sampler.between(5.0, 6.0) == {"clock_mhz": None, "power_w": None}


def test_the_table_has_a_row_a_config_and_torch():
    rows = [{"case": "prefill_8k", "shape": "B1 H32 TQ8192 TKV8192 d128", "config": "128x128, 2 stages", "ms": 1.8,
             "tflops": 610.0, "vs_torch": 1.05, "registers": 168, "verified": True, "error": ""},
            {"case": "prefill_8k", "shape": "B1 H32 TQ8192 TKV8192 d128", "config": "torch SDPA", "ms": 1.89,
             "tflops": 581.0, "vs_torch": 1.0, "error": ""}]
    text = cat.markdown(rows, "NVIDIA H200")
    assert "| prefill_8k | B1 H32 TQ8192 TKV8192 d128 | 128x128, 2 stages | 1.8000 | 610.0 | 1.050x | 168 | True |" in text
    assert "| torch SDPA | 1.8900 |" in text

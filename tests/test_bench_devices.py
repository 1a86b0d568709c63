"""benchmarks/bench_devices.py: its refusals in one line (the run itself needs two GPUs)."""

import os
import subprocess
import sys

from fastdlight.arch import has_gpu
from fastdlight.config import Config
from fastdlight.relax.apply_fast_tuning import FunctionReport

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_devices.py")


def run(*argv):
    return subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=120, check=False)


def test_bad_devices_are_one_line():
    done = run("--devices", "0,0")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --devices '0,0': expected distinct GPU indices, e.g. 0,1"]


def test_without_a_gpu_it_says_so():
    if has_gpu():
        return
    done = run()
    assert done.returncode == 2 and done.stderr.strip() == "error: bench_devices needs CUDA GPUs"


def test_a_row_shows_each_run_and_both_ratios():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    # benchmarks/ is on sys.path only from the line above
    import bench_devices

    row = {"model": "m", "devices": [0, 1], "one_s": 10, "one_jobs": 4, "one_wide_s": 8, "one_wide_jobs": 8,
           "many_s": 5, "many_jobs": 8, "one_per_s": 1.0, "one_wide_per_s": 1.25, "many_per_s": 2.0,
           "speedup": 2.0, "speedup_same_jobs": 1.6, "differing": ["f: matmul_tc 0.0100 ms / matmul_tc 0.0120 ms"],
           "differing_one_gpu": [], "one_longest": {"function": "attention", "s": 6.5, "candidates": 8},
           "many_longest": {}}
    table = bench_devices.markdown([row, {"model": "broken", "error": "ValueError: no"}]).splitlines()
    assert table[2] == "| m | 0,1 | 10 (4) | 8 (8) | 5 (8) | 1.0 / 1.25 / 2.0 | 2.0x | 1.6x | 1 / 0 | 6.5 (attention) / - |"
    assert table[3].endswith("| ValueError: no | - |")


def test_the_longest_function_is_the_one_that_took_longest_from_start_to_pick():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    # benchmarks/ is on sys.path only from the line above
    import bench_devices

    entries = [FunctionReport("add", "tuned", 0.8, candidates=4), FunctionReport("matmul", "tuned", 5.25, candidates=20),
               FunctionReport("norm", "database", 0.1)]
    assert bench_devices.longest_function(entries) == {"function": "matmul", "s": 5.25, "candidates": 20}
    assert bench_devices.longest_function([]) == {}


def test_differing_winners_name_their_place_and_a_kernel_measured_twice():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    # benchmarks/ is on sys.path only from the line above
    import bench_devices

    tile = Config("matmul_wgmma", block=(128, 128), warp=(64, 128), rstep=(64,))
    one = {"f": FunctionReport("f", "tuned", 1.0, tile, 0.0100, rank=2),
           "g": FunctionReport("g", "tuned", 1.0, tile, 0.0100, rank=0),
           "h": FunctionReport("h", "tuned", 1.0, None, 0.0100)}
    many = {"f": FunctionReport("f", "tuned", 1.0, tile, 0.0130, rank=2),
            "g": FunctionReport("g", "tuned", 1.0, Config("matmul_tc", block=(64, 64), warp=(32, 32), rstep=(32,)), 0.0101, rank=5),
            "h": FunctionReport("h", "tuned", 1.0, None, 0.0102)}
    assert bench_devices.differing(one, many) == [
        "f: matmul_wgmma #2 0.0100 ms / matmul_wgmma #2 0.0130 ms (same config)",
        "g: matmul_wgmma #0 0.0100 ms / matmul_tc #5 0.0101 ms"]

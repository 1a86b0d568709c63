"""benchmarks/bench_devices.py: its refusals in one line (the run itself needs two GPUs)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_devices.py")


def run(*argv):
    return subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=120, check=False)


def test_bad_devices_are_one_line():
    done = run("--devices", "0,0")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --devices '0,0': expected distinct GPU indices, e.g. 0,1"]


def test_without_a_gpu_it_says_so():
    from fastdlight.arch import has_gpu

    if has_gpu():
        return
    done = run()
    assert done.returncode == 2 and done.stderr.strip() == "error: bench_devices needs CUDA GPUs"

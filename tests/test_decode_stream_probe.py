"""benchmarks/decode_stream_probe.cu (CPU): the probe compiles for Hopper with nvcc, each of its
kernels (every load form, every merge at 16, 8 and 4 chunks, the ordered one's included) into the cubin without spills."""

import pathlib
import shutil
import subprocess

import pytest

PROBE = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "decode_stream_probe.cu"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_the_probe_compiles_for_hopper_without_spills(tmp_path):
    run = subprocess.run(["nvcc", "-O3", "-arch=sm_90a", "-std=c++17", "-cubin", "-Xptxas", "-v", str(PROBE),
                          "-o", str(tmp_path / "probe.cubin")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    log = run.stderr
    for kernel in ("ldg_read", "cpasync_read", "bulk_read", "cpasync_seq", "grid_stride", "step_none", "step_ticket", "step_ordered",
                   "step_cluster"):
        assert kernel in log, kernel
    assert "bytes spill stores" in log and all(" 0 bytes spill stores" in line for line in log.splitlines()
                                               if "spill stores" in line)

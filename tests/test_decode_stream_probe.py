"""benchmarks/decode_stream_probe.cu (CPU): the probe compiles for Hopper with nvcc, each of its
kernels (every load form, the equal runs of keys, the granules taken from a counter, every merge
at 16, 8 and 4 chunks, the timeline's parts) into the cubin without spills, and none but the one
that measures it puts static shared memory ahead of its ring."""

import pathlib
import re
import shutil
import subprocess

import pytest

PROBE = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "decode_stream_probe.cu"
KERNELS = ("ldg_read", "cpasync_read", "bulk_read", "cpasync_seq", "grid_stride", "flat_read", "steal_read",
           "chunk_done", "step_none", "step_ticket", "step_cluster", "step_flagged", "step_parts")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_the_probe_compiles_for_hopper_without_spills(tmp_path):
    run = subprocess.run(["nvcc", "-O3", "-arch=sm_90a", "-std=c++17", "-cubin", "-Xptxas", "-v", str(PROBE),
                          "-o", str(tmp_path / "probe.cubin")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    log = run.stderr
    for kernel in KERNELS:
        assert kernel in log, kernel
    assert "bytes spill stores" in log and all(" 0 bytes spill stores" in line for line in log.splitlines()
                                               if "spill stores" in line)
    # each entry's "Used ..." line: static shared memory would sit ahead of the dynamic ring and move
    # it off its 128-byte alignment; only step_parts' padded variant (STATIC_PAD: ...Lb1E) has it
    entries = re.findall(r"entry function '(\w+)'.*?(Used [^\n]*)", log, re.S)
    assert len(entries) > len(KERNELS)
    padded = [name for name, used in entries if "bytes smem" in used]
    assert padded and all("step_parts" in name and name.endswith("Lb1EEvPK5uint4PfS3_Pi") for name in padded), padded

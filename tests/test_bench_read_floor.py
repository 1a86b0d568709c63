"""bench_read_floor (CPU): the read kernel builds as our kernels do, its grids cover the bytes,
bad names are refused in one line, the table shows what is missing."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_read_floor.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_read_floor as brf  # noqa: E402


def test_a_one_pass_grid_covers_every_word_once_and_a_persistent_one_is_capped_by_the_sms():
    nbytes = 23_000_000 - 23_000_000 % 16
    ctas = brf.grid_of(nbytes, 256, 8, 0, 132)
    assert (ctas - 1) * 256 * 8 < nbytes // 16 <= ctas * 256 * 8
    assert brf.grid_of(nbytes, 256, 8, 4, 132) == 4 * 132
    assert brf.grid_of(4096, 256, 8, 4, 132) == 1  # fewer words than one CTA's pass


def test_enough_copies_rotate_that_each_launch_reads_from_memory():
    assert brf.rotated_copies(23_000_000, 60_000_000) * 23_000_000 >= 3 * 60_000_000
    assert brf.rotated_copies(900_000_000, 60_000_000) == 2


def test_the_read_kernel_builds_to_a_dependent_launch_whose_wait_comes_first():
    pytest.importorskip("tvm")
    # TVM (and fastdlight's compiler, which imports it) is optional here: the other tests run without it
    import tvm

    from fastdlight.arch import CUDA
    from fastdlight.compiler.compile import build, compile_mod_to_cubin, cuda_source

    arch = CUDA(tvm.target.Target("nvidia/nvidia-h100"))
    nbytes = 1 << 20
    kernel = brf.read_kernel(nbytes, 256, 8, brf.grid_of(nbytes, 256, 8, 0, arch.sm_count))
    source = cuda_source(build(tvm.IRModule({"read_floor": kernel}), arch.target))
    body = source[source.index("read_floor_kernel(uint* __restrict__ O_ptr, uint* __restrict__ P_ptr) {"):]
    assert body.index("griddepcontrol_wait()") < body.index("fdl_read_floor(")
    assert "for (int u = 0; u < 8; ++u)" in source and f"{nbytes // 16}LL" in source
    _, cubin = compile_mod_to_cubin(tvm.IRModule({"read_floor": kernel}), arch.target)
    assert cubin.binary


def test_a_chunked_kernel_reads_each_ctas_chunk_of_each_region_or_a_groups_in_turns():
    pytest.importorskip("tvm")
    # TVM (and fastdlight's compiler, which imports it) is optional here: the other tests run without it
    import tvm

    from fastdlight.compiler.compile import compile_mod_to_cubin

    for name, shapes in brf.CHUNKED.items():
        assert name in brf.SIZES and shapes
    target = tvm.target.Target("nvidia/nvidia-h100")
    for ctas, group in ((17, 1), (34, 17)):
        kernel = brf.read_kernel(1 << 20, 128, 4, ctas, streams=2, group=group)
        source, cubin = compile_mod_to_cubin(tvm.IRModule({"read_floor": kernel}), target)
        assert f"region = 65536LL / 2, groups = {ctas} / {group}" in source and cubin.binary
        assert f"base += {group} * block" in source
    assert "in turns" in brf.chunked_label(128, 4, 34, 2, 17) and "turns" not in brf.chunked_label(128, 4, 17, 2)


def test_each_cache_hinted_load_assembles_into_the_read_kernel():
    pytest.importorskip("tvm")
    # TVM (and fastdlight's compiler, which imports it) is optional here: the other tests run without it
    import tvm

    from fastdlight.compiler.compile import compile_mod_to_cubin

    target = tvm.target.Target("nvidia/nvidia-h100")
    for load, instruction in brf.LOADS.items():
        kernel = brf.read_kernel(1 << 20, 128, 4, 17, streams=2, load=load)
        source, cubin = compile_mod_to_cubin(tvm.IRModule({"read_floor": kernel}), target)
        assert cubin.binary and (instruction in source if instruction else "__ldg(p)" in source), load
        assert source.count("fdl_load16(") == 2  # its definition and the unrolled loop's one load


def test_an_unknown_size_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, SCRIPT, "--only", "w4a16"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_the_table_has_a_row_a_size_with_dashes_for_what_is_missing():
    rows = [{"size": "w4a16_layer", "mb": 23.25, "ms": 0.0062, "tbs": 3.75, "best": "256 threads, 8 loads",
             "chunked_ms": None, "cublas_layer": "1x2816x4096", "cublas_ms": 0.0075, "cublas_tbs": 3.08,
             "ours_ms": None}]
    md = brf.markdown(rows, "NVIDIA H200").splitlines()
    assert md[-1] == ("| w4a16_layer | 23.25 | 0.0062 | 3.75 | 256 threads, 8 loads | - | - | - | 1x2816x4096 | 0.0075 "
                      "| 3.08 | - | - |")

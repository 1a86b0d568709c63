"""check_fp8_tiles (CPU): its default tiles are configs the wgmma template takes for the FP8
cases (the ping-pong cluster compiled to a cubin), bad tiles and cases are one line, and the
table has a row a tile."""

import os
import subprocess
import sys

import tvm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "check_fp8_tiles.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import check_fp8_tiles as cft  # noqa: E402
from bench_energy import tile_config  # noqa: E402
from fastdlight import ops  # noqa: E402
from fastdlight.arch import CUDA  # noqa: E402
from fastdlight.compiler.compile import build, compile_cubin, cuda_source  # noqa: E402
from fastdlight.schedules import apply_config  # noqa: E402

H100 = CUDA("nvidia/nvidia-h100")


def test_default_tiles_are_the_templates_configs_for_each_default_case():
    for name in ("4096³", "8192³"):
        func = ops.matmul_scaled(*cft.CASES[name]).func
        configs = [tile_config(t, func, H100) for t in cft.TILES]
        assert len({repr(c) for c in configs}) == len(cft.TILES)
        assert all(c.rstep == (128,) and c.pipeline_stages >= 3 for c in configs)  # 8-bit K steps
        pingpong = [c for c in configs if c.block[0] == c.warp[0]]
        assert [(c.block, c.cluster) for c in pingpong] == [((128, 128), 1), ((128, 128), 2), ((64, 256), 2)]


def test_the_pingpong_cluster_compiles_without_spills():
    func = ops.matmul_scaled(4096, 4096, 4096).func
    config = tile_config("128x128/128+2", func, H100)
    with H100.target:
        kernel = apply_config(func, config)
    cubin = compile_cubin(cuda_source(build(tvm.IRModule({"main": kernel}), H100.target)), H100.target)
    assert cubin.spill_bytes == 0


def test_a_bad_tile_or_case_is_one_line_and_exit_2():
    for argv in (["--tiles", "128x"], ["--only", "4096"]):
        done = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_the_table_has_a_row_a_tile_and_the_refusals():
    rows = [{"case": "4096³", "tile": "128x256", "config": "Config[matmul_wgmma](...)", "ms": 0.1083,
             "torch_ms": 0.1047, "ratio": 0.967, "tflops": 1269, "registers": 168, "verified": True},
            {"case": "4096³", "tile": "64x64", "config": "c", "verified": None, "failure": "nvcc: boom"},
            {"case": "4096³", "tile": None, "refused": "tile 512x512: too big"}]
    text = cft.markdown(rows, "NVIDIA H200")
    assert "| 4096³ | 128x256 | Config[matmul_wgmma](...) | 0.1083 | 0.1047 | 0.967x | 1269 | 168 |" in text
    assert "| 4096³ | 64x64 | c | nvcc: boom |" in text and "| 4096³ | refused | tile 512x512: too big |" in text

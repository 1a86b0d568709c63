"""benchmarks/trace_wgmma.py on the CPU: the instrumented template kernels compile to cubins
without spills (cooperative, ping-pong, a cluster, 8-bit inputs), a source of another shape is refused,
printed records parse into the per-wave summary, and a malformed tile is one line."""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import tvm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import trace_wgmma as tw  # noqa: E402
from fastdlight import ops  # noqa: E402
from fastdlight.arch import CUDA  # noqa: E402
from fastdlight.config import Config  # noqa: E402
from fastdlight.schedules import apply_config  # noqa: E402
from fastdlight.compiler.compile import build, compile_cubin, cuda_source  # noqa: E402

H100 = CUDA("nvidia/nvidia-h100")


def _source(m, n, k, dtype, layout, bm, bn, wm, cluster=1, stages=4):
    fp8 = dtype == "float8_e4m3fn"  # the scaled GEMM (A M×K, B N×K), as trace_wgmma takes it
    func = (ops.matmul_scaled(m, n, k, dtype).func if fp8
            else ops.matmul(m, n, k, dtype, dtype, layout, None, acc_dtype="float32").func)
    config = Config("matmul_wgmma", block=(bm, bn), warp=(wm, bn), rstep=(128 if fp8 else 64,), pipeline_stages=stages,
                    use_async_copy=True, rasterization=8, cluster=cluster)
    with H100.target:
        kernel = apply_config(func, config)
    return cuda_source(build(tvm.IRModule({"main": kernel}), H100.target))


def test_instrumented_kernels_compile_without_spills():
    sources = [_source(4096, 2048, 512, "float16", "NN", 128, 256, 64),  # cooperative
               _source(4096, 2048, 512, "bfloat16", "NT", 128, 128, 128),  # ping-pong
               _source(4096, 2048, 512, "float16", "NN", 128, 256, 64, cluster=2),
               _source(4096, 2048, 1024, "float8_e4m3fn", None, 128, 256, 64),
               # a ring of 6 stages: the stage index a modulo, not a mask
               _source(4096, 2048, 1024, "float8_e4m3fn", None, 128, 128, 128, cluster=2, stages=6)]
    traced = [tw.instrument(s) for s in sources]
    for src in traced:
        # one record slot per CTA and launch, filled by thread 128, printed by the last CTA
        assert "__device__ unsigned long long fdl_rec[" in src and f"threadIdx.x == {tw.WATCH_TID}" in src
        assert src.count("clock64()") == 5 and "atomicAdd(&fdl_done" in src and 'printf("FDT' in src
    with ThreadPoolExecutor(2) as pool:
        cubins = list(pool.map(lambda s: compile_cubin(s, H100.target), traced))
    assert all(c.spill_bytes == 0 and c.registers <= 168 for c in cubins)


def test_a_source_without_a_tile_loop_is_refused():
    one_tile_a_cta = _source(256, 256, 128, "float16", "NN", 128, 256, 64)
    with pytest.raises(tw.InstrumentError, match="one tile a CTA"):
        tw.instrument(one_tile_a_cta)


def test_printed_records_give_each_waves_main_loop_epilogue_and_drain():
    ideal = tw.ideal_tile_cycles((4096, 4096, 4096), 128, 256)
    assert ideal == 65536  # 64 K steps of 1024 cycles
    # 8-bit inputs: K steps of 128 at twice the rate, the same cycles a step
    assert tw.ideal_tile_cycles((4096, 4096, 4096), 128, 256, bk=128, in_bytes=1) == 32768
    lines = ["unrelated output",
             # launch 16, CTA 0 on SM 4: two tiles; CTA 1: one tile (its second iteration had none)
             "FDL 16 0 4 1000 201000 0 300000",
             "FDT 16 0 0 100 2600 70000 0 0", "FDT 16 0 1 72400 72800 146000 1 0",
             "FDL 16 1 6 1000 151000 0 150000",
             "FDT 16 1 0 100 2500 72000 1 1", "FDT 16 1 1 73000 0 0 0 0"]
    records = tw.parse("\n".join(lines))
    assert [(r.launch, r.cta, r.sm, len(r.tiles)) for r in records] == [(16, 0, 4, 2), (16, 1, 6, 2)]
    (s,) = tw.summarize(records, ideal)
    assert s["span_us"] == 200.0 and s["cta_cycles"]["max"] == 300000
    w0, w1 = s["waves"][0], s["waves"][1]
    assert w0["main_loop"]["n"] == 2 and w1["main_loop"]["n"] == 1  # CTA 1's second tile is not counted
    assert w0["main_loop"]["max"] == (72000 - 2500) / ideal
    assert w0["first_stage_wait"]["median"] == 2450.0
    assert w0["epilogue"] == {"n": 1, "median": 2400.0, "p90": 2400.0, "max": 2400.0}  # 72400 - 70000
    assert sorted([s["last_epilogue"]["median"]]) == [(154000 + 78000) / 2]  # 300000-146000, 150000-72000
    md = tw.markdown("t", [s], ideal)
    assert "| 0 | 2 |" in md and "| 1 | 1 |" in md


def test_a_malformed_tile_is_one_line_before_any_gpu_work(capsys):
    """The tile is spelled as for bench_energy (BMxBN[/WM][+C[m|n]]); argparse refuses another."""
    with pytest.raises(SystemExit) as e:
        tw.main(["--tile", "128by256"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "is not BMxBN[/WM][+C[m|n]]" in err and "Traceback" not in err

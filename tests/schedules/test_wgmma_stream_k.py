"""Stream-K in the wgmma template, CPU only: the schedule covers every K-step of every tile once,
heads wait only for CTAs launched before them, and the kernels compile to cubins."""

import pytest
import tvm
from tvm import sym, tirx

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.policies.config import Config
from fastdlight.schedules import apply_config
from fastdlight.schedules.dispatch import ScheduleError
from fastdlight.schedules.wgmma_stream_k import MAX_CONTRIBUTORS, stream_k
from fastdlight.tune.compile import build, compile_cubin, cuda_source

H100 = CUDA("nvidia/nvidia-h100")
_ANALYZER = sym.Analyzer()


def value(expr) -> int:
    out = _ANALYZER.simplify(expr if isinstance(expr, tvm.ir.expr.Expr) else tirx.const(expr, "int32"))
    assert isinstance(out, tirx.IntImm), out
    return int(out)


def walk(sk):
    """Each worker's units as the kernel runs them: [(tile, kb, ke, first stage count)]."""
    runs = {}
    for w in range(sk.workers):
        units = []
        for u in range(sk.units):
            tile, kb, ke, g0 = (value(x) for x in sk.unit(tirx.const(u, "int32"), tirx.const(w, "int32")))
            if kb < ke:
                units.append((u, tile, kb, ke, g0))
        runs[w] = units
    return runs


@pytest.mark.parametrize("tiles,workers,k_steps", [
    (512, 132, 64),  # 4096³ in 128×256 tiles
    (256, 132, 64),  # LLaMA o projection
    (1024, 66, 128),  # 8192³, 2-CTA clusters
    (638, 132, 64),  # LLaMA up, 192×192
    (100, 132, 16),  # fewer tiles than workers: all of them split
    (480, 132, 16),
])
def test_every_k_step_of_every_tile_is_run_once_and_heads_wait_only_for_earlier_ctas(tiles, workers, k_steps):
    sk = stream_k(tiles, workers, k_steps, 1, 256, 128)
    assert sk is not None and sk.contributors <= MAX_CONTRIBUTORS
    runs = walk(sk)
    done = {}
    for w, units in runs.items():
        g = 0
        for u, tile, kb, ke, g0 in units:
            assert g0 == g  # the ring's phase continues across units
            g += ke - kb
            for k in range(kb, ke):
                assert (tile, k) not in done
                done[(tile, k)] = w
        v = workers - 1 - w
        assert g == sk.rounds * k_steps + value(sk.start(v + 1) - sk.start(v))  # whole tiles and its share
    assert set(done) == {(t, k) for t in range(tiles) for k in range(k_steps)}
    for w, units in runs.items():
        contributing = [x for x in units if x[0] >= sk.rounds and x[2] > 0]
        assert len(contributing) <= 1 and (not contributing or contributing[0] == units[sk.rounds])  # its first piece
        for u, tile, kb, ke, _ in units:
            if u < sk.rounds or kb > 0 or ke == k_steps:
                continue
            t = tile - sk.rounds * workers
            # the head of a split tile: its contributors are exactly the other pieces' workers
            found = []
            for c in range(sk.contributors):
                exists, v = sk.contributor(tirx.const(w, "int32"), tirx.const(c, "int32"), tirx.const(t, "int32"))
                if value(tirx.Cast("int32", exists)):
                    found.append(value(sk.slot(v, 0)))
            others = {done[(tile, k)] for k in range(ke, k_steps)}
            assert set(found) == others and len(found) == len(others)
            assert all(o < w for o in others)  # launched before the head


def test_no_stream_k_without_a_partial_wave_or_with_tiny_shares():
    assert stream_k(528, 132, 64, 1, 256, 128) is None  # 4 whole waves
    assert stream_k(133, 132, 64, 1, 256, 128) is None  # one tile left: shares of half a K-step
    assert stream_k(tirx.Var("n", "int32"), 132, 64, 1, 256, 128) is None


def test_stream_k_kernels_compile_with_their_workspace_and_flags():
    func = ops.matmul(4096, 4096, 4096, "float16", "float16", "NN", None, acc_dtype="float32").func
    jobs = [Config("matmul_wgmma", block=(128, 256), warp=(64, 256), rstep=(64,), pipeline_stages=4,
                   use_async_copy=True, rasterization=16, cluster=cluster, stream_k=True) for cluster in (1, 2)]
    for config in jobs:
        with H100.target:
            kernel = apply_config(func, config)
        assert kernel is not None
        src = cuda_source(build(tvm.IRModule({"main": kernel}), H100.target))
        cubin = compile_cubin(src, H100.target)
        assert "__device__ float fdl_stream_k_" in src and "ld.acquire.gpu" in src and "red.release.gpu" in src
        assert cubin.spill_bytes == 0 and cubin.registers <= 168
    # ping-pong tiles and shapes without a partial wave get no stream-K kernel
    pingpong = Config("matmul_wgmma", block=(128, 128), warp=(128, 128), rstep=(64,), pipeline_stages=4,
                      use_async_copy=True, stream_k=True)
    whole = ops.matmul(4096, 4224, 4096, "float16", "float16", "NN", None, acc_dtype="float32").func  # 32×33 tiles of 128² = 1056 = 8 waves
    exact = Config("matmul_wgmma", block=(128, 128), warp=(64, 128), rstep=(64,), pipeline_stages=4,
                   use_async_copy=True, stream_k=True)
    for f, c in ((func, pingpong), (whole, exact)):
        with H100.target, pytest.raises(ScheduleError, match="not applicable"):
            apply_config(f, c)
    assert "stream_k" in repr(jobs[0]) and Config.from_dict(jobs[0].to_dict()) == jobs[0]

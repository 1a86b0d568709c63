"""Memory-bound templates: every family schedules and compiles to a real cubin (nvcc) for H100
and A100, including shapes the tiles do not divide; plus DefaultPolicy's top configs."""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import tvm_ffi
from mb_cases import CASES, Case, case_ids, rms_norm
from tvm import s_tir, tirx

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, compile_mod_to_cubin, cuda_source
from fastdlight.config import Config
from fastdlight.schedules import dispatch_config
from fastdlight.schedules.base import legal_vector, prepare, tile_spatial
from fastdlight.schedules.general_reduction import MAX_UNROLLED_ROW_STEPS

TARGETS = ["nvidia/nvidia-h100", "nvidia/nvidia-a100"]


def launch_extents(mod) -> dict[str, int]:
    """Extent of each thread tag bound in the scheduled function (max over loops)."""
    found: dict[str, int] = {}

    def visit(stmt):
        if isinstance(stmt, tirx.For) and stmt.thread_binding is not None:
            tag = str(stmt.thread_binding.thread_tag)
            found[tag] = max(found.get(tag, 0), int(stmt.extent))

    tvm_ffi.structural_walk(mod["main"].body, (tirx.For, visit), order="post")
    return found


def check_case(case: Case, target: str, configs, marker: str = "") -> None:
    """Each config: the expected template schedules it (no fallback), the launch matches the
    config, and nvcc compiles it without spills; ``marker`` must appear in the first source."""
    op = case.make()
    _, _, _, spatial, _ = prepare(op.func)
    out_elems = math.prod(a.extent for a in spatial)  # the config's tiled output space
    sources = []
    for cfg in configs:
        res = dispatch_config(op.func, cfg, allow_fallback=False)
        assert res.template == case.template, (cfg, res.failures)
        ext = launch_extents(res.schedule.mod)
        threads = math.prod(v for k, v in ext.items() if k.startswith("threadIdx"))
        assert threads == cfg.num_threads, (cfg, ext)
        # the grid covers every output (tails are predicated, never dropped)
        assert ext["blockIdx.x"] * math.prod(cfg.block) >= out_elems, (cfg, ext)
        sources.append(cuda_source(build(res.schedule.mod, target)))
    if marker:
        assert marker in kernel_body(sources[0]), (configs[0], marker)
    # nvcc runs in subprocesses: compile the sample two at a time
    with ThreadPoolExecutor(2) as pool:
        for cfg, cubin in zip(configs, pool.map(lambda src: compile_cubin(src, target), sources)):
            assert cubin.binary and cubin.spill_bytes == 0, (cfg, cubin.log[-500:])


def kernel_body(src: str) -> str:
    """The CUDA source after the helper header TVM prepends (it defines float4 helpers etc.)."""
    return src[src.find("__global__") :]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=case_ids())
def test_hand_configs_compile(case, target):
    # A100 gets the first config of each case only: the same code path, half the nvcc time.
    check_case(case, target, case.configs if target == TARGETS[0] else case.configs[:1], case.marker)


POLICY_CASES = [c for c in CASES if c.id in ("add_1000x3000", "max_inner_999x4095", "sum_outer_1000x4096",
                                             "softmax_512x4096", "gemv_8x1000x4096")]  # fmt: skip


@pytest.mark.parametrize("case", POLICY_CASES, ids=[c.id for c in POLICY_CASES])
def test_default_policy_top3_compile(case):
    default = pytest.importorskip("fastdlight.policies.default")

    configs = default.DefaultPolicy(case.make().func, CUDA("nvidia/nvidia-h100")).emit_config(3)
    assert configs
    check_case(case, "nvidia/nvidia-h100", configs)


def test_vector_width_only_where_legal():
    assert legal_vector(8, 4096, 8) == 8
    assert legal_vector(8, 4095, 8) == 1  # odd extent: scalar
    assert legal_vector(16, 1000, 8) == 8
    assert legal_vector(4, 1002, 8) == 2
    # copy of 4095 floats with 4 per thread: no float4 anywhere, yet it compiles
    op = ops.elementwise((4095,), op="copy", dtype="float32")
    sch = dispatch_config(op.func, CASES[1].configs[0]).schedule
    src, _ = compile_mod_to_cubin(sch.mod, TARGETS[0])
    body = kernel_body(src)
    assert "float4" not in body and "uint4" not in body and "float2" not in body


def test_float32_values_cap_vector_lanes():
    # softmax computes in float32: an 8-lane fp16 store would need float32x8 values, which the
    # CUDA codegen cannot express; the template must cap the epilogue at 4 lanes.
    op = ops.softmax(64, 1024)
    cfg = Config("general_reduction", block=(1,), thread=(1,), rstep=(1024,), reduce_thread=(128,))
    sch = dispatch_config(op.func, cfg).schedule
    lanes = [int(f.extent) for f in _loops(sch.mod) if f.kind == tirx.ForKind.VECTORIZED]
    assert lanes and max(lanes) <= 8 and 4 in lanes


def _loops(mod):
    out = []
    tvm_ffi.structural_walk(mod["main"].body, (tirx.For, out.append), order="post")
    return out


def test_tile_spatial_splits():
    op = ops.elementwise((1000,), op="copy")
    sch = s_tir.Schedule(op.func)
    (loop,) = sch.get_loops(sch.get_sblock("B"))
    parts = tile_spatial(sch, loop, 1000, 256, 16, 8)
    assert [int(sch.get(p).extent) for p in parts] == [4, 2, 16, 8]
    sch2 = s_tir.Schedule(op.func)
    (loop2,) = sch2.get_loops(sch2.get_sblock("B"))
    parts2 = tile_spatial(sch2, loop2, 1000, 256, 16, 8, interleave=False)
    assert [int(sch2.get(p).extent) for p in parts2] == [4, 2, 16, 8]  # same extents, other order
    assert sch2.get(parts2[1]).loop_var.name.endswith("_2")  # serial is now inside the threads


def test_chain_results_stay_with_their_row_threads():
    # Regression (found on an H200): several rows per block and several warps per row. Per-row
    # results must be "local" (every thread of the row gets the allreduce result after a
    # barrier); a "shared" result written by threadIdx.x == 0 raced with its readers.
    op = ops.softmax(512, 4096)
    cfg = Config("general_reduction", block=(2,), thread=(1,), rstep=(1024,), reduce_thread=(128,))
    sch = dispatch_config(op.func, cfg).schedule
    script = sch.mod.script()
    assert 'row_max_local = T.sblock_alloc_buffer((512,), scope="local")' in script
    body = kernel_body(cuda_source(build(sch.mod, TARGETS[0])))
    assert "row_max_shared" not in body and "A_shared" in body
    # one row per block: shared result, and the barrier between its write and the reads exists
    one = Config("general_reduction", block=(1,), thread=(1,), rstep=(1024,), reduce_thread=(128,))
    body = kernel_body(cuda_source(build(dispatch_config(op.func, one).schedule.mod, TARGETS[0])))
    write = body.find("row_max_shared_ptr[0] = ")
    first_read = body.find("row_max_shared_ptr[0])", write)
    assert 0 < write < first_read and "__syncthreads()" in body[write:first_read]


def test_a_vocabulary_wide_row_is_a_loop_not_thousands_of_lines():
    """The row loop of a 32000-wide softmax (250 steps of 128 values) stays a loop: unrolled it
    was 7,400 lines of CUDA and up to 2.7 s of nvcc a candidate."""
    cfg = Config("general_reduction", block=(4,), thread=(1,), rstep=(256,), reduce_thread=(32,), vectorize={"A": 8})
    res = dispatch_config(ops.softmax(64, 32000).func, cfg, allow_fallback=False)
    src = kernel_body(cuda_source(build(res.schedule.mod, "nvidia/nvidia-h100")))
    assert 32000 // (32 * 8) > MAX_UNROLLED_ROW_STEPS
    assert src.count("\n") < 600 and src.count("for (") >= 3, src.count("\n")


def test_a_norms_weight_is_fetched_with_its_row_before_the_reduction():
    """The weight only the last block reads goes to shared memory before the sum of squares, so
    its load is in flight with the row's instead of after the reduction (a decode step's
    RMSNorm of one row: a memory round trip of a microsecond kernel)."""
    cfg = Config("reduction", block=(1,), thread=(1,), rstep=(1024,), reduce_thread=(256,))
    res = dispatch_config(rms_norm((1, 1, 3072)).func, cfg, allow_fallback=False)
    assert res.template == "general_reduction"
    body = kernel_body(cuda_source(build(res.schedule.mod, TARGETS[0])))
    fetch = re.search(r"W_shared_ptr\[[^;]*\] = ", body)  # the fill, not the declaration
    assert fetch is not None and fetch.start() < body.find("__shfl"), body[:2000]

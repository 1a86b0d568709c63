"""Hopper wgmma + TMA template, CPU only: the kernels it generates for sm_90a hold wgmma, TMA
loads and stores, mbarriers and setmaxnreg, compile to a cubin without spills, keep the
function's signature, and fuse the model functions' epilogues; a model with them builds."""

import pathlib
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import tvm
from tvm import sym, te, tirx

from fastdlight import ops
from fastdlight.analysis.wgmma_conv import ConvGeometry
from fastdlight.analysis.wgmma_match import match_wgmma
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, cuda_source, tir_pipeline
from fastdlight.config import Config
from fastdlight.policies.wgmma import WgmmaPolicy
from fastdlight.relax import for_inference, prepare
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.schedules import apply_config
from fastdlight.schedules.wgmma.epilogue import MAX_LIVE_REGS, Epilogue, extract_epilogue
from fastdlight.schedules.wgmma.template import Plan, defers_epilogue
from fastdlight.schedules.wgmma.tma import operands

H100 = CUDA("nvidia/nvidia-h100")
FIXTURES = pathlib.Path(__file__).parents[1] / "relax" / "fixtures"


def gemm(m, n, k, dtype="float16", layout="NN", batch=None, out=None):
    return ops.matmul(m, n, k, dtype, out or dtype, layout, batch, acc_dtype="float32").func


def wgmma(bm=128, bn=256, stages=4, group=8, wm=64, cluster=1, axis="m") -> Config:
    """bm = 2 wm: cooperative (both consumer warpgroups on each tile); bm = wm: ping-pong."""
    return Config("matmul_wgmma", block=(bm, bn), warp=(wm, bn), rstep=(64,), pipeline_stages=stages,
                  use_async_copy=True, rasterization=group, cluster=cluster, cluster_axis=axis)


def kernel(func, config):
    with H100.target:
        return apply_config(func, config)


def compile_all(jobs):
    """[(func, config)] -> [(kernel PrimFunc, source, cubin)]; nvcc two at a time."""
    kernels = [kernel(f, c) for f, c in jobs]
    sources = [cuda_source(build(tvm.IRModule({"main": k}), H100.target)) for k in kernels]
    with ThreadPoolExecutor(2) as pool:
        cubins = list(pool.map(lambda s: compile_cubin(s, H100.target), sources))
    return list(zip(kernels, sources, cubins))


def check_hopper_kernel(src, cubin, bn, in_abbr="f16", tma_store=True):
    k = 32 if in_abbr in ("e4m3", "e5m2") else 16
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k{k}.f32.{in_abbr}.{in_abbr}" in src
    assert "cp.async.bulk.tensor" in src and "mbarrier" in src and "setmaxnreg" in src
    assert ("global.shared::cta.tile.bulk_group" in src) == tma_store  # the TMA-store epilogue
    # the descriptors prefetched (one helper, a call each)
    assert "prefetch.tensormap" in src and all(f"prefetch_tensormap(((void*)((unsigned long long)(&({m}_map)))))"
                                                in src for m in ("ABD" if tma_store else "AB"))
    assert cubin.spill_bytes == 0 and 0 < cubin.registers <= 255


def test_layouts_dtypes_and_odd_shapes_compile_to_cubin():
    jobs = [
        (gemm(1000, 520, 264, "float16", "NT"), wgmma(128, 256)),  # K-major B, edges in M and N
        (gemm(1000, 520, 264, "bfloat16", "NN"), wgmma(64, 192, 6, wm=64)),  # MN-major B; ping-pong
        (gemm(200, 136, 72, "float16", "TN", out="float32"), wgmma(256, 64, 4, wm=128)),  # M-major A, fp32 out
        (gemm(512, 256, 128, "float16", "NN", batch=3), wgmma(128, 128, 6, 1, wm=128)),  # 3-D maps; ping-pong
    ]
    for (func, config), (k, src, cubin) in zip(jobs, compile_all(jobs)):
        check_hopper_kernel(src, cubin, config.block[1], {"float16": "f16", "bfloat16": "bf16"}[str(func.params[0].dtype)])
        assert k.attrs["tirx.kernel"] and k.attrs["tirx.is_scheduled"]
        assert [str(p.name) for p in k.params] == [str(p.name) for p in func.params]
        assert [tuple(int(x) for x in p.shape) for p in k.params] == [tuple(int(x) for x in p.shape) for p in func.params]
    assert "cp.async.bulk.tensor.3d" in compile_all(jobs[-1:])[0][1]


def test_fp8_inputs_compile_to_k32_wgmma_with_128_wide_k_steps():
    """8-bit inputs: a stage's K step is one 128-byte row of 128 elements, four k32 wgmmas."""
    e4m3 = gemm(1000, 520, 272, "float8_e4m3fn", "NT", out="float16")
    e5m2 = gemm(256, 384, 1024, "float8_e5m2", "NT", out="bfloat16")
    jobs = [(e4m3, fp8_wgmma(128, 256)),
            (e5m2, fp8_wgmma(64, 128, stages=8, wm=64))]
    for (func, config), (_k, src, cubin) in zip(jobs, compile_all(jobs)):
        check_hopper_kernel(src, cubin, config.block[1], {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}[
            str(func.params[0].dtype)])
        assert "k16" not in src.split("wgmma.mma_async")[1][:60]
    assert all(c.rstep == (128,) for c in WgmmaPolicy(e4m3, H100).emit_config(8))


def test_fp8_operands_must_be_k_major():
    """wgmma has no transpose for 8-bit inputs: an MN-major B is refused by the match (the
    operator builder refuses it first)."""
    a = te.placeholder((256, 256), "float8_e4m3fn", name="A")
    b = te.placeholder((256, 256), "float8_e4m3fn", name="B")  # [K, N]: MN-major
    r = te.reduce_axis((0, 256), name="k")
    c = te.compute((256, 256), lambda i, j: te.sum(a[i, r].astype("float32") * b[r, j].astype("float32"), axis=r))
    d = te.compute((256, 256), lambda i, j: c[i, j].astype("float16"))
    match, why = match_wgmma(te.create_prim_func([a, b, d]))
    assert match is None and "K-major only" in why
    assert match_wgmma(ops.matmul(256, 256, 256, "float8_e4m3fn", "float16", "NT").func)[1] == ""
    with pytest.raises(ValueError, match="layout NT"):
        ops.matmul(256, 256, 256, "float8_e4m3fn", "float16", "NN")


def fp8_wgmma(bm, bn, stages=4, wm=64) -> Config:
    return Config("matmul_wgmma", block=(bm, bn), warp=(wm, bn), rstep=(128,), pipeline_stages=stages,
                  use_async_copy=True, rasterization=8)


def test_three_consumer_warpgroups_compile_without_spills():
    """192-row tiles: three 64-row consumer warpgroups (512 threads) with 152 registers each,
    K-major and MN-major B, bf16, a cluster; two epilogue staging buffers a warpgroup, or one
    where the second would cost the ring its fourth stage (192 x 192)."""
    jobs = [
        (gemm(1000, 520, 264, "float16", "NT"), wgmma(192, 192, 3)),
        (gemm(1000, 520, 264, "bfloat16", "NN"), wgmma(192, 128, 4)),
        (gemm(1000, 520, 264, "float16", "NT"), wgmma(192, 192, 4, cluster=2)),
    ]
    built = compile_all(jobs)
    for (func, config), (k, src, cubin) in zip(jobs, built):
        abbr = {"float16": "f16", "bfloat16": "bf16"}[str(func.params[0].dtype)]
        check_hopper_kernel(src, cubin, config.block[1], abbr)
        assert "setmaxnreg.inc.sync.aligned.u32 152" in src and "__launch_bounds__(512" in src
    # one buffer: each chunk waits for the previous store to have read it; two: for all but one
    waits = [re.findall(r"cp\.async\.bulk\.wait_group\.read (\d)", src) for _, src, _ in built]
    assert set(waits[0]) == {"1"} and set(waits[2]) == {"0"}


def test_two_192_wide_slices_a_warpgroup_compile_without_spills():
    """Two consumer warpgroups of two m64n192 slices each (256 x 192 cooperative, 128 x 192
    ping-pong): 192 accumulators a thread live in the consumers' setmaxnreg region of 232
    registers, though the kernel is compiled for 168; with a bias and a residual read too."""
    jobs = [
        (gemm(1000, 520, 264, "float16", "NT"), wgmma(256, 192, 3, wm=128)),
        (gemm(1000, 520, 264, "bfloat16", "NN"), wgmma(128, 192, 4, wm=128)),
        (ops.matmul_residual(1000, 520, 264, "float16").func, wgmma(256, 192, 3, wm=128)),
    ]
    for (func, config), (k, src, cubin) in zip(jobs, compile_all(jobs)):
        abbr = {"float16": "f16", "bfloat16": "bf16"}[str(func.params[0].dtype)]
        check_hopper_kernel(src, cubin, 192, abbr)
        assert "setmaxnreg.inc.sync.aligned.u32 232" in src and "__launch_bounds__(384" in src
        assert src.count("wgmma.mma_async.sync.aligned.m64n192k16") >= 1 and cubin.registers == 168


def test_two_cta_clusters_multicast_b_and_release_stages_in_both_ctas():
    jobs = [
        (gemm(1000, 520, 264, "float16", "NT"), wgmma(128, 256, cluster=2)),  # B's rows halved: two boxes
        (gemm(1000, 512, 264, "float16", "NN"), wgmma(64, 128, 6, wm=64, cluster=2)),  # B's chunks; ping-pong
        # three chunks for two CTAs: each chunk in two halves along K (32-row boxes)
        (gemm(1000, 576, 264, "float16", "NN"), wgmma(192, 192, 4, wm=64, cluster=2)),
    ]
    for (func, config), (k, src, cubin) in zip(jobs, compile_all(jobs)):
        check_hopper_kernel(src, cubin, config.block[1])
        assert ".multicast::cluster" in src and "mapa.shared::cluster" in src  # B shared, stages released remotely
        assert "%cluster_ctarank" in src and "barrier.cluster.wait" in src
    a, b, _ = operands(match_wgmma(jobs[2][0])[0], 192, 192, 64, cluster=2)
    assert (b.k_pieces, b.loads, b.box[:2], b.chunk_elems) == (2, 6, (64, 32), 32 * 64)
    assert [b.coords(0, 1, 2, c) for c in (0, 1, 2)] == [[192, 128], [192, 160], [256, 128]]  # [n, k]
    assert [b.mine(c, 1) for c in range(6)] == [False, True] * 3  # CTA 1: the second half of each chunk
    even = operands(match_wgmma(jobs[1][0])[0], 64, 128, 64, cluster=2)[1]
    assert (even.k_pieces, even.loads, even.box[:2]) == (1, 2, (64, 64))  # two chunks: one each, whole
    # the policy offers both, where two rows of tiles share B
    configs = WgmmaPolicy(gemm(1000, 512, 264, "float16", "NT"), H100).emit_config(40)
    assert {c.cluster for c in configs} == {1, 2}
    # but not the K halves: they run slow hot, so only explicit configs get them
    nn = WgmmaPolicy(gemm(2048, 11008, 4096, "float16", "NN"), H100).emit_config(40)
    assert (192, 192) in {c.block for c in nn} and not any(c.cluster > 1 and c.cluster_axis == "m" and c.block[1] == 192 for c in nn)
    assert any(c.cluster > 1 for c in nn)
    assert {c.cluster for c in WgmmaPolicy(gemm(64, 512, 264, "float16", "NT"), H100).emit_config(40)} == {1}


def test_two_cta_clusters_along_n_multicast_a():
    """Clusters along N: horizontally adjacent tiles sharing A, each CTA loading half of it
    (K-major: half the rows; M-major, three 64-column chunks: half of each along K)."""
    jobs = [
        (gemm(1000, 520, 264, "float16", "NN"), wgmma(256, 128, wm=128, cluster=2, axis="n")),
        (gemm(1000, 520, 264, "bfloat16", "TN"), wgmma(192, 128, 4, cluster=2, axis="n")),
    ]
    for (func, config), (k, src, cubin) in zip(jobs, compile_all(jobs)):
        check_hopper_kernel(src, cubin, config.block[1], {"float16": "f16", "bfloat16": "bf16"}[str(func.params[0].dtype)])
        # one load form multicast (A's), one not (B's); stages released in both CTAs
        assert src.count(".multicast::cluster [") == 1 and "complete_tx::bytes [" in src
        assert "mapa.shared::cluster" in src and "%cluster_ctarank" in src
    match = match_wgmma(jobs[0][0])[0]
    a, b, _ = operands(match, 256, 128, 64, cluster=2, cluster_axis="n")
    assert (a.split, b.split, a.loads, a.box[:2]) == (2, 1, 2, (64, 128))  # [k, rows]: half of A's rows each
    assert [a.coords(0, 1, 2, c) for c in (0, 1)] == [[128, 256], [128, 384]] and [a.mine(c, 1) for c in (0, 1)] == [False, True]
    m_major = operands(match_wgmma(jobs[1][0])[0], 192, 128, 64, cluster=2, cluster_axis="n")[0]
    assert (m_major.k_pieces, m_major.loads, m_major.box[:2]) == (2, 6, (64, 32))
    plan = Plan(match, 256, 128, 64, 4, 8, 132, 128, 2, "n")
    assert (plan.cluster_grid_m, plan.cluster_grid_n, plan.tiles) == (4, 3, 12)  # 5 N tiles: 3 pairs
    assert (plan.cta_m(3, 1), plan.cta_n(2, 1), Plan(match, 256, 128, 64, 4, 8, 132, 128, 2).cta_n(2, 1)) == (3, 5, 2)
    # the policy's cluster twins share the larger tile: A where the tile is taller than wide
    configs = WgmmaPolicy(gemm(4096, 4096, 4096, "float16", "NN"), H100).emit_config(20)
    twins = [c for c in configs if c.cluster > 1]
    assert {c.cluster_axis for c in twins} == {"m", "n"}
    assert all(c.cluster_axis == ("n" if c.block[0] > c.block[1] else "m") for c in twins)


def test_output_rows_tma_cannot_address_are_stored_by_the_threads():
    """N = 1001 (fp16 rows of 2002 bytes, fp32 of 4012): no tensor map for the output; each
    chunk goes from shared memory to it in element stores, guarded at the edges."""
    jobs = [
        (gemm(1000, 1001, 264, "float16", "NT"), wgmma(128, 256)),
        (gemm(1000, 1003, 264, "float16", "NT", out="float32"), wgmma(256, 128, wm=128)),
        (gemm(512, 1001, 128, "bfloat16", "NT", batch=3), wgmma(128, 128, 6, wm=128, cluster=2)),
        (gemm(512, 1001, 128, "float16", "NT", batch=1), wgmma(128, 128, 6, wm=128)),  # output [1, M, N]
    ]
    for (func, config), (k, src, cubin) in zip(jobs, compile_all(jobs)):
        assert not match_wgmma(func)[0].tma_store
        check_hopper_kernel(src, cubin, config.block[1],
                            {"float16": "f16", "bfloat16": "bf16"}[str(func.params[0].dtype)],
                            tma_store=False)
        d = match_wgmma(func)[0].d_name
        assert f"{d}_map" not in src and "cp.async.bulk.tensor" in src and f"{d}_ptr[" in src
    assert match_wgmma(gemm(1000, 1008, 264, "float16", "NT"))[0].tma_store


def test_policy_top_configs_compile():
    func = gemm(4096, 4096, 4096, layout="NT")
    configs = WgmmaPolicy(func, H100).emit_config(3)
    for config, (_, src, cubin) in zip(configs, compile_all([(func, c) for c in configs])):
        check_hopper_kernel(src, cubin, config.block[1])


@pytest.mark.parametrize("func,config", [
    (ops.matmul(256, 256, 256, "float32", "float32").func, wgmma()),  # fp32: no wgmma path here
    (gemm(256, 256, 256), wgmma(256, 128, wm=64)),  # four 64-row slices: not a template shape
    (gemm(256, 256, 256), wgmma(128, 256, wm=128)),  # 256 accumulators per thread
])  # fmt: skip
def test_what_the_template_cannot_take_is_refused_not_rebuilt_otherwise(func, config):
    with pytest.raises(Exception, match="no template could schedule") as info:
        kernel(func, config)
    assert "fallback" not in str(info.value).lower()


def model_function(fixture: str, name: str):
    mod = tvm.script.from_source((FIXTURES / f"{fixture}.py").read_text())
    return prim_funcs(prepare(H100.target)(for_inference(mod)))[name]


def test_model_epilogues_are_fused():
    """Bias + GELU (with the fp16 rounding of the matmul in between) and SiLU-gate multiply by a
    second tensor: one kernel each, the tail evaluated on the accumulators."""
    gelu = model_function("mlp_gelu", "fused_matmul_cast2_cast3_add_gelu_cast2")
    gate = model_function("mlp_silu", "fused_matmul_cast2_tir_sigmoid_multiply_multiply")
    epi = extract_epilogue(gelu, match_wgmma(gelu)[0])
    assert isinstance(epi, Epilogue) and "T.erf" in epi.text and "p_up_bias" in epi.text and "K_ACC" in epi.text
    assert "matmul_intermediate" not in epi.text and epi.guarded
    epi = extract_epilogue(gate, match_wgmma(gate)[0])
    assert "T.sigmoid" in epi.text and "lv5" in epi.text
    for func, (_, src, cubin) in zip((gelu, gate), compile_all([(gelu, wgmma()), (gate, wgmma())])):
        check_hopper_kernel(src, cubin, 256)
        assert "erf" in src if func is gelu else "exp" in src


def test_epilogue_reads_of_other_inputs_are_prefetched_into_registers_within_the_budget():
    """A gate tensor (one value per output) is loaded in pairs before the main loop, in full
    where it fits beside the accumulators and as a ring of chunks where it does not; a fp32
    bias (one value per column) takes 8-byte loads when room is left; all without spills."""
    op = ops.matmul_gated(1000, 520, 264, "bfloat16")
    match = match_wgmma(op.func)[0]
    epi = extract_epilogue(op.func, match)
    bias, gate = epi.reads
    assert (bias.buffer, bias.per_row, gate.buffer, gate.per_row) == ("bias", False, "G", True)
    assert epi.pairable == (True, True)
    small, big = Plan(match, 128, 128, 64, 4, 8, 132), Plan(match, 128, 256, 64, 4, 8, 132)
    assert [(p.read.buffer, p.depth) for p in epi.prefetches(small)] == [("bias", 2), ("G", 2)]
    assert [(p.read.buffer, p.depth) for p in epi.prefetches(big)] == [("G", 1)]  # a ring of one chunk
    for plan in (small, big):
        assert plan.acc_regs + sum(p.registers(plan) for p in epi.prefetches(plan)) <= MAX_LIVE_REGS
    residual = ops.matmul_residual(1000, 520, 264)  # an fp32 tensor read per output: 8-byte pairs
    jobs = [(op.func, wgmma(128, 128)), (op.func, wgmma(128, 256)), (residual.func, wgmma(128, 256))]
    for (func, config), (_, src, cubin) in zip(jobs, compile_all(jobs)):
        if func is residual.func:
            check_hopper_kernel(src, cubin, 256)
            assert "*(float2*)(residual_ptr" in src
            continue
        check_hopper_kernel(src, cubin, config.block[1], "bf16")
        assert "__ushort_as_bfloat16" in src and "*(nv_bfloat162*)(G_ptr" in src
        assert ("*(float2*)(bias_ptr" in src) == (config.block[1] == 128)


def test_reads_that_are_not_adjacent_pairs_stay_direct_loads_except_rows_and_scalars():
    """A transposed tensor has no two adjacent elements per thread: it stays a load in the
    epilogue, masked past the edges. A per-row scale is the same across a thread's columns: its
    two rows a slice are loaded before the main loop, as is a one-element scale (once, no mask);
    the kernel still compiles without spills."""
    m, n, k = 1000, 520, 264
    A, B = te.placeholder((m, k), "float16", name="A"), te.placeholder((n, k), "float16", name="B")
    scale, T_ = te.placeholder((m,), "float16", name="scale"), te.placeholder((n, m), "float16", name="Gt")
    one = te.placeholder((1,), "float16", name="one")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[j, r].astype("float32"), axis=r), name="C")
    D = te.compute((m, n), lambda i, j: C[i, j].astype("float16") * scale[i] * one[0] + T_[j, i], name="D")
    func = te.create_prim_func([A, B, scale, one, T_, D])
    match = match_wgmma(func)[0]
    epi = extract_epilogue(func, match)
    kinds = {r.buffer: (r.row_only, r.scalar) for r in epi.reads}
    assert kinds == {"scale": (True, False), "one": (False, True), "Gt": (False, False)}
    assert epi.pairable == (False, False, False) and epi.guarded
    (_, src, cubin), = compile_all([(func, wgmma(128, 128))])
    check_hopper_kernel(src, cubin, 128)
    held = {p.read.buffer: p.reg for p in epi.prefetches(Plan(match, 128, 128, 64, 4, 8, 132))}
    assert set(held) == {"scale", "one"} and f"{held['one']}_ptr[0] = one_ptr[0]" in src
    assert "Gt_ptr[" in src and "scale_ptr[" in src


def test_per_tensor_scales_are_loaded_once_and_leave_the_epilogue_unmasked():
    """FP8's per-tensor scales (one float32 each): two registers loaded before the main loop,
    and no element of the epilogue tests its bounds (TMA clips the stores)."""
    op = ops.matmul_scaled(4096, 4096, 4096, "float8_e4m3fn", "float16", "tensor")
    match = match_wgmma(op.func)[0]
    epi = extract_epilogue(op.func, match)
    assert [(r.buffer, r.scalar) for r in epi.reads] == [("SA", True), ("SB", True)]
    for bm, bn, wm in ((128, 256, 64), (256, 192, 128)):  # 192 accumulators: past the budget
        plan = Plan(match, bm, bn, wm, 4, 8, 132)
        assert [p.registers(plan) for p in epi.prefetches(plan)] == [1, 1]
        assert "if_then_else" not in epi.value(plan, 0)
    (_, src, cubin), = compile_all([(op.func, fp8_wgmma(128, 256))])
    check_hopper_kernel(src, cubin, 256, "e4m3")
    assert src.count("SA_ptr[") == 1 and src.count("SB_ptr[") == 1


def test_nhwc_convolutions_load_their_input_as_4d_boxes_and_compile():
    """An NHWC/OHWI convolution is an implicit GEMM: the input read as 4-D TMA boxes (the
    convolution's stride as the element stride), the weights as a 2-D K-major B, the output
    stored as 4-D boxes; the 3-channel stem and HWIO weights are refused with the reason."""
    op = ops.conv2d_nhwc_ohwi(2, 30, 30, 64, 128, 3, 2, 1)
    match, _ = match_wgmma(op.func)
    assert match.conv == ConvGeometry(2, 30, 30, 64, 15, 15, 3, 3, (2, 2), (1, 1))
    assert (match.m, match.n, match.k) == (2 * 15 * 15, 128, 9 * 64)
    assert match.m_tiles(128) == 2 * 1 * 2  # 16-row x 8-column patches: one by two per image
    configs = WgmmaPolicy(op.func, H100).emit_config(2)
    for config, (_, src, cubin) in zip(configs, compile_all([(op.func, c) for c in configs])):
        check_hopper_kernel(src, cubin, config.block[1])
        assert "cp.async.bulk.tensor.4d.shared::cluster.global" in src  # the input's boxes
        assert "cp.async.bulk.tensor.2d.shared::cluster.global" in src  # the weights
        assert "cp.async.bulk.tensor.4d.global.shared::cta" in src  # the output's boxes
    assert "64 channels" in match_wgmma(ops.conv2d_nhwc_ohwi(2, 32, 32, 3, 64, 7, 2, 3).func)[1]
    assert match_wgmma(ops.conv2d_nhwc(2, 14, 14, 64, 64, out_dtype="float32").func)[0] is None  # HWIO


def test_a_resnet_layer_with_batch_norm_and_residual_compiles_on_the_wgmma_conv():
    """ResNet-18's last 3x3 layer as the model fuses it (batch norm, residual add, ReLU, cast):
    the epilogue indexes the 4-D output by the tile's patch, and the kernel compiles cleanly."""
    mod = tvm.script.from_source((FIXTURES / "resnet18_nhwc_b16.py").read_text())
    funcs = prim_funcs(prepare(H100.target)(for_inference(mod, layout="NHWC")))
    residual = [n for n in sorted(funcs) if re.fullmatch(r"fused_conv2d\d*_.*_add\d+_add\d+_relu\d+", n)]
    name, match = next((n, m) for n in residual if (m := match_wgmma(funcs[n])[0]) is not None and m.conv.c == 512)
    assert match.conv.p == match.conv.q == 7 and match.conv.c == 512
    epi = extract_epilogue(funcs[name], match)
    assert len(epi.index_vars) == 4 and any(r.per_row for r in epi.reads)
    # 128x64 with 128-row consumers: guards that fold to false at the 7x7 image's edge
    configs = (wgmma(64, 64, 8, 8), wgmma(128, 128), wgmma(128, 64, 8, 8, wm=128))
    for config, (_, src, cubin) in zip(configs, compile_all([(funcs[name], c) for c in configs])):
        check_hopper_kernel(src, cubin, config.block[1])


def test_a_module_mixing_wgmma_and_scheduled_functions_builds():
    gelu = model_function("mlp_gelu", "fused_matmul_cast2_cast3_add_gelu_cast2")
    ew = ops.elementwise((256, 256)).func
    mod = tvm.IRModule({"gemm": kernel(gelu, wgmma()).with_attr("global_symbol", "gemm"),
                        "add": apply_config(ew, Config("elementwise", block=(1, 256), thread=(1, 1))).mod["main"]
                        .with_attr("global_symbol", "add")})
    assert tir_pipeline(mod) == "fastdlight.hybrid"
    src = cuda_source(build(mod, H100.target))
    assert "gemm_kernel" in src and "add_kernel" in src and "wgmma.mma_async" in src


def test_operands_with_rows_not_128_byte_aligned_get_128_byte_l2_promotion():
    """K = 1000 fp16: 2000-byte rows, each box row straddles two lines; 256-byte promotion of both
    made 3000x5120x1000 NT 15% slower on an H100."""

    def promotions(func):
        calls = re.findall(r'cuTensorMapEncodeTiled", (\w)_map, .*, (\d+), (\d+)\)', kernel(func, wgmma()).script())
        return {name: int(promo) for name, promo, _ in calls}

    assert promotions(gemm(3000, 5120, 1000, "float16", "NT")) == {"A": 2, "B": 2, "D": 0}
    assert promotions(gemm(3000, 5120, 1024, "float16", "NT")) == {"A": 3, "B": 3, "D": 0}
    # NN: A's rows are K (2000 bytes), B's are N (10240 bytes, aligned)
    assert promotions(gemm(3000, 5120, 1000, "float16", "NN")) == {"A": 2, "B": 3, "D": 0}


def gmma_descriptor(smem_addr: int, lbo: int, sbo: int) -> int:
    """A 128B-swizzled wgmma matrix descriptor packed field by field, as PTX's ISA lays it out:
    start address >> 4 in bits 0-13, leading byte offset in 16-29, stride byte offset in 32-45,
    base offset 0 in 49-51, layout type 1 (128B swizzle) in 62-63."""
    return ((smem_addr >> 4) & 0x3FFF) | (lbo & 0x3FFF) << 16 | (sbo & 0x3FFF) << 32 | 1 << 62


def evaluate(expr) -> int:
    """A constant unsigned expression of adds, casts, shifts, ands and ors, in its type's bits."""
    kind = type(expr).__name__
    if kind == "IntImm":
        value = expr.value
    elif kind == "Cast":
        value = evaluate(expr.value)
    else:
        x, y = evaluate(expr.a), evaluate(expr.b)
        value = {"Add": x + y, "BitwiseOr": x | y, "BitwiseAnd": x & y, "RShift": x >> y}[kind]
    return value & ((1 << tvm.DataType(str(expr.ty)).bits) - 1)


@pytest.mark.parametrize("layout", ["NN", "NT", "TN"])
def test_descriptors_stepped_in_their_low_word_are_the_packed_descriptors(layout):
    """The template builds each descriptor once per kernel and moves it by 32-bit adds to its low
    word (a stage, a 64-row slice, a k16 slice): the same bits as packing it at the moved address,
    for K-major and MN-major operands, up to the top of shared memory."""
    match = match_wgmma(gemm(512, 512, 512, "float16", layout))[0]
    a, b, _ = operands(match, 128, 256, 64, 1, "m")
    for op in (a, b):
        for base in (0x400, 0x8400, 0x30000):
            low = op.desc_low(tvm.tirx.const(base, "uint32"))
            for step in (0, op.k_step, 3 * op.k_step + 1024, 0x800):  # to 224 KB
                got = evaluate(op.descriptor(low, step))
                assert got == gmma_descriptor(base + 16 * step, op.lbo, op.sbo), (layout, op.k_major, base, step)
    assert a.k_major == (layout[0] == "N") and b.k_major == (layout[1] == "T")


def test_descriptors_are_not_packed_in_the_main_loop_and_come_from_the_uniform_warpgroup():
    src = cuda_source(build(tvm.IRModule({"main": kernel(gemm(512, 512, 512), wgmma())}), H100.target))
    assert "encode_matrix_descriptor" not in src.split("__global__")[-1]
    assert "warp_id_in_cta = __shfl_sync" in src and "k_desc_ptr[0] + " in src


def test_snake_order_visits_every_tile_once_and_reverses_odd_groups_and_odd_tiles_k():
    """Plan.coords walks odd groups of rows right to left and Plan.k_step walks odd tiles' K
    backwards (matmul_wgmma.SNAKE_ORDER): still every tile once, and every K step once a tile."""
    def value(e):
        return int(sym.Analyzer().simplify(e)) if not isinstance(e, int) else e

    for m, n, k, group in ((1000, 1304, 200, 3), (4096, 2048, 4096, 16)):
        match = match_wgmma(gemm(m, n, k, "float16", "NN"))[0]
        plan = Plan(match, 128, 256, 64, 4, group, 132)
        seen = [tuple(value(c) for c in plan.coords(tirx.const(t, "int32"))) for t in range(plan.tiles)]
        assert sorted(seen) == [(0, i, j) for i in range(plan.cluster_grid_m) for j in range(plan.cluster_grid_n)]
        rows = [[j for _, i, j in seen if i == r] for r in (0, group)]  # first rows of groups 0 and 1
        assert rows[0] == sorted(rows[0]) and rows[1] == sorted(rows[1], reverse=True) and len(rows[1]) > 1
        for it in (0, 1):
            steps = [value(plan.k_step(tirx.const(it, "int32"), tirx.const(s, "int32"))) for s in range(plan.k_steps)]
            assert steps == (list(range(plan.k_steps)) if it == 0 else list(range(plan.k_steps))[::-1])


def test_cooperative_tiles_with_scalar_or_no_reads_defer_their_epilogue_into_the_next_main_loop():
    """Held outputs stored a chunk a K step in the next tile's first steps: cooperative tiles of
    plain and per-tensor-scaled GEMMs; not ping-pong tiles (already overlapped), epilogues with
    per-output reads (their prefetch ring follows the current tile), fp32 outputs, nor K loops
    shorter than a tile's chunks. Deferred kernels compile without spills."""
    def defers(func, bm, bn, wm, k_steps_ok=True):
        match = match_wgmma(func)[0]
        plan = Plan(match, bm, bn, match.bk, 4, 8, 132, wm)
        d = operands(match, bm, bn, match.bk, 1, "m")[2]
        return defers_epilogue(plan, extract_epilogue(func, match), d)

    scaled = ops.matmul_scaled(4096, 4096, 4096).func
    assert defers(gemm(4096, 4096, 4096, layout="NT"), 128, 256, 64) and defers(scaled, 128, 256, 64)
    assert defers(scaled, 256, 128, 128)  # two 64-row slices a warpgroup: 128 + 64 registers
    assert not defers(gemm(4096, 4096, 4096), 128, 128, 128)  # ping-pong
    assert not defers(ops.matmul_gated(1000, 520, 264).func, 128, 256, 64)  # a gate read per output
    assert not defers(gemm(4096, 4096, 4096, out="float32"), 128, 256, 64)
    assert not defers(gemm(4096, 4096, 192), 128, 256, 64)  # 3 K steps for 4 chunks
    assert not defers(gemm(4096, 4096, 4096), 192, 192, 64)  # three warpgroups: no room beside 96 + 48
    jobs = [(gemm(1000, 520, 1000, layout="NT"), wgmma(128, 256)), (gemm(2048, 2048, 512), wgmma(256, 128, wm=128))]
    for _, src, cubin in compile_all(jobs):
        check_hopper_kernel(src, cubin, 256 if "m64n256" in src else 128)
        assert "k_held" in src and src.count("bulk_group") >= 2  # stores in the loop and after it

"""DefaultPolicy (Roller on CUDA cores): valid, limited, deterministic, fast, family-sane configs."""

import copy
import math
import time

import pytest
from tvm import te, tirx, topi
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.analysis.func_info import analyze
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_mod_to_cubin, cuda_source
from fastdlight.config import Config
from fastdlight.policies import DefaultPolicy
from fastdlight.policies.default import MAX_UNROLLED_FMAS
from fastdlight.policies.roller import candidate_sizes
from fastdlight.policies.select import COLUMN_SUM_MIN_K, MEMORY_BOUND_KINDS, candidate_sets, default_configs
from fastdlight.schedules import dispatch_config
from fastdlight.schedules.matmul import MatmulTemplate
from fastdlight.search.options import TuneOptions
from fastdlight.search.runner import apply_and_build

H100 = CUDA("nvidia/nvidia-h100")
A100 = CUDA("nvidia/nvidia-a100")

CASES = {
    "add": lambda: ops.elementwise((4096, 4096), "float16", "add"),
    "copy_odd": lambda: ops.elementwise((1000, 1000), "float32", "copy"),
    "bias_relu": lambda: ops.elementwise((64, 128, 768), "float16", "bias_relu"),
    "sum_inner": lambda: ops.reduce((16384, 1024), "float16", "sum", -1),
    "max_inner": lambda: ops.reduce((4096, 1000), "float32", "max", -1),
    "sum_outer": lambda: ops.reduce((4096, 1024), "float16", "sum", 0),
    "max_outer": lambda: ops.reduce((2048, 512), "float32", "max", 0),
    "softmax": lambda: ops.softmax(4096, 1024),
    "gemv_1": lambda: ops.gemv(16384, 4096, m=1),
    "gemv_8": lambda: ops.gemv(4096, 4096, m=8),
    "matmul_nn": lambda: ops.matmul(2048, 2048, 2048, "float32", layout="NN"),
    "matmul_nt_batch": lambda: ops.matmul(512, 512, 256, "float16", layout="NT", batch=8),
    "matmul_tn_batch": lambda: ops.matmul(512, 384, 256, "float32", layout="TN", batch=4),
    "matmul_odd": lambda: ops.matmul(1000, 1000, 1000, "float32"),
    "conv2d": lambda: ops.conv2d_nhwc(8, 56, 56, 64, 64, dtype="float32"),
    "conv2d_s2": lambda: ops.conv2d_nhwc(8, 28, 28, 64, 128, stride=2, dtype="float16"),
}
_CONFIGS = {}


def configs(name, arch=H100, topk=20):
    key = (name, arch.name, topk)
    if key not in _CONFIGS:
        op = CASES[name]()
        policy = DefaultPolicy(op.func, arch)
        _CONFIGS[key] = (op, policy, policy.emit_config(topk))
    return _CONFIGS[key]


@pytest.mark.parametrize("name", sorted(CASES))
def test_configs_are_valid_distinct_and_ranked(name):
    op, policy, cfgs = configs(name)
    info = policy.info
    assert 10 <= len(cfgs) <= 20
    assert len(set(cfgs)) == len(cfgs)
    assert [c.cost for c in cfgs] == sorted(c.cost for c in cfgs)
    for c in cfgs:
        assert c.kind == info.kind and c.cost > 0
        assert len(c.block) == len(c.thread) == len(info.spatial_axes)
        assert len(c.rstep) == len(info.reduce_axes)
        assert not c.reduce_thread or len(c.reduce_thread) == len(info.reduce_axes)
        assert Config.from_dict(c.to_dict()) == c
        for name_, width in c.vectorize:
            assert name_ in {t.name for t in info.inputs + info.outputs}
            bits = next(t.bits for t in info.inputs + info.outputs if t.name == name_)
            assert width * bits <= 128


@pytest.mark.parametrize("name", sorted(CASES))
def test_limits_of_the_arch_are_respected(name):
    op, policy, cfgs = configs(name)
    arch = policy.arch
    for c in cfgs:
        res = policy.resources(c)
        assert res["threads"] == c.num_threads <= arch.max_threads_per_block
        assert c.num_threads % arch.warp_size == 0
        assert res["smem"] <= arch.smem_per_block
        assert res["regs"] <= arch.max_regs_per_thread and res["regs"] * c.num_threads <= arch.regs_per_block
        assert 1 <= res["blocks_per_sm"] <= arch.max_blocks_per_sm
        if c.kind == "matmul":  # shared memory holds at least one stage of every input tile
            assert sum(policy.info.footprint_bytes(c.block, c.rstep).values()) <= arch.smem_per_block


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiles_divide_or_pad(name):
    op, policy, cfgs = configs(name)
    for c in cfgs:
        for axis, b, t in zip(policy.info.spatial_axes, c.block, c.thread):
            # a factor of the extent, or a (padded) power of two below it
            assert b in candidate_sizes(axis.extent), (axis, c)
            assert b % t == 0
        for axis, r in zip(policy.info.reduce_axes, c.rstep):
            assert r <= axis.extent


def test_small_shared_memory_budget_is_honored():
    small = copy.copy(H100)
    small.smem_per_block = 8 * 1024
    policy = DefaultPolicy(ops.matmul(2048, 2048, 2048, "float32").func, small)
    cfgs = policy.emit_config(20)
    assert cfgs
    for c in cfgs:
        assert sum(policy.info.footprint_bytes(c.block, c.rstep).values()) <= 8 * 1024
        assert policy.resources(c)["smem"] <= 8 * 1024
    big = {c.block for c in configs("matmul_nn")[2]}
    assert max(math.prod(b) for b in big) > max(math.prod(c.block) for c in cfgs)


def test_deterministic():
    for name in ("matmul_tn_batch", "softmax", "bias_relu"):
        op = CASES[name]()
        a = DefaultPolicy(op.func, H100).emit_config(15)
        b = DefaultPolicy(CASES[name]().func, H100).emit_config(15)
        assert [repr(c) for c in a] == [repr(c) for c in b]
        assert [c.cost for c in a] == [c.cost for c in b]
    assert DefaultPolicy(op.func, H100).emit_config(0) == []


@pytest.mark.parametrize(
    "build",
    [
        lambda: ops.matmul(4096, 4096, 4096, "float32"),
        lambda: ops.reduce((16384, 1024), "float16"),
        lambda: ops.elementwise((16384, 16384), "float16", "add"),
    ],
    ids=["matmul4096", "rowsum", "add16384"],
)
def test_policy_is_fast(build):
    func = build().func
    start = time.perf_counter()
    cfgs = DefaultPolicy(func, H100).emit_config(20)
    elapsed = time.perf_counter() - start
    assert len(set(cfgs)) == 20
    assert elapsed < 2.0, elapsed


def test_hardware_changes_the_ranking():
    _, _, h100 = configs("sum_inner", H100)
    _, _, a100 = configs("sum_inner", A100)
    assert h100[0] != a100[0] or [c.cost for c in h100] != [c.cost for c in a100]


# -- family-specific sanity -----------------------------------------------------------------------


def test_elementwise_configs():
    _, policy, cfgs = configs("add")
    for c in cfgs:
        assert c.thread[0] == 1 and c.thread[1] % 8 == 0  # whole 128-bit fp16 vectors
        assert 256 <= c.num_threads <= 1024
        assert dict(c.vectorize) == {"A": 8, "B": 8, "C": 8}
    _, _, bias = configs("bias_relu")
    assert all(c.vector_width("bias") == 8 and c.thread[:2] == (1, 1) for c in bias)


def test_inner_reduction_configs():
    for name in ("sum_inner", "max_inner"):
        _, policy, cfgs = configs(name)
        for c in cfgs:
            (rt,), (step,) = c.reduce_thread, c.rstep
            assert rt > 1 and step % rt == 0  # threads split the row, each a vector per step
            assert c.block[0] <= 64 and 128 <= c.num_threads <= 1024
    assert any(c.vector_width("A") == 8 for c in configs("sum_inner")[2])


def test_outer_reduction_configs():
    _, policy, cfgs = configs("sum_outer")  # B[j] = sum_k A[k, j]: j contiguous
    for c in cfgs:
        assert c.block[0] % 8 == 0 and c.thread[0] % 8 == 0  # whole fp16 vectors of j per thread
        assert c.rstep[0] % c.reduce_thread[0] == 0
        assert c.vector_width("A") == 8


def test_general_reduction_configs():
    _, policy, cfgs = configs("softmax")
    assert policy.info.output_block == "row_sum"
    for c in cfgs:
        assert c.block[0] <= 16 and c.reduce_thread[0] >= 8
        assert c.rstep[0] % c.reduce_thread[0] == 0


def test_gemv_configs():
    for name, m in (("gemv_1", 1), ("gemv_8", 8)):
        _, policy, cfgs = configs(name)
        for c in cfgs:
            assert 32 <= c.reduce_thread[0] <= 256
            assert c.vector_width("W") == 8
            if m > 1:
                assert c.block[0] == c.thread[0] == m  # every block and thread holds all M rows
            assert c.block[-1] <= 16


def test_matmul_configs():
    _, policy, cfgs = configs("matmul_nn")
    assert any(c.block == (128, 128) and c.thread == (8, 8) for c in cfgs)
    for c in cfgs:
        assert all(t in (4, 8) for t in c.thread)
        assert 8 <= c.rstep[0] <= 32 and c.pipeline_stages in (1, 2)
        # 128-bit loads unless the tile is too small to give every thread a whole vector
        a, b = policy.info.footprint(c.block, c.rstep).values()
        for name_, region in (("A", a), ("B", b)):
            w = c.vector_width(name_)
            assert w in (2, 4) and math.prod(region) % (w * c.num_threads) == 0
            assert w == 4 or math.prod(region) % (4 * c.num_threads)
    assert {c.pipeline_stages for c in cfgs} == {1, 2}
    _, _, batched = configs("matmul_nt_batch")
    assert all(c.thread[0] == 1 for c in batched)  # batch axis: no micro tile


def test_non_square_micro_tiles_come_in_both_orientations():
    # fp32 1024³ on an H100: 64×64 tiles with 8×4 micro tiles measured 34.3 TFLOPS, 4×8 31.4;
    # the model cannot tell them apart, so both are emitted, more rows per thread first
    cfgs = DefaultPolicy(ops.matmul(1024, 1024, 1024, "float32").func, H100).emit_config(20)
    for stages, async_copy in ((2, False), (2, True), (1, False)):
        same = [c for c in cfgs if c.block == (64, 64) and c.pipeline_stages == stages
                and c.use_async_copy == async_copy]
        assert [c.thread for c in same] == [(8, 4), (4, 8)]
        assert cfgs.index(same[0]) < cfgs.index(same[1])
    square = DefaultPolicy(ops.matmul(4096, 4096, 4096, "float32").func, H100).emit_config(20)
    assert all(c.thread == (8, 8) for c in square)  # a square micro tile has no twin


def test_conv_configs():
    _, policy, cfgs = configs("conv2d")
    for c in cfgs:
        assert c.thread[0] == c.thread[1] == 1 and c.thread[2] >= 2 and c.thread[3] >= 4
        assert math.prod(c.rstep) >= 8 and c.rstep[2] > 1  # channels: the contiguous reduction
        w_tile = math.prod(policy.info.footprint(c.block, c.rstep)["W"])
        assert c.vector_width("W") == (4 if w_tile % (4 * c.num_threads) == 0 else 1)


def depthwise_conv(c=240, hw=28, r=5, dtype="float16"):
    """EfficientNet's 5x5 depthwise convolution (NHWC, stride 1): a reduction of 25 products."""
    x = te.placeholder((1, hw, hw, c), dtype, name="X")
    w = te.placeholder((c, r, r), dtype, name="W")
    p = r // 2
    pad = te.compute((1, hw + 2 * p, hw + 2 * p, c), lambda n, h, v, k: tirx.if_then_else(
        tirx.all(h >= p, h < hw + p, v >= p, v < hw + p), x[n, h - p, v - p, k], tirx.const(0, dtype)), name="pad")
    ry, rx = te.reduce_axis((0, r), "ry"), te.reduce_axis((0, r), "rx")
    out = te.compute((1, hw, hw, c), lambda n, h, v, k: te.sum(
        pad[n, h + ry, v + rx, k].astype("float32") * w[k, ry, rx].astype("float32"), axis=[ry, rx]), name="conv")
    return te.create_prim_func([x, w, out])


def test_a_one_step_reduction_emits_each_kernel_once():
    policy = DefaultPolicy(depthwise_conv(), H100)
    cfgs = policy.emit_config(20)
    assert cfgs and all(c.rstep == (5, 5) for c in cfgs)  # the whole window in one step
    # nothing to prefetch: no pipelined twin of a config, and none refilled from lower ranks
    assert all(c.pipeline_stages == 1 and not c.use_async_copy for c in cfgs)
    assert len({(c.block, c.thread) for c in cfgs}) == len(cfgs) < 20
    # a reduction of several steps keeps its pipelining variants
    assert {c.pipeline_stages for c in configs("matmul_nn")[2]} == {1, 2}


def test_pipelining_a_one_step_reduction_builds_the_same_kernel():
    func = depthwise_conv()
    plain = DefaultPolicy(func, H100).emit_config(1)[0]
    sources = set()
    for stages, async_copy in ((1, False), (2, False), (2, True)):
        config = Config(**{**plain.__dict__, "pipeline_stages": stages, "use_async_copy": async_copy})
        sch = MatmulTemplate().apply_config(func, config)
        sources.add(compile_mod_to_cubin(sch.mod, H100.target)[0])
    assert len(sources) == 1


def test_non_divisible_shapes_pad():
    _, policy, cfgs = configs("matmul_odd")
    assert any(1000 % b for c in cfgs for b in c.block)  # padded tiles are allowed
    _, _, copy_cfgs = configs("copy_odd")
    assert all(c.vector_width("A") in (1, 2, 4, 8) and 1000 % c.thread[-1] == 0 for c in copy_cfgs)


# -- errors and package surface -------------------------------------------------------------------


def test_symbolic_shapes_need_opt_shapes():
    n = tirx.Var("n", "int64")
    A = te.placeholder((n, 4096), "float16", name="A")
    k = te.reduce_axis((0, 4096), name="k")
    func = te.create_prim_func([A, te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")])
    with pytest.raises(ValueError, match="n"):
        DefaultPolicy(func, H100)
    cfgs = DefaultPolicy(func, H100, opt_shapes={"n": 8192}).emit_config(5)
    assert len(cfgs) == 5 and all(c.kind == "reduction" for c in cfgs)


@T.prim_func(s_tir=True)
def opaque_block(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("opaque"):  # no iteration variables: nothing to tile
            T.reads(A[i])
            T.writes(B[i])
            B[i] = A[i] * T.float32(2)


def test_unhandled_function_raises():
    with pytest.raises(ValueError, match="cannot be normalized"):
        DefaultPolicy(opaque_block, H100)


def test_accepts_a_func_info():
    info = analyze(CASES["softmax"]().func)
    from_info = DefaultPolicy(info, H100).emit_config(3)
    assert from_info == DefaultPolicy(CASES["softmax"]().func, H100).emit_config(3)
    assert set(from_info) <= set(configs("softmax")[2])


def _conv2d_nchw(n=16, c=512, hw=7, k=512):
    data = te.placeholder((n, c, hw, hw), "float16", name="data")
    weight = te.placeholder((k, c, 3, 3), "float16", name="weight")
    out = topi.nn.conv2d_nchw(data, weight, 1, 1, 1, out_dtype="float32")
    return te.create_prim_func([data, weight, out])


def test_nchw_convolution_gets_configs_with_channels_and_width_as_the_micro_axes():
    """ResNet's last stage in NCHW: output [16, 512, 7, 7]. The micro tile goes on the output
    channels (GEMM N, the weight's) and the width (GEMM M, the data's), not on 7 x 7."""
    func = _conv2d_nchw()
    policy = DefaultPolicy(func, H100)
    assert policy.planner.micro == (1, 3)
    configs = policy.emit_config(4)
    assert configs and all(c.kind == "matmul" and c.thread[1] > 1 for c in configs)
    results, best = apply_and_build(func, configs[:1], H100, options=TuneOptions(measure=False))
    assert best.compiled and best.registers > 0


def test_matmul_and_nhwc_conv_keep_their_last_two_axes_as_micro_axes():
    assert DefaultPolicy(ops.matmul(512, 512, 512, "float32").func, H100).planner.micro == (0, 1)
    assert DefaultPolicy(ops.conv2d_nhwc(8, 28, 28, 64, 64, dtype="float32").func, H100).planner.micro == (2, 3)


def test_cuda_core_candidates_bound_their_unrolled_k_step():
    """nvcc time grows with outputs per thread x rstep: ResNet's fp16 convolutions at 8x8 x 32
    took 11-19 s each to compile. The bound keeps the shape of the best fp32 GEMM (8x8 x 16)."""
    conv = ops.conv2d_nhwc(16, 56, 56, 64, 64, dtype="float16", out_dtype="float32").func
    configs = DefaultPolicy(conv, H100).emit_config(20)
    assert configs
    assert max(math.prod(c.thread) * math.prod(c.rstep) for c in configs) <= MAX_UNROLLED_FMAS
    gemm = DefaultPolicy(ops.matmul(4096, 4096, 4096, "float32").func, H100).emit_config(20)
    assert any(sorted(c.thread) == [8, 8] and math.prod(c.rstep) == 16 for c in gemm)


def test_memory_bound_functions_get_fewer_candidates_than_matmuls():
    h100 = CUDA("nvidia/nvidia-h100")
    for op in (ops.elementwise((4096, 4096), "float16", "add"), ops.reduce((4096, 1024), "float16", "sum"),
               ops.softmax(4096, 4096)):
        (capped,) = candidate_sets(op.func, h100, 20, memory_bound_topk=6)
        (full,) = candidate_sets(op.func, h100, 20)
        assert len(capped.configs) == 6 < len(full.configs) and capped.configs[0] == full.configs[0], op.name
        assert {c.kind for c in capped.configs} <= set(MEMORY_BOUND_KINDS)
    matmul = ops.matmul(512, 512, 512, "float32")
    assert len(next(candidate_sets(matmul.func, h100, 20, memory_bound_topk=6)).configs) == 20


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_memory_bound_topk_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="memory_bound_topk"):
        TuneOptions(memory_bound_topk=bad)


def _matmul_kn(m, n=11008, k=4096):
    """A decode step's matmul as a model hands it over: the weight stored [K, N]."""
    x = te.placeholder((m, k), "float16", name="X")
    w = te.placeholder((k, n), "float16", name="W")
    r = te.reduce_axis((0, k), name="k")
    y = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("float32") * w[r, j].astype("float32"), axis=r), name="Y")
    return te.create_prim_func([x, w, te.compute((m, n), lambda i, j: y[i, j].astype("float16"), name="O")])


@pytest.mark.parametrize("m", [1, 16])
def test_a_decode_matmul_with_a_kn_weight_is_a_column_sum_first_and_its_configs_compile(m):
    """Along a long K the column sums rank first; a few matmul tiles compete after them."""
    h100 = CUDA("nvidia/nvidia-h100")
    func = _matmul_kn(m).with_attr("global_symbol", "main")
    configs = default_configs(func, h100, 20)
    sums = [c for c in configs if c.kind == "reduction"]
    tiles = [c for c in configs if c.kind == "matmul"]
    assert configs[0].kind == "reduction" and len(sums) > len(tiles) >= 1
    assert max(c.cost for c in sums) < min(c.cost for c in tiles)  # tiles rank after the sums
    src = cuda_source(build(dispatch_config(func, sums[0]).schedule.mod, h100.target))
    assert "__global__" in src


@pytest.mark.parametrize(("n", "k", "first"), [(48, 1152, "reduction"), (96, 8, "matmul")])
def test_a_short_k_decode_matmul_keeps_the_matmul_tiles_first(n, k, first):
    """A squeeze-and-excitation FC at batch 1: the column sum from K = 64 on, the tiles (one
    thread's walk along K is short) below."""
    configs = default_configs(_matmul_kn(1, n, k), CUDA("nvidia/nvidia-h200"), 20)
    assert (k >= COLUMN_SUM_MIN_K) == (first == "reduction") and configs[0].kind == first
    assert {c.kind for c in configs} == {"matmul", "reduction"}


def test_a_prefill_matmul_gets_no_column_sum_configs():
    configs = default_configs(_matmul_kn(512, 1024, 1024), CUDA("nvidia/nvidia-h100"), 20)
    assert {c.kind for c in configs} == {"matmul"}


def rotary(heads: int, head_dim: int):
    """``x * cos + rotate_half(x) * sin`` over heads of ``head_dim``, ``x`` the flat projection
    output a decode step splits into heads: its swapped halves read across the head's row, a
    gather TVM does not vectorize."""
    x = te.placeholder((heads * head_dim,), "float16", name="x")
    cos = te.placeholder((head_dim,), "float16", name="cos")
    sin = te.placeholder((head_dim,), "float16", name="sin")
    half = head_dim // 2

    def rotated(h, d):
        return tirx.if_then_else(d < half, -x[h * head_dim + d + half], x[h * head_dim + d - half])

    y = te.compute((heads, head_dim), lambda h, d: x[h * head_dim + d] * cos[d] + rotated(h, d) * sin[d], name="y")
    return te.create_prim_func([x, cos, sin, y])


def test_a_small_gather_is_also_offered_one_element_a_thread():
    def per_thread(func):
        return {c.thread[-1] for c in DefaultPolicy(func, H100).emit_config(20)}

    assert 1 in per_thread(rotary(32, 96))  # a decode step's rotary: 3,072 elements
    assert 1 not in per_thread(rotary(4096, 128))  # a prefill's: the vectors as before

"""Tensor-core eligibility (get_tensorized_func_and_tags) and TensorCorePolicy limits (CPU only)."""

import pytest
from tvm import te, topi

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.policies.tensorcore import (
    TensorCorePolicy,
    TileCandidate,
    get_tensorized_func_and_tags,
    tensorcore_tags,
)

H100, A100 = "nvidia/nvidia-h100", "nvidia/nvidia-a100"


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize(
    "dtype,out,compute",
    [("float16", "float32", "mma_f16f16f32"), ("float16", "float16", "mma_f16f16f16"), ("int8", "int32", "mma_i8i8i32")],
)
def test_eligible_layouts_and_dtypes(layout, dtype, out, compute):
    op = ops.matmul(256, 128, 64, dtype, out, layout)
    func, tags = get_tensorized_func_and_tags(op.func, H100)
    if dtype == "int8" and layout != "NT":  # TVM's int8 ldmatrix: A and B must be K-inner
        assert func is op.func and tags is None
        assert "int8 layout" in tensorcore_tags(op.func, H100)[1]
        return
    assert func is op.func and tags is not None
    assert (tags["in_dtype"], tags["acc_dtype"], tags["layout"]) == (dtype, out, layout)
    assert (tags["M"], tags["N"], tags["K"], tags["batch"]) == (256, 128, 64, 1)
    assert tags["intrin_group"]["compute"].startswith(compute)
    assert tags["mma_shape"] == ((16, 8, 32) if dtype == "int8" else (16, 8, 16))
    if dtype == "float16":  # shared memory keeps the stored layout: ldmatrix .trans transposes
        assert tags["smem_layout"] == layout
        assert ("_trans_b" in tags["intrin_group"]["compute"]) == (layout[1] == "T")
        assert ("_trans_a" in tags["intrin_group"]["compute"]) == (layout[0] == "T")
    else:
        assert tags["smem_layout"] == "NT"


def test_batched_and_sm90a():
    op = ops.matmul(512, 256, 128, "float16", "float32", "NT", batch=6)
    _, tags = get_tensorized_func_and_tags(op.func, CUDA(H100))
    assert tags["batch"] == 6 and tags["M"] == 512
    assert CUDA(H100).arch == "sm_90a"  # Dlight's check_sm_version gives -1 here: we must not


def test_bf16_nt_takes_mma_sync_everywhere_and_wgmma_on_sm_90a():
    op = ops.matmul(256, 128, 64, "bfloat16", "float32", "NT")
    _, tags = get_tensorized_func_and_tags(op.func, H100)
    assert tags["instructions"] == ("wgmma", "mma.sync") and tags["intrin_group"]["compute"] == "mma_bf16bf16f32_trans_b"
    _, tags = get_tensorized_func_and_tags(op.func, A100)
    assert tags["instructions"] == ("mma.sync",) and tags["intrin_group"]["load_a"] == "mma_ldmatrix_bf16_a_dyn"
    assert {c.kind for c in TensorCorePolicy(op.func, CUDA(A100), tags).emit_config(6)} == {"matmul_tc"}
    # decode-sized bf16 (M = 16: below wgmma's 64 rows) reaches tensor cores through mma.sync
    _, tags = get_tensorized_func_and_tags(ops.matmul(16, 4096, 4096, "bfloat16", "float32", "NT").func, H100)
    assert tags["instructions"] == ("mma.sync",)
    # other layouts would need ldmatrix .trans, which TVM emits for fp16 only: wgmma or CUDA cores
    nn = ops.matmul(256, 128, 64, "bfloat16", "float32", "NN").func
    assert get_tensorized_func_and_tags(nn, H100)[1]["instructions"] == ("wgmma",)
    assert "bf16 layout NN" in tensorcore_tags(nn, A100)[1]
    # a bf16 accumulator has no mma.sync form: wgmma alone where it applies, else CUDA cores
    _, reason = tensorcore_tags(ops.matmul(256, 128, 64, "bfloat16", "bfloat16", "NT").func, A100)
    assert "bfloat16" in reason


def test_fp16_on_sm_90a_gets_both_instructions_and_can_ask_for_one():
    op = ops.matmul(1024, 1024, 1024, "float16", "float32", "NN")
    _, tags = get_tensorized_func_and_tags(op.func, H100)
    assert tags["instructions"] == ("wgmma", "mma.sync")
    both = TensorCorePolicy(op.func, CUDA(H100), tags).emit_config(10)
    assert {c.kind for c in both} == {"matmul_wgmma", "matmul_tc"} and len(both) == 10
    assert [c.cost for c in both] == sorted(c.cost for c in both)
    only = TensorCorePolicy(op.func, CUDA(H100), tags, instructions=("mma.sync",)).emit_config(10)
    assert {c.kind for c in only} == {"matmul_tc"}
    assert get_tensorized_func_and_tags(op.func, A100)[1]["instructions"] == ("mma.sync",)
    with pytest.raises(ValueError, match="available"):
        TensorCorePolicy(op.func, CUDA(A100), instructions=("wgmma",))


@pytest.mark.parametrize(
    "make,why",
    [
        (lambda: ops.matmul(256, 128, 64, "float32"), "no tensor-core path"),
        (lambda: ops.matmul(256, 8, 64), "below 16"),
        (lambda: ops.matmul(8, 256, 64), "below 16"),
        (lambda: ops.matmul(256, 256, 8), "below 16"),
        (lambda: ops.elementwise((64, 64)), "reduction"),
        (lambda: ops.softmax(64, 64), "reduction"),
        (lambda: ops.reduce((64, 64)), "sum of products"),
        (lambda: ops.gemv(4096, 4096, 1), "M, one N"),
    ],
)
def test_ineligible(make, why):
    func = make().func
    out, tags = get_tensorized_func_and_tags(func, H100)
    assert out is func and tags is None
    _, reason = tensorcore_tags(func, H100)
    assert why in reason


@pytest.mark.parametrize("r,stride,pad", [(3, 1, 1), (1, 2, 0), (7, 2, 3)])
def test_nhwc_convolution_is_an_implicit_gemm(r, stride, pad):
    """I = N·P·Q output pixels, J = output channels, K = R·S·C: no im2col buffer, the template
    reindexes the input while copying it to shared memory."""
    op = ops.conv2d_nhwc(1, 16, 16, 32, 64, r, r, stride, pad)
    _, tags = get_tensorized_func_and_tags(op.func, H100)
    out = (16 + 2 * pad - r) // stride + 1
    assert (tags["M"], tags["N"], tags["K"], tags["batch"]) == (out * out, 64, r * r * 32, 1)
    assert tags["layout"] == "NN" and tags["instructions"] == ("mma.sync",)  # HWIO weights: C·K rows


def test_no_tensor_cores_before_sm80():
    op = ops.matmul(256, 256, 256)
    assert get_tensorized_func_and_tags(op.func, "nvidia/nvidia-t4")[1] is None
    assert get_tensorized_func_and_tags(op.func, "nvidia/nvidia-v100")[1] is None
    assert get_tensorized_func_and_tags(op.func, A100)[1] is not None


def test_epilogue_counted():
    _, tags = get_tensorized_func_and_tags(ops.matmul_bias_relu(256, 256, 128).func, H100)
    assert tags["epilogue"] == 1 and tags["out_dtype"] == "float16" and tags["acc_dtype"] == "float32"


def _policy(target, m=4096, n=4096, k=4096, dtype="float16", out="float32", layout="NT"):
    """The mma.sync search (on the H100 the wgmma tiles join it: see the wgmma policy's tests)."""
    op = ops.matmul(m, n, k, dtype, out, layout)
    func, tags = get_tensorized_func_and_tags(op.func, target)
    return TensorCorePolicy(func, CUDA(target), tags, instructions=("mma.sync",))


def test_policy_4096_nt_h100():
    policy = _policy(H100)
    configs = policy.emit_config(20)
    assert len(configs) >= 10
    assert len(set(configs)) == len(configs)
    assert configs == policy.emit_config(20)  # deterministic
    costs = [c.cost for c in configs]
    assert costs == sorted(costs) and costs[0] > 0
    arch = policy.arch
    for c in configs:
        assert c.kind == "matmul_tc"
        assert all(b % 16 == 0 and b >= 16 for b in c.block)
        assert all(w % 16 == 0 for w in c.warp)
        assert c.rstep[0] % 16 == 0 and c.rstep[0] >= 32
        assert 2 <= c.pipeline_stages <= 4 and c.use_async_copy
        assert c.num_threads % 32 == 0 and 2 <= c.num_warps <= 8
        cand = TileCandidate(*c.block, *c.warp, c.rstep[0], c.pipeline_stages)
        assert policy.smem_bytes(cand) <= arch.smem_per_block_optin
        assert policy.registers(cand) <= 255
    # 128 MB of operands+output overflow the 50 MB L2: the launch order is swizzled
    assert all(c.rasterization > 0 for c in configs)
    # the top of the ranking uses large tiles with 64x64 warp tiles
    assert configs[0].block in ((128, 256), (256, 128)) and configs[0].warp == (64, 64)


def test_smem_counts_stages_and_optin_limit():
    # fp16 accumulators make the A/B pipeline (not the accumulator staging) the larger buffer
    h100 = _policy(H100, out="float16")
    a100 = _policy(A100, out="float16")
    deep, shallow = TileCandidate(128, 256, 64, 64, 64, 4), TileCandidate(128, 256, 64, 64, 64, 2)
    assert h100.smem_bytes(deep) == 4 * (128 + 256) * 64 * 2
    assert h100.smem_bytes(deep) == 2 * h100.smem_bytes(shallow)
    # 192 KB: above the A100's 163 KB opt-in limit, below the H100's 227 KB
    assert h100.fits(deep) and not a100.fits(deep)
    assert a100.fits(shallow)
    assert all(a100.smem_bytes(TileCandidate(*c.block, *c.warp, c.rstep[0], c.pipeline_stages)) <= 163 * 1024
               for c in a100.emit_config(50))  # fmt: skip


def test_registers_limit_warp_tiles():
    policy = _policy(H100)
    assert not policy.fits(TileCandidate(128, 256, 64, 128, 32, 3))  # 256 fp32 accumulators a thread
    assert policy.fits(TileCandidate(128, 256, 64, 64, 32, 3))


def test_a100_and_h100_differ():
    # 132 vs 108 SMs and different tensor/smem balance: the rankings are not the same
    for shape in [(4096, 4096, 4096), (1000, 3000, 520), (2048, 1024, 4096)]:
        h = _policy(H100, *shape).emit_config(10)
        a = _policy(A100, *shape).emit_config(10)
        assert h and a
    assert _policy(H100, 2048, 1024, 4096).emit_config(10) != _policy(A100, 2048, 1024, 4096).emit_config(10)


@pytest.mark.parametrize("shape", [(512, 64, 512), (512, 32, 512), (512, 16, 512), (1000, 3000, 520), (16, 16, 16)])
def test_small_and_odd_shapes(shape):
    configs = _policy(H100, *shape, layout="NN").emit_config(10)
    assert configs
    m, n, _ = shape
    for c in configs:
        # tiles are never much larger than the (16-padded) problem
        assert c.block[0] <= max(16, 1 << (m - 1).bit_length()) and c.block[1] <= max(16, 1 << (n - 1).bit_length())


def test_int8_steps():
    configs = _policy(H100, dtype="int8", out="int32").emit_config(10)
    assert configs and all(c.rstep[0] % 32 == 0 for c in configs)


def test_split_k_where_the_tiles_fill_less_than_a_wave():
    """Decode (M = 16, K = 11008): 4096 / 256 = 16 output tiles across 132 SMs, so the policy
    cuts K into slices; at most half of the top-k split, and the non-split tiles stay. A 4096^3
    GEMM fills the GPU many times over: no split."""
    policy = _policy(H100, 16, 4096, 11008)
    assert policy.tags["split_extent"] == 11008
    configs = policy.emit_config(20)
    split = [c for c in configs if c.split_k > 1]
    assert 0 < len(split) <= 10 and len(configs) == 20
    for c in split:
        grid = -(-16 // c.block[0]) * -(-4096 // c.block[1])
        assert 11008 % c.split_k == 0 and (11008 // c.split_k) % 16 == 0
        assert grid < policy.arch.sm_count * policy.blocks_per_sm(TileCandidate(*c.block, *c.warp, c.rstep[0], c.pipeline_stages))
        assert f"split_k={c.split_k}" in repr(c)
    # a split candidate costs its slices' fewer K-steps plus the partial sums' kernel
    whole = TileCandidate(16, 128, 16, 64, 64, 4)
    assert policy.cost(TileCandidate(16, 128, 16, 64, 64, 4, splits=4)) < policy.cost(whole)
    assert policy.split_sum_cost(TileCandidate(16, 128, 16, 64, 64, 4, splits=4)) > 0 == policy.split_sum_cost(whole)
    assert not any(c.split_k > 1 for c in _policy(H100).emit_config(20))


def test_split_k_slices_a_convolutions_input_channels():
    data = te.placeholder((16, 7, 7, 512), "float16", name="data")
    weight = te.placeholder((512, 3, 3, 512), "float16", name="weight")
    conv = topi.nn.conv2d(data, weight, 1, 1, 1, data_layout="NHWC", kernel_layout="OHWI", out_dtype="float32")
    func, tags = get_tensorized_func_and_tags(te.create_prim_func([data, weight, topi.cast(conv, "float16")]), H100)
    assert tags["K"] == 4608 and tags["split_extent"] == 512  # rc, not the fused (ry, rx, rc)
    configs = TensorCorePolicy(func, CUDA(H100), tags, instructions=("mma.sync",)).emit_config(20)
    assert any(c.split_k > 1 for c in configs) and all(512 % c.split_k == 0 for c in configs)

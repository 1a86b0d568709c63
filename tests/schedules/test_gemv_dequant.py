"""The dequantizing GEMV (CPU): which shapes its policy takes (4- and 8-bit weights, fp16 and bf16
activations), that a decode function gets it and stock Dlight only, and that every config
compiles to a cubin for Hopper without spilling."""

import pytest
import tvm

from fastdlight import ops
from fastdlight.analysis.weight_only import WeightOnlyShape, match_weight_only
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import compile_mod_to_cubin
from fastdlight.policies.gemv_dequant import dequant_gemv_configs
from fastdlight.policies.select import candidate_sets
from fastdlight.schedules import stream_load
from fastdlight.schedules.gemv_dequant import DequantGemvTemplate
from fastdlight.schedules.gemv_dequant_mma import DequantGemvMmaTemplate

H100 = CUDA(tvm.target.Target("nvidia/nvidia-h100"))
SM90A = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


@pytest.mark.parametrize("m, n, k, dtype, takes, bits", [
    (1, 11008, 4096, "float16", True, 4),
    (16, 4096, 2048, "float16", True, 4),
    (17, 4096, 2048, "float16", False, 4),  # prefill rows: the tensor-core templates
    (1, 4096, 4096, "bfloat16", True, 4),
    (1, 4096, 4080, "float16", False, 4),  # K not in whole 32-weight lane steps
    (8, 4096, 11008, "float16", False, 4),  # the activations would not fit in shared memory
    (1, 4096, 4096, "float16", True, 8),
    (1, 4096, 4096, "bfloat16", False, 8),  # 8-bit values do not fit bf16's mantissa
])  # fmt: skip
def test_the_policy_takes_decode_shapes_only(m, n, k, dtype, takes, bits):
    group = 16 if k % 128 else 128
    shape = WeightOnlyShape((m,), n, k, group, dtype, dtype, bits=bits)
    configs = dequant_gemv_configs(shape, H100)
    assert bool(configs) == takes
    assert all(c.kind in ("gemv_dequant", "gemv_dequant_mma") and c.num_threads in (128, 256, 512) for c in configs)


def test_a_decode_function_gets_the_template_and_stock_only():
    op = ops.matmul_int4(1, 4096, 4096)
    sets = list(candidate_sets(op.func, H100, 20))
    assert [s.policy for s in sets] == ["DequantGemvPolicy"]
    assert {c.kind for c in sets[0].configs} == {"gemv_dequant"}


@pytest.mark.parametrize("m, n, k, group, zero_point, dtype, bits", [
    (1, 4100, 4096, 128, False, "float16", 4),  # N not a multiple of a CTA's rows
    (3, 1000, 11008, 64, True, "float16", 4),  # K / 32 not a multiple of a warp's 32 lanes: a partial last step
    (2, 1000, 2048, 64, True, "bfloat16", 4),
    (1, 4100, 4096, 128, False, "float16", 8),
    (2, 1000, 11008, 64, True, "float16", 8),
])  # fmt: skip
def test_every_config_compiles_to_a_cubin(m, n, k, group, zero_point, dtype, bits):
    make = ops.matmul_int8 if bits == 8 else ops.matmul_int4
    op = make(m, n, k, group_size=group, dtype=dtype, zero_point=zero_point)
    configs = dequant_gemv_configs(match_weight_only(op.func), H100)
    assert len(configs) >= 6
    templates = {"gemv_dequant": DequantGemvTemplate(), "gemv_dequant_mma": DequantGemvMmaTemplate()}
    for config in configs[:3] if zero_point else configs:
        kernel = templates[config.kind].apply_config(op.func, config)
        assert kernel is not None, config
        assert [str(p.name) for p in kernel.params] == [str(p.name) for p in op.func.params]
        src, cubin = compile_mod_to_cubin(tvm.IRModule({"main": kernel}), SM90A)
        assert cubin.spill_bytes == 0, (config, cubin.log)
        # the paired 16-bit arithmetic, not per element; or the products on tensor cores
        assert "__hfma2" in src or config.kind == "gemv_dequant_mma" and "mma.sync.aligned.m16n8k16" in src
        assert ("fdl_w4b" in src) == (dtype == "bfloat16") and ("fdl_w8" in src) == (bits == 8)


def test_persistent_configs_come_where_the_row_blocks_outnumber_the_ctas_and_compile():
    op = ops.matmul_int4(1, 11008, 4096)
    configs = [c for c in dequant_gemv_configs(match_weight_only(op.func), H100, 20) if c.persistent]
    assert configs  # 4 warps of one row: 2752 blocks, 16 CTAs of them on each of 132 SMs
    with tvm.target.Target("nvidia/nvidia-h100"):
        kernel = DequantGemvTemplate().apply_config(op.func, configs[0])
    src, cubin = compile_mod_to_cubin(tvm.IRModule({"main": kernel}), SM90A)
    assert cubin.spill_bytes == 0 and "for (int turn = 0; turn <" in src


@pytest.mark.parametrize("zero_point", [False, True])
def test_a_ctas_scales_and_zero_points_are_read_before_its_barrier_and_then_from_shared_memory(zero_point):
    """Read in place, ptxas sank the scale loads past the CTA's last weights (one more HBM round
    trip a CTA): they are staged with the activations instead."""
    op = ops.matmul_int4(1, 4100, 4096, zero_point=zero_point)
    config = next(c for c in dequant_gemv_configs(match_weight_only(op.func), H100) if not c.persistent)
    src, cubin = compile_mod_to_cubin(tvm.IRModule({"main": DequantGemvTemplate().apply_config(op.func, config)}),
                                      SM90A)
    body = src[src.rindex('extern "C" __global__') :]
    barrier = body.index("tvm_builtin_cuda_cta_sync()")
    params = ("S_ptr[", "Z_ptr[") if zero_point else ("S_ptr[",)
    for name in params:
        assert name in body[:barrier] and name not in body[barrier:], name
    assert "(float)((half*)pool_buf_ptr)[" in body[barrier:] and cubin.spill_bytes == 0


def test_4_bit_weights_are_read_past_l1_unless_switched_off(monkeypatch):
    """A decode GEMV streams its weights once: 4-bit ones as ``ld.global.nc.L1::no_allocate``,
    out of the L1 its CTAs share for the activations and scales (8-bit ones ran slower so);
    ``FASTDLIGHT_STREAM_LOADS=0`` restores plain loads."""

    def source(make):
        op = make(1, 4100, 4096)
        config = next(c for c in dequant_gemv_configs(match_weight_only(op.func), H100) if c.kind == "gemv_dequant")
        kernel = DequantGemvTemplate().apply_config(op.func, config)
        src, cubin = compile_mod_to_cubin(tvm.IRModule({"main": kernel}), SM90A)
        assert cubin.spill_bytes == 0, cubin.log
        return src

    hinted = source(ops.matmul_int4)
    assert "ld.global.nc.L1::no_allocate.v4.u32" in hinted and hinted.count("fdl_stream_load16(") >= 2
    assert "no_allocate" not in source(ops.matmul_int8)
    monkeypatch.setattr(stream_load, "STREAM_LOADS", False)
    assert "no_allocate" not in source(ops.matmul_int4)

"""The dequantizing GEMV's other forms (CPU): split-K clusters (``split_k``: CTAs of a cluster
each take a slice of K and add up their partial sums through distributed shared memory) and
activations read from global memory (``vectorize`` X 8, nothing staged). The policy adds them
after the plain configs of the LLaMA decode layers, and every one compiles to a cubin for sm_90a
without spilling, on those shapes and on odd ones."""

import dataclasses

import pytest
import tvm

from fastdlight import ops
from fastdlight.analysis.weight_only import X_GLOBAL_WIDTH, match_weight_only
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import compile_mod_to_cubin
from fastdlight.config import Config
from fastdlight.policies.gemv_dequant import dequant_gemv_configs
from fastdlight.schedules.gemv_dequant import DequantGemvTemplate
from fastdlight.schedules.gemv_dequant_mma import DequantGemvMmaTemplate

H100 = CUDA(tvm.target.Target("nvidia/nvidia-h100"))
SM90A = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def _variants(configs):
    return [c for c in configs if c.split_k > 1 or c.vectorize or c.kind == "gemv_dequant_mma"]


def _compile(op, config):
    template = DequantGemvMmaTemplate() if config.kind == "gemv_dequant_mma" else DequantGemvTemplate()
    kernel = template.apply_config(op.func, config)
    assert kernel is not None, config
    assert [str(p.name) for p in kernel.params] == [str(p.name) for p in op.func.params]
    return compile_mod_to_cubin(tvm.IRModule({"main": kernel}), SM90A)


@pytest.mark.parametrize("n, k", [(11008, 4096), (4096, 11008)])
def test_the_llama_decode_layers_get_the_variants_after_the_plain_configs_where_asked(n, k):
    """The tuner's configs hold no variant (each measured slower than the best plain config);
    asked for, they come after the plain ones."""
    op = ops.matmul_int4(1, n, k)
    assert not _variants(dequant_gemv_configs(match_weight_only(op.func), H100, 8))
    configs = dequant_gemv_configs(match_weight_only(op.func), H100, 8, variants=True)
    plain, variants = configs[:-len(_variants(configs))], _variants(configs)
    assert len(plain) >= 6 and not _variants(plain)  # the plain ones as before, first
    assert any(c.split_k > 1 for c in variants) and any(c.vectorize for c in variants)
    assert any(c.kind == "gemv_dequant_mma" for c in variants)  # the products on tensor cores
    assert all(c.num_threads in (128, 256, 512) and not c.persistent for c in variants)
    assert len(set(configs)) == len(configs)
    for c in variants:
        if c.split_k > 1:  # every slice at least a step of each lane; the CTAs in one wave
            assert k // 32 // c.split_k >= 32
            assert -(-n // c.block[0]) * c.split_k <= H100.sm_count * H100.max_threads_per_sm // c.num_threads


@pytest.mark.parametrize("n, k", [(11008, 4096), (4096, 11008)])
def test_every_variant_compiles_without_spilling(n, k):
    op = ops.matmul_int4(1, n, k)
    variants = _variants(dequant_gemv_configs(match_weight_only(op.func), H100, 8, variants=True))
    assert variants
    for config in variants:
        src, cubin = _compile(op, config)
        assert cubin.spill_bytes == 0, (config, cubin.log)
        assert cubin.registers <= 128, (config, cubin.registers)
        if config.split_k > 1:
            assert "ld.shared::cluster.f32" in src and "%cluster_ctarank" in src and "barrier.cluster" in src
        if config.kind == "gemv_dequant_mma":
            assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src and "__hfma2" not in src
        if config.vectorize:
            assert "fdl_w4_dot32g" in src and "__ldg" in src
            assert (config.split_k > 1) == ("pool_buf_ptr" in src)  # no staging: shared memory only for split-K sums


def _config(rows, per_warp, split=1, x_global=False):
    return Config("gemv_dequant", block=(rows,), thread=(per_warp,), rstep=(256,), reduce_thread=(32,),
                  split_k=split, vectorize={"X": X_GLOBAL_WIDTH} if x_global else {})


@pytest.mark.parametrize("m, n, k, group, zero_point, dtype, bits, config", [
    (1, 4100, 4096, 128, False, "float16", 4, _config(32, 4, 2)),  # N not a multiple of a CTA's rows
    (3, 1000, 11008, 64, True, "float16", 4, _config(16, 2, 3)),  # a slice not whole lane steps, a short last one
    (2, 1000, 2048, 64, True, "bfloat16", 4, _config(8, 1, 2)),
    (2, 1000, 11008, 64, True, "float16", 8, _config(16, 4, 4)),
    (3, 4100, 4096, 32, True, "float16", 4, _config(16, 2, 1, True)),
    (1, 1000, 11008, 128, False, "float16", 4, _config(8, 2, 4, True)),
])  # fmt: skip
def test_odd_shapes_compile(m, n, k, group, zero_point, dtype, bits, config):
    make = ops.matmul_int8 if bits == 8 else ops.matmul_int4
    op = make(m, n, k, group_size=group, dtype=dtype, zero_point=zero_point)
    _, cubin = _compile(op, config)
    assert cubin.spill_bytes == 0, (config, cubin.log)


def test_the_template_refuses_what_it_cannot_build():
    op = ops.matmul_int4(1, 4096, 4096)
    assert DequantGemvTemplate().apply_config(op.func, _config(8, 1, 16)) is None  # over the portable cluster
    assert DequantGemvTemplate().apply_config(op.func, dataclasses.replace(_config(8, 1, 2), persistent=True)) is None
    bf16 = ops.matmul_int4(1, 4096, 4096, dtype="bfloat16")
    assert DequantGemvTemplate().apply_config(bf16.func, _config(8, 1, 1, True)) is None  # X from global: fp16 only
    bf16_configs = dequant_gemv_configs(match_weight_only(bf16.func), H100, variants=True)
    assert not _variants([c for c in bf16_configs if c.vectorize])

"""Hopper wgmma + TMA template on the GPU: every config WgmmaPolicy emits gives correct results
on odd shapes, every layout, fp16 and bf16, batched, with edges in M, N and K (TMA zero-fill and
clipped stores), and on tile counts that are not a multiple of the CTAs (uneven persistent loops,
an odd number of epilogue chunks per tile). Needs an sm_90a GPU (skipped elsewhere)."""

import numpy as np
import pytest
from tvm import te

from fastdlight import ops
from fastdlight.config import Config
from fastdlight.policies.wgmma import WgmmaPolicy
from fastdlight.relax.gated import PAIR_COLUMNS, gated_product
from fastdlight.search.runner import apply_and_build

pytestmark = pytest.mark.gpu

CASES = {
    "fp16_NT_edges": (1000, 520, 264, "float16", "NT", None),
    "fp16_NN_edges": (200, 136, 72, "float16", "NN", None),
    "bf16_TN_edges": (1000, 520, 264, "bfloat16", "TN", None),
    "bf16_TT_edges": (200, 136, 72, "bfloat16", "TT", None),
    "fp16_NN_batched_odd_chunks": (512, 512, 128, "float16", "NN", 64),
    "bf16_NT_batched_edges": (264, 200, 128, "bfloat16", "NT", 2),
    # many tiles per CTA: ping-pong warpgroups many stage-ring phases apart
    "fp16_NN_many_tiles": (2048, 2048, 512, "float16", "NN", None),
}


@pytest.fixture(scope="module")
def arch(hopper_arch):
    return hopper_arch


@pytest.mark.parametrize("name", list(CASES))
def test_every_wgmma_config_is_correct(name, arch):
    m, n, k, dtype, layout, batch = CASES[name]
    op = ops.matmul(m, n, k, dtype, dtype, layout, batch, acc_dtype="float32")
    # every tile the policy considers, not only those it emits: for small shapes the estimate
    # cuts ping-pong and three-warpgroup tiles, which must still be correct where they are timed
    policy = WgmmaPolicy(op.func, arch)
    configs = [policy.config(t) for t in policy.tiles()]
    results, best = apply_and_build(op.func, configs, arch, check="all", budget_ms=5, ref=op.reference,
                                    progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)
    assert best.config.kind == "matmul_wgmma"
    assert {c.block[0] == c.warp[0] for c in configs} == {True, False}
    assert any(c.block[0] == 3 * c.warp[0] for c in configs)  # three consumer warpgroups


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_clusters_sharing_odd_chunks_of_b_are_correct(dtype, arch):
    """MN-major B in a 2-CTA cluster whose tile has an odd number of 64-column chunks (192,
    64): each CTA loads half of every chunk along K and multicasts it; edges in M, N and K."""
    op = ops.matmul(1000, 1000, 264, dtype, dtype, "NN", None, acc_dtype="float32")
    tiles = [(192, 192, 64, 4), (128, 192, 64, 4), (64, 64, 64, 8)]  # (bm, bn, wm, stages)
    configs = [Config("matmul_wgmma", block=(bm, bn), warp=(wm, bn), rstep=(64,), pipeline_stages=stages,
                      use_async_copy=True, rasterization=8, cluster=2) for bm, bn, wm, stages in tiles]
    results, _best = apply_and_build(op.func, configs, arch, check="all", budget_ms=5, ref=op.reference,
                                     progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad and len(results) == 3, "\n".join(bad)


@pytest.mark.parametrize("layout,dtype,shape", [
    ("NN", "float16", (1000, 1000, 264, None)),  # K-major A: each CTA one box of half the rows
    ("TN", "bfloat16", (1000, 1000, 264, None)),  # M-major A: 64-column chunks, or K halves of 3
    ("NT", "float16", (264, 520, 128, 3)),  # batched, an odd number of N tiles: the last pair's second clipped
])  # fmt: skip
def test_clusters_along_n_sharing_a_are_correct(layout, dtype, shape, arch):
    """2-CTA clusters along N: horizontally adjacent tiles, each CTA loading half of the A tile
    they share and multicasting it; cooperative, ping-pong and three-warpgroup tiles, with edges."""
    m, n, k, batch = shape
    op = ops.matmul(m, n, k, dtype, dtype, layout, batch, acc_dtype="float32")
    tiles = [(256, 128, 128, 4), (192, 128, 64, 4), (128, 64, 64, 6), (128, 128, 128, 6)]  # (bm, bn, wm, stages)
    configs = [Config("matmul_wgmma", block=(bm, bn), warp=(wm, bn), rstep=(64,), pipeline_stages=stages,
                      use_async_copy=True, rasterization=8, cluster=2, cluster_axis="n")
               for bm, bn, wm, stages in tiles]
    results, _best = apply_and_build(op.func, configs, arch, check="all", budget_ms=5, ref=op.reference,
                                     progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad and len(results) == len(tiles), "\n".join(bad)


@pytest.mark.parametrize("n,dtype,out,batch", [
    (1001, "float16", "float16", None), (1003, "bfloat16", "bfloat16", None),
    (1001, "float16", "float32", None), (999, "float16", "float16", 3),
])  # fmt: skip
def test_outputs_whose_rows_tma_cannot_address_are_correct(n, dtype, out, batch, arch):
    """N not a multiple of 8 (of 4 for fp32): the threads store each staged chunk themselves;
    every config the policy emits (clusters included) agrees with numpy, edges in M and N."""
    op = ops.matmul(1000 if batch is None else 264, n, 264, dtype, out, "NT", batch, acc_dtype="float32")
    configs = WgmmaPolicy(op.func, arch).emit_config(20)
    results, _best = apply_and_build(op.func, configs, arch, check="all", budget_ms=5, ref=op.reference,
                                     progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad and len(results) == len(configs), "\n".join(bad)


@pytest.mark.parametrize("build,m,n,k,dtype", [
    (ops.matmul_gated, 1000, 520, 264, "float16"), (ops.matmul_gated, 300, 1040, 200, "bfloat16"),
    (ops.matmul_residual, 1000, 520, 264, "float16"),  # fp32 reads and output: 8-byte pairs
])  # fmt: skip
def test_epilogues_with_prefetched_reads_are_correct(build, m, n, k, dtype, arch):
    """The bias and the gate (or residual) tensor are read in pairs before the main loop (in
    full, or a ring of chunks on the widest tiles), zeros past the edges: every config agrees
    with numpy."""
    op = build(m, n, k, dtype)
    configs = WgmmaPolicy(op.func, arch).emit_config(20)
    results, _best = apply_and_build(op.func, configs, arch, check="all", budget_ms=5, ref=op.reference,
                                     progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)
    assert {c.block[1] for c in configs} & {192, 256}  # ring prefetch is among them


@pytest.mark.parametrize("args", [
    (2, 14, 14, 64, 128, 3, 1, 1, "float16"),  # 14 = 8 + 6: patches past the image's edge
    (2, 30, 30, 64, 64, 3, 2, 1, "bfloat16"),  # stride 2: TMA element strides, padding at the top/left
    (3, 28, 28, 128, 64, 1, 2, 0, "float16"),  # 1x1 downsample
    (3, 7, 7, 128, 192, 3, 1, 1, "float16"),  # a patch larger than the image
])  # fmt: skip
def test_every_wgmma_conv_config_is_correct(args, arch):
    """NHWC convolutions as implicit GEMMs whose A tiles are TMA boxes of the input (the zero
    padding is TMA's out-of-bounds fill): every config agrees with numpy."""
    op = ops.conv2d_nhwc_ohwi(*args)
    configs = WgmmaPolicy(op.func, arch).emit_config(20)
    results, _best = apply_and_build(op.func, configs, arch, check="all", budget_ms=5, ref=op.reference,
                                     progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)


def test_gate_and_up_paired_in_one_gemm_are_correct(arch):
    """LLaMA's gate and up projections as one GEMM over interleaved weights
    (``fastdlight.relax.gated``), the epilogue pairing each gate chunk with its up chunk: every
    config (clusters included) agrees with numpy, with edges in M and K."""
    m, n, k = 1000, 5 * PAIR_COLUMNS, 264
    x, w = te.placeholder((m, k), "float16", name="x"), te.placeholder((2 * n, k), "float16", name="w")
    func = te.create_prim_func([x, w, gated_product(x, w, "float32", "float16", "float16")])

    def reference(xs, ws):
        acc = (xs.astype(np.float32) @ ws.astype(np.float32).T).reshape(m, n // PAIR_COLUMNS, 2, PAIR_COLUMNS)
        gate, up = acc[:, :, 0].reshape(m, n).astype(np.float16), acc[:, :, 1].reshape(m, n).astype(np.float16)
        gate = gate.astype(np.float64)  # the kernel's SiLU and product are fp16 arithmetic: within its tolerance
        return gate / (1 + np.exp(-gate)) * up.astype(np.float64)

    configs = WgmmaPolicy(func, arch).emit_config(20)
    assert {c.cluster for c in configs} == {1, 2}
    results, _best = apply_and_build(func, configs, arch, check="all", budget_ms=5, ref=reference, progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("m, n, k", [(1000, 520, 272), (256, 384, 1024)])
def test_every_fp8_wgmma_config_is_correct(dtype, m, n, k, arch):
    """8-bit inputs (k32 wgmma, 128-element K steps), both operands K-major, fp16 results."""
    op = ops.matmul(m, n, k, dtype, "float16", "NT", acc_dtype="float32")
    configs = WgmmaPolicy(op.func, arch).emit_config(20)
    assert configs
    results, best = apply_and_build(op.func, configs, arch, check="all", budget_ms=5, ref=op.reference,
                                    progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("scales", ["tensor", "row"])
def test_scaled_fp8_is_correct(scales, arch):
    op = ops.matmul_scaled(1000, 520, 272, "float8_e4m3fn", "bfloat16", scales)
    configs = WgmmaPolicy(op.func, arch).emit_config(6)
    results, best = apply_and_build(op.func, configs, arch, check="all", budget_ms=5, ref=op.reference,
                                    progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)

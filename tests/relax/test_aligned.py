"""Matmuls with K not a multiple of 8 (fp16/bf16 rows TMA cannot address) padded along K
(``fastdlight.relax.aligned``): the same values, one pad per activation, the weights padded as
constants, and the wgmma template takes the result."""

import ml_dtypes  # noqa: F401 - numpy's "bfloat16"
import numpy as np
import pytest
import tvm
from tvm import relax

import fastdlight
from fastdlight.analysis.wgmma_match import match_wgmma
from fastdlight.arch import CUDA
from fastdlight.relax import prepare
from fastdlight.relax.aligned import aligned_extent, tma_aligned_matmuls
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.relax.rewrites import static_shape
from test_pipeline import run_on_cpu

H100 = CUDA("nvidia/nvidia-h100")


def two_projections(m=100, n=72, k=1001, dtype="float16", weights_bound=True):
    """``silu(x @ W1^T + b) * (x @ W2^T)``: two matmuls reading one ``x``, weights ``[N, K]``
    bound as constants (or parameters)."""
    rng = np.random.default_rng(0)
    w1, w2 = ((rng.standard_normal((n, k)) * 0.1).astype(dtype) for _ in range(2))
    bias = rng.standard_normal(n).astype(dtype)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), dtype))
    params = [x] if weights_bound else [x] + [relax.Var(f"w{i}", relax.TensorType((n, k), dtype)) for i in (1, 2)]
    first, second = (relax.const(w1), relax.const(w2)) if weights_bound else params[1:]
    with bb.function("main", params):
        with bb.dataflow():
            y1 = bb.emit(relax.op.add(relax.op.matmul(x, relax.op.permute_dims(first)), relax.const(bias)))
            y2 = bb.emit(relax.op.matmul(x, relax.op.permute_dims(second)))
            out = bb.emit_output(relax.op.multiply(relax.op.nn.silu(y1), y2))
        bb.emit_func_output(out)
    return bb.get(), (w1, w2, bias)


def test_aligned_extent_is_the_next_whole_16_bytes():
    assert [aligned_extent(k, "float16") for k in (1, 8, 1000, 1001, 1007)] == [8, 8, 1000, 1008, 1008]


@pytest.mark.parametrize("weights_bound", [True, False])
def test_k_is_padded_once_per_operand_and_the_values_are_the_same(weights_bound):
    mod, weights = two_projections(weights_bound=weights_bound)
    padded = tma_aligned_matmuls(H100.target)(mod)
    text = padded["main"].script()
    assert text.count("R.nn.pad(x,") == 1  # x's pad shared by both matmuls
    assert text.count("R.nn.pad(") == (1 if weights_bound else 3)  # bound weights: padded constants
    matmuls = []
    relax.analysis.post_order_visit(padded["main"], lambda e: matmuls.append(e) if isinstance(e, relax.Call)
                                    and getattr(e.op, "name", "") == "relax.matmul" else None)
    assert len(matmuls) == 2 and all(static_shape(a)[-1] == 1008 and static_shape(b)[-2] == 1008
                                     for a, b in (mm.args for mm in matmuls))
    x = np.random.default_rng(1).standard_normal((100, 1001)).astype("float16")
    args = [x] if weights_bound else [x, *weights[:2]]
    # the zeros are added after the row's last product: the sums are the same, bit for bit
    np.testing.assert_array_equal(run_on_cpu(padded, args), run_on_cpu(mod, args))


@pytest.mark.parametrize("k", [1000, 1001])
def test_a_bound_weight_with_n_not_a_multiple_of_8_is_read_as_n_by_k(k):
    """N = 1001: the weight ``[K, N]`` (as FoldConstant leaves ``permute_dims`` of a bound
    ``[N, K]``) is stored ``[N, K]`` and read by ``matmul_nt``; the values are the same, and the
    prepared function is the wgmma template's, its output rows stored by the threads."""
    mod, _weights = two_projections(n=1001, k=k)
    rewritten = tma_aligned_matmuls(H100.target)(mod)
    text = rewritten["main"].script()
    assert "R.matmul" not in text and text.count("matmul_nt") >= 2
    assert text.count("R.nn.pad(") == (k % 8 != 0)  # x padded only where K needs it
    x = np.random.default_rng(1).standard_normal((100, k)).astype("float16")
    np.testing.assert_allclose(run_on_cpu(rewritten, [x]).astype("float32"), run_on_cpu(mod, [x]).astype("float32"),
                               rtol=2**-8, atol=2**-8)
    matmuls = [f for name, f in prim_funcs(prepare(H100.target)(mod)).items() if "matmul" in name]
    found = [match_wgmma(f)[0] for f in matmuls]
    assert len(found) == 2 and all(m is not None and m.b_k_major and not m.tma_store for m in found)


def test_gate_and_up_of_a_padded_activation_still_become_one_gemm():
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((256, 1001), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            proj = [bb.emit(relax.op.astype(relax.op.matmul(x, relax.op.permute_dims(relax.const(
                rng.standard_normal((512, 1001)).astype("float16"))), out_dtype="float32"), "float16")) for _ in range(2)]
            out = bb.emit_output(relax.op.multiply(relax.op.nn.silu(proj[0]), proj[1]))
        bb.emit_func_output(out)
    funcs = prim_funcs(prepare(H100.target)(bb.get()))
    assert sorted(funcs) == ["gated_silu", "pad"] and match_wgmma(funcs["gated_silu"])[0] is not None


def test_the_pad_fuses_into_the_op_that_makes_the_activation():
    """An activation computed in the model (elementwise, or a LayerNorm) is written padded by
    the kernel that computes it: no copy of its own."""
    rng = np.random.default_rng(0)
    weight = lambda: relax.op.permute_dims(relax.const(rng.standard_normal((512, 1001)).astype("float16")))  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((256, 1001), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.gelu(relax.op.multiply(x, relax.const(np.float16(2.0)))))
            n = bb.emit(relax.op.nn.layer_norm(x, relax.const(np.ones(1001, "float16")),
                                               relax.const(np.zeros(1001, "float16")), axes=[-1]))
            out = bb.emit_output(relax.op.add(relax.op.matmul(h, weight()), relax.op.matmul(n, weight())))
        bb.emit_func_output(out)
    names = sorted(prim_funcs(prepare(H100.target)(bb.get())))
    assert "pad" not in names and sum(name.endswith("_pad") for name in names) == 2, names


def test_left_alone_where_it_does_not_apply():
    # aligned; no wgmma dtype; fewer rows than a wgmma tile (the GEMV path's, at any alignment)
    for mod in (two_projections(k=1000)[0], two_projections(dtype="float32")[0], two_projections(m=16)[0]):
        assert "R.nn.pad" not in tma_aligned_matmuls(H100.target)(mod)["main"].script()
    sm89 = CUDA("nvidia/geforce-rtx-4090")  # no TMA template: mma.sync loads rows at any alignment
    assert "R.nn.pad" not in tma_aligned_matmuls(sm89.target)(two_projections()[0])["main"].script()


def test_the_prepared_matmuls_are_taken_by_the_wgmma_template():
    funcs = prim_funcs(prepare(H100.target)(two_projections()[0]))
    matmuls = {name: f for name, f in funcs.items() if "matmul" in name}
    assert len(matmuls) == 2 and any("pad" in name for name in funcs)
    assert all(match_wgmma(f)[0] is not None for f in matmuls.values())
    # unpadded, the same functions have no wgmma path
    unpadded = relax.transform.FuseTIR()(relax.transform.FuseOps()(relax.transform.LegalizeOps()(two_projections()[0])))
    reasons = [match_wgmma(f)[1] for name, f in prim_funcs(unpadded).items() if "matmul" in name]
    assert reasons and all("16" in r for r in reasons)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,n,k", [("float16", 1536, 1001), ("bfloat16", 1536, 1001), ("float16", 1531, 1024)])
def test_a_model_with_k_or_n_not_a_multiple_of_8_runs_on_wgmma_kernels_and_computes_the_same(dtype, n, k):
    dev = tvm.cuda(0)
    arch = CUDA.from_device(dev)
    if not arch.has_wgmma:
        pytest.skip(f"{arch.arch}: no wgmma")

    m = 2048
    mod, (w1, w2, bias) = two_projections(m, n, k, dtype)
    tuning = fastdlight.ApplyFastTuning(topk=8, target=arch)
    tuned = tuning(prepare(arch.target)(mod))
    kinds = {e.function: e.config.kind for e in tuning.report if e.config is not None and "matmul" in e.function}
    assert len(kinds) == 2 and set(kinds.values()) == {"matmul_wgmma"}, kinds
    vm = relax.VirtualMachine(fastdlight.build(tuned, arch.target), dev)
    x = (np.random.default_rng(1).standard_normal((m, k)) * 0.5).astype(dtype)
    out = vm["main"](tvm.runtime.tensor(x, dev)).numpy().astype(np.float64)
    x64, w1, w2, bias = (a.astype(np.float64) for a in (x, w1, w2, bias))
    y1 = x64 @ w1.T + bias
    ref = y1 / (1 + np.exp(-y1)) * (x64 @ w2.T)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-2

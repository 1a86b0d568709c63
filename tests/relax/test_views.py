"""Views folded into the matmuls that read them (``fastdlight.relax.views``): attention's head
split and merge as torch.export writes them (two sequences of two heads: the batch of the
attention matmuls is ``b * heads``, read back as ``b // heads`` and ``b % heads``) lose their
copy kernels where the target has wgmma, the matmuls read the QKV output in place through TMA
boxes, the values stay the same, and the kernels compile."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import fastdlight.relax.views as views
from fastdlight.analysis.wgmma_match import match_wgmma
from fastdlight.arch import CUDA, auto_arch
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.policies.select import candidate_sets
from fastdlight.policies.wgmma import WgmmaPolicy
from fastdlight.relax import prepare
from fastdlight.relax.views import fold_view, view_of
from fastdlight.schedules import apply_config
from fastdlight.search.runner import apply_and_build
from test_pipeline import run_on_cpu

H100 = CUDA("nvidia/nvidia-h100")
A100 = CUDA("nvidia/nvidia-a100")
B, S, H, D = 2, 256, 2, 64


@I.ir_module
class Attention:
    @R.function
    def main(x: R.Tensor((2, 256, 128), "float16"), wqkv: R.Tensor((384, 128), "float16"),
             wo: R.Tensor((128, 128), "float16")):
        with R.dataflow():
            qkv = R.matmul(R.reshape(x, [512, 128]), R.permute_dims(wqkv, [1, 0]), out_dtype="float32")
            qkv = R.reshape(R.astype(qkv, "float16"), [2, 256, 3, 2, 64])
            heads = R.permute_dims(qkv, [2, 0, 3, 1, 4])
            q = R.reshape(R.squeeze(R.strided_slice(heads, [0], [0], [1]), [0]), [4, 256, 64])
            k = R.reshape(R.squeeze(R.strided_slice(heads, [0], [1], [2]), [0]), [4, 256, 64])
            v = R.reshape(R.squeeze(R.strided_slice(heads, [0], [2], [3]), [0]), [4, 256, 64])
            s = R.astype(R.matmul(q, R.permute_dims(k, [0, 2, 1]), out_dtype="float32"), "float16")
            p = R.nn.softmax(R.multiply(s, R.const(0.125, "float16")), axis=-1)
            o = R.astype(R.matmul(p, v, out_dtype="float32"), "float16")
            o = R.reshape(R.permute_dims(R.reshape(o, [2, 2, 256, 64]), [0, 2, 1, 3]), [512, 128])
            y = R.astype(R.matmul(o, R.permute_dims(wo, [1, 0]), out_dtype="float32"), "float16")
            R.output(y)
        return y


def called_funcs(mod):
    """The PrimFuncs ``main`` calls, by name."""
    names = set()
    relax.analysis.post_order_visit(mod["main"], lambda e: names.add(e.args[0].name_hint) if isinstance(
        e, relax.Call) and e.op.same_as(tvm.ir.Op.get("relax.call_tir")) else None)
    return {n: mod[n] for n in names}


def inputs():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(s) * scale).astype("float16")
            for s, scale in (((B, S, H * D), 1.0), ((3 * H * D, H * D), 0.1), ((H * D, H * D), 0.1))]


@pytest.fixture(scope="module")
def prepared():
    # the unfused form (fused attention left out): the matmuls of attention as head dims no
    # fused template takes get them, with and without wgmma's views
    return (prepare(H100.target, fuse_attention=False)(Attention),
            prepare(A100.target, fuse_attention=False)(Attention))


def test_the_head_split_and_merge_copies_are_gone_and_the_matmuls_read_in_place(prepared):
    folded, plain = prepared
    copies = [n for n, f in called_funcs(plain).items() if view_of(f) is not None and "transpose" in n]
    # without wgmma: the permuted QKV, Q, K^T, V, the merge and the weights' transposes are copies
    assert len(copies) >= 5
    funcs = called_funcs(folded)
    assert not [n for n, f in funcs.items() if view_of(f) is not None and not view_of(f).in_order]
    # x's reshape; the QKV projection, scores, softmax, P @ V, the output projection
    assert len(funcs) == 6 and sum(f.in_order for f in map(view_of, funcs.values()) if f is not None) == 1
    matmuls = {n: match_wgmma(f)[0] for n, f in funcs.items() if "matmul" in n}
    assert len(matmuls) == 4 and all(m is not None for m in matmuls.values())
    views = {n: m for n, m in matmuls.items() if m.a_view is not None}
    assert len(views) == 3  # scores, P @ V and the output projection
    # the QKV projection reads the (unbound) weight as it is given, K-major; x through its
    # reshape, which stays (a free view at run time)
    qkv = next(m for m in matmuls.values() if m.n == 3 * H * D)
    assert qkv.a_view is None and qkv.b_k_major
    # the scores read Q and K as boxes of QKV ([512, 384] to TMA: innermost first), the batch b
    # of b * heads at column (b % 2) * 64 + 128 * (0 | 1) and row (b // 2) * 256
    scores = next(m for m in views.values() if m.n == S and m.k == D)
    assert scores.a_view.dims == scores.b_view.dims == (3 * H * D, B * S)
    assert scores.a_k_major and scores.b_k_major and scores.a_view.row_block == 256
    pv = next(m for m in views.values() if m.n == D)
    assert not pv.b_k_major  # V: its 64 columns of a head, K (tokens) down the rows
    # the output projection reads the heads' outputs [b * heads, S, D] as its [tokens, heads * D]:
    # rows (i // 256, i % 256), K (k // 64, k % 64); each 64-wide K step is within one head
    oproj = next(m for m in views.values() if m.m == B * S and m.n == H * D)
    assert oproj.a_view.dims == (D, S, B * H) and oproj.a_k_major


def test_the_folded_matmuls_get_wgmma_candidates_first(prepared):
    """The tuner's candidates: the other templates' matmul match refuses views, the wgmma tiles
    still come first (tagged wgmma-only)."""
    folded, _plain = prepared
    viewed = [(n, f) for n, f in called_funcs(folded).items() if "matmul" in n and match_wgmma(f)[0].a_view is not None]
    assert len(viewed) == 3
    for name, func in viewed:
        if "matmul" in name:
            first = next(candidate_sets(func, H100, 20))
            assert first.policy == "TensorCorePolicy" and {c.kind for c in first.configs} == {"matmul_wgmma"}, name


def test_the_folded_model_computes_the_same(prepared):
    folded, plain = prepared
    args = inputs()
    np.testing.assert_allclose(run_on_cpu(folded, args).astype("float32"), run_on_cpu(plain, args).astype("float32"),
                               rtol=0, atol=0)


def test_the_folded_kernels_compile_without_spills(prepared):
    folded, _plain = prepared
    funcs = [f for n, f in called_funcs(folded).items() if "matmul" in n and match_wgmma(f)[0].a_view is not None]
    for func in funcs:
        config = WgmmaPolicy(func, H100).emit_config(1)[0]
        with H100.target:
            kernel = apply_config(func, config)
        src = cuda_source(build(tvm.IRModule({"main": kernel}), H100.target))
        cubin = compile_cubin(src, H100.target)
        assert "cp.async.bulk.tensor" in src and cubin.spill_bytes == 0


@T.prim_func(s_tir=True)
def strided(a: T.Buffer((64, 256), "float16"), b: T.Buffer((128, 128), "float16"),
            c: T.Buffer((64, 128), "float32")):
    for i, j, k in T.grid(64, 128, 128):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                c[vi, vj] = T.float32(0)
            c[vi, vj] = c[vi, vj] + T.Cast("float32", a[vi, vk * 2]) * T.Cast("float32", b[vj, vk])


def test_operands_that_are_no_tma_boxes_are_refused_with_a_reason():
    match, reason = match_wgmma(strided)
    assert match is None and "K does not run along one axis" in reason


def test_a_view_is_an_element_move_and_folding_it_rewrites_the_loads():
    @T.prim_func(s_tir=True)
    def transpose(a: T.Buffer((4, 8), "float16"), b: T.Buffer((8, 4), "float16")):
        for i, j in T.grid(8, 4):
            with T.sblock("t"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vj, vi]

    @T.prim_func(s_tir=True)
    def double(t: T.Buffer((8, 4), "float16"), b: T.Buffer((8, 4), "float16")):
        for i, j in T.grid(8, 4):
            with T.sblock("t"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = t[vi, vj] * T.float16(2)

    view = view_of(transpose)
    assert view is not None and view_of(double) is None
    folded = fold_view(double, 0, view)  # ``double`` reading the transpose's input instead
    assert [int(x) for x in folded.params[0].shape] == [4, 8]
    a = np.arange(32, dtype="float16").reshape(4, 8)
    out = tvm.runtime.tensor(np.zeros((8, 4), "float16"))
    tvm.compile(tvm.IRModule({"main": folded}), target="llvm")["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), 2 * a.T)


@pytest.mark.gpu
def test_every_config_of_the_folded_matmuls_is_correct_on_the_gpu(prepared):
    """Each matmul reading Q, K, V or the heads' outputs in place, every config the policy
    emits (clusters included), against the function itself widened to float64."""
    arch = auto_arch()
    if not arch.has_wgmma:
        pytest.skip(f"{arch.arch}: no wgmma")
    folded, _plain = prepared
    for name, func in called_funcs(folded).items():
        if "matmul" not in name:
            continue
        configs = WgmmaPolicy(func, arch).emit_config(20)
        results, _best = apply_and_build(func, configs, arch, check="all", budget_ms=5, progress=False)
        bad = [f"{name} {r.config}: {r.error or r.check_message}" for r in results if not r.verified]
        assert not bad, "\n".join(bad)


def test_a_failing_fold_leaves_the_copies_with_a_warning(monkeypatch):
    def broken(*_args):
        raise RuntimeError("analysis failed")

    monkeypatch.setattr(views, "_plan", broken)
    with pytest.warns(UserWarning, match="views left as copy kernels"):
        mod = prepare(H100.target)(Attention)
    assert any("strided_slice" in n for n in called_funcs(mod))

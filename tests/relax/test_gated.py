"""Gate and up projections as one GEMM over interleaved weights (``fastdlight.relax.gated``):
the same values, only the wgmma template takes the result, and its kernel compiles."""

import ml_dtypes  # noqa: F401 - numpy's "bfloat16"
import numpy as np
import pytest
import tvm
from tvm import relax, te
from tvm.script import ir as I
from tvm.script import relax as R

from fastdlight.analysis.matmul_match import match_matmul
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.policies.select import candidate_sets
from fastdlight.relax import prepare
from fastdlight.relax.gated import PAIR_COLUMNS, gated_product, gated_projections, interleave
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.schedules import apply_config
from fastdlight.search.candidates import stock_configs
from test_pipeline import run_on_cpu

H100 = CUDA("nvidia/nvidia-h100")


def gated_mlp(silu_op: bool = False, n: int = 512, same_x: bool = True, dtype: str = "float16", rows: int = 128):
    """``silu(x @ Wg^T) * (x @ Wu^T)`` as torch.export and ToMixedPrecision leave it (fp32
    products cast to fp16; SiLU as ``t * sigmoid(t)`` or ``nn.silu``), the weights bound."""

    silu = "R.nn.silu(g)" if silu_op else "R.multiply(g, R.sigmoid(g))"
    source = f"""
@I.ir_module
class Mlp:
    @R.function
    def main(x: R.Tensor(({rows}, 256), "{dtype}"), x2: R.Tensor(({rows}, 256), "{dtype}"),
             wg: R.Tensor(({n}, 256), "{dtype}"), wu: R.Tensor(({n}, 256), "{dtype}")):
        with R.dataflow():
            g = R.astype(R.matmul(x, R.permute_dims(wg, [1, 0]), out_dtype="float32"), "{dtype}")
            s = {silu}
            u = R.astype(R.matmul({"x" if same_x else "x2"}, R.permute_dims(wu, [1, 0]), out_dtype="float32"), "{dtype}")
            y = R.multiply(s, u)
            R.output(y)
        return y
"""
    mod = tvm.script.from_source(source, extra_vars={"I": I, "R": R})
    rng = np.random.default_rng(0)
    weights = {name: tvm.runtime.tensor((rng.standard_normal((n, 256)) * 0.1).astype(dtype)) for name in ("wg", "wu")}
    return relax.transform.BindParams("main", weights)(mod)


def test_interleave_alternates_blocks_of_gate_and_up_rows():
    gate, up = np.arange(256).reshape(128, 2), -np.arange(256).reshape(128, 2)
    w = interleave(gate, up)
    assert w.shape == (256, 2)
    np.testing.assert_array_equal(w[:64], gate[:64])
    np.testing.assert_array_equal(w[64:128], up[:64])
    np.testing.assert_array_equal(w[128:192], gate[64:])


@pytest.mark.parametrize("silu_op,dtype", [(False, "float16"), (True, "float16"), (False, "bfloat16")])
def test_gate_and_up_become_one_gemm_with_the_same_values(silu_op, dtype):
    mod = gated_mlp(silu_op, dtype=dtype)
    rewritten = gated_projections()(mod)
    ops = str(rewritten["main"])
    assert ops.count("R.call_tir") == 1 and "R.matmul" not in ops
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((128, 256)).astype("float32").astype(dtype) for _ in range(2)]
    got, want = run_on_cpu(rewritten, args), run_on_cpu(mod, args)
    if dtype == "float16":
        np.testing.assert_array_equal(got, want)
    else:  # LLVM rounds bf16 intermediates only where they are stored: a few ulps (2^-8) apart
        np.testing.assert_allclose(got.astype("float32"), want.astype("float32"), rtol=2**-5, atol=0)


def test_bf16_weights_are_interleaved_too_and_compile_on_wgmma():
    rewritten = gated_projections()(gated_mlp(dtype="bfloat16"))
    assert str(rewritten["main"]).count("R.call_tir") == 1 and "R.matmul" not in str(rewritten["main"])
    (_name, func), = prim_funcs(prepare(H100.target)(gated_mlp(dtype="bfloat16"))).items()
    config = next(c for s in candidate_sets(func, H100, 8) for c in s.configs if c.kind == "matmul_wgmma")
    with H100.target:
        kernel = apply_config(func, config)
    src = cuda_source(build(tvm.IRModule({"main": kernel}), H100.target))
    assert "wgmma.mma_async" in src and ".bf16.bf16" in src and compile_cubin(src, H100.target).spill_bytes == 0


def test_left_alone_where_it_does_not_apply():
    # two inputs; N not a multiple of G; decode rows (two GEMVs)
    for mod in (gated_mlp(same_x=False), gated_mlp(n=96), gated_mlp(rows=16)):
        assert "R.call_tir" not in str(gated_projections()(mod)["main"])
    sm89 = CUDA("nvidia/geforce-rtx-4090")  # no wgmma: no template would take the pairs
    assert "R.call_tir" not in str(gated_projections(sm89.target)(gated_mlp())["main"])


def test_only_the_wgmma_template_takes_the_pairs_and_its_kernel_compiles():
    (name, func), = prim_funcs(prepare(H100.target)(gated_mlp())).items()
    assert "gated" in name
    match, _ = match_matmul(func)
    assert match.pair_columns == PAIR_COLUMNS and match.n == 1024
    configs = [c for s in candidate_sets(func, H100, 8, stock_configs(func, H100)) for c in s.configs]
    own = [c for c in configs if not c.is_stock]
    assert own and all(c.kind == "matmul_wgmma" and c.block[1] % (2 * PAIR_COLUMNS) == 0 for c in own)
    with H100.target:
        kernel = apply_config(func, own[0])
    src = cuda_source(build(tvm.IRModule({"main": kernel}), H100.target))
    assert "wgmma.mma_async" in src and "hexp" in src  # the SiLU in the epilogue
    assert compile_cubin(src, H100.target).spill_bytes == 0


def test_at_one_row_the_pair_s_gemm_is_a_gemv_and_its_epilogue_a_kernel_of_its_own():
    """A decode specialization of the pair (rows symbolic in a served model: the pair is formed,
    then tuned at one row): the GEMV template takes it, the product going to global memory and
    the gated epilogue, which reads two of its columns per output, running after it."""
    x = te.placeholder((1, 512), "float16", name="x")
    w = te.placeholder((2 * 1024, 512), "float16", name="w")
    func = te.create_prim_func([x, w, gated_product(x, w, "float32", "float16", "float16")])
    gemv = [c for s in candidate_sets(func, H100, 4) for c in s.configs if c.kind == "gemv"]
    assert gemv
    with H100.target:
        sch = apply_config(func, gemv[0], allow_fallback=False)
    src = cuda_source(build(tvm.IRModule({"main": sch.mod["main"]}), H100.target))
    assert src.count("extern \"C\" __global__") == 4  # two kernels, each declared and defined
    assert compile_cubin(src, H100.target).spill_bytes == 0

"""PrimFunc analysis: op families, axes, buffers, footprints, and clear errors."""

import pytest
import tvm_ffi
from tvm import te, tirx
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.analysis.func_info import FuncInfo, analyze
from fastdlight.arch import CUDA
from fastdlight.policies import DefaultPolicy

FAMILY_CASES = {
    "add": (ops.elementwise((64, 128), "float16", "add"), "elementwise"),
    "copy": (ops.elementwise((1000, 3), "float32", "copy"), "elementwise"),
    "bias_relu": (ops.elementwise((32, 64, 128), "float16", "bias_relu"), "elementwise"),
    "sum_inner": (ops.reduce((64, 256), "float16", "sum", -1), "reduction"),
    "max_inner": (ops.reduce((64, 256), "float32", "max", -1), "reduction"),
    "sum_outer": (ops.reduce((256, 64), "float16", "sum", 0), "reduction"),
    "max_outer": (ops.reduce((256, 64), "bfloat16", "max", 0), "reduction"),
    "softmax": (ops.softmax(64, 256), "general_reduction"),
    "gemv_1": (ops.gemv(1024, 512, m=1), "gemv"),
    "gemv_8": (ops.gemv(1024, 512, m=8), "gemv"),
    "matmul_nn": (ops.matmul(64, 96, 32, "float32", layout="NN"), "matmul"),
    "matmul_nt_batch": (ops.matmul(64, 96, 32, "float16", layout="NT", batch=3), "matmul"),
    "matmul_tn_batch": (ops.matmul(64, 96, 32, "float16", layout="TN", batch=2), "matmul"),
    "conv2d": (ops.conv2d_nhwc(2, 14, 14, 16, 32, stride=2, pad=1), "matmul"),
}


@pytest.mark.parametrize("name", sorted(FAMILY_CASES))
def test_op_family(name):
    op, kind = FAMILY_CASES[name]
    info = analyze(op.func)
    assert isinstance(info, FuncInfo)
    assert info.kind == kind
    # the output is the function's last parameter, every other parameter an input
    assert [t.name for t in info.outputs] == [str(op.func.params[-1].name)]
    assert [t.name for t in info.inputs] == [str(p.name) for p in op.func.params[:-1]]


def test_axes_and_buffers_of_matmul():
    info = analyze(ops.matmul(64, 96, 32, "float16", layout="TN", batch=3).func)
    assert info.output_block == "C" and info.iter_kinds == "SSSR"
    assert [a.extent for a in info.spatial_axes] == [3, 64, 96]
    assert [a.extent for a in info.reduce_axes] == [32]
    assert {t.name: (t.shape, t.dtype) for t in info.inputs} == {
        "A": ((3, 32, 64), "float16"),
        "B": ((3, 32, 96), "float16"),
    }
    assert info.outputs[0].shape == (3, 64, 96)


def test_unit_axes_are_normalized_away():
    info = analyze(ops.gemv(1024, 512, m=1).func)  # Y[0, n]: the m axis is dropped
    assert [a.extent for a in info.spatial_axes] == [1024]
    assert info.gemv_weight == "W"
    assert [a.extent for a in analyze(ops.gemv(1024, 512, m=8).func).spatial_axes] == [8, 1024]


def test_gemv_needs_k_contiguous_weight_and_few_rows():
    # M = 8 but B is stored K x N (not contiguous along k): a matmul, not a GEMV
    assert analyze(ops.matmul(8, 1024, 512, "float16", layout="NN").func).kind == "matmul"
    # the same shape with B stored N x K is exactly Y = X W^T
    assert analyze(ops.matmul(8, 1024, 512, "float16", layout="NT").func).kind == "gemv"
    assert analyze(ops.matmul(32, 1024, 512, "float16", layout="NT").func).kind == "matmul"


def test_general_reduction_uses_last_reduction_block():
    info = analyze(ops.softmax(64, 256).func)
    assert info.reduction_blocks == ("row_max", "row_sum")
    assert info.output_block == "row_sum"
    assert [a.extent for a in info.spatial_axes] == [64] and [a.extent for a in info.reduce_axes] == [256]
    # row_exp was inlined: the block reads the real input A (and the row max intermediate)
    reads = {a.name: a.is_param for a in info.reads}
    assert reads == {"A": True, "row_max": False}


def test_matmul_footprint_matches_hand_computed_regions():
    nn = analyze(ops.matmul(256, 128, 64, "float32", layout="NN").func)
    assert nn.footprint((64, 32), (16,)) == {"A": (64, 16), "B": (16, 32)}
    assert nn.footprint((64, 32)) == {"A": (64, 64), "B": (64, 32)}  # whole reduction
    assert nn.footprint_bytes((64, 32), (16,)) == {"A": 64 * 16 * 4, "B": 16 * 32 * 4}
    tn = analyze(ops.matmul(256, 128, 64, "float16", layout="TN", batch=4).func)
    assert tn.footprint((2, 64, 32), (16,)) == {"A": (2, 16, 64), "B": (2, 16, 32)}
    assert tn.footprint_bytes((2, 64, 32), (16,))["A"] == 2 * 16 * 64 * 2
    # a tile larger than the axis is clipped to it (padding)
    assert nn.footprint((512, 32), (16,))["A"] == (256, 16)


def test_conv_footprint_matches_hand_computed_region():
    # Out[n, p, q, k] += data[n, p*2 + r - 1, q*2 + s - 1, c] * W[r, s, c, k] (padding inlined)
    stride, n, h, w, c, k = 2, 4, 32, 32, 16, 64
    info = analyze(ops.conv2d_nhwc(n, h, w, c, k, r=3, s=3, stride=stride, pad=1).func)
    assert {a.name for a in info.reads} == {"data", "W"}  # the padding block was inlined
    assert [a.extent for a in info.spatial_axes] == [4, 16, 16, 64]
    assert [a.extent for a in info.reduce_axes] == [3, 3, 16]
    tile, rstep = (2, 4, 5, 32), (3, 1, 8)
    fp = info.footprint(tile, rstep)
    assert fp["data"] == (2, (4 - 1) * stride + 3, (5 - 1) * stride + 1, 8)
    assert fp["W"] == (3, 1, 8, 32)
    # the whole output needs the whole (padded -> clipped) input
    full = info.footprint((4, 16, 16, 64))
    assert full["data"] == (4, 32, 32, 16) and full["W"] == (3, 3, 16, 64)
    assert info.footprint_bytes(tile, rstep)["data"] == 2 * 9 * 9 * 8 * 2


@pytest.mark.parametrize("name", ["conv2d", "matmul_tn_batch", "bias_relu", "softmax", "gemv_8", "sum_outer"])
def test_closed_form_footprint_agrees_with_tvm_bound_inference(name):
    info = analyze(FAMILY_CASES[name][0].func)
    for scale in (1, 2, 3, 5, 8):
        tile = tuple(min(a.extent, scale + i) for i, a in enumerate(info.spatial_axes))
        rstep = tuple(min(a.extent, scale * 2) for a in info.reduce_axes)
        ext = info.iter_extents(tile, rstep)
        for acc in info.reads:
            assert acc.linear is not None
            assert acc.region(ext) == acc.exact_region(ext), (acc.name, tile, rstep)


def test_analysis_is_cached():
    f = ops.matmul(64, 64, 64, "float32").func
    assert analyze(f) is analyze(f)
    assert analyze(ops.matmul(64, 64, 64, "float32").func) is analyze(f)  # structurally equal
    assert analyze(ops.matmul(64, 64, 32, "float32").func) is not analyze(f)


def _symbolic_row_sum():
    n = tirx.Var("n", "int64")
    A = te.placeholder((n, 128), "float16", name="A")
    k = te.reduce_axis((0, 128), name="k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")
    return te.create_prim_func([A, B])


def test_symbolic_shape_needs_opt_shapes():
    func = _symbolic_row_sum()
    with pytest.raises(ValueError, match=r"symbolic shape var\(s\) n .*opt_shapes"):
        analyze(func)
    info = analyze(func, {"n": 4096})
    assert info.kind == "reduction"
    assert [a.extent for a in info.spatial_axes] == [4096]
    assert info.inputs[0].shape == (4096, 128)
    assert analyze(func, {"n": 64}).inputs[0].shape == (64, 128)  # cache keyed by opt_shapes


@T.prim_func(s_tir=True)
def _opaque(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("opaque"):
            T.reads(A[i])
            T.writes(B[i])
            B[i] = A[i] * T.float32(2)


@T.prim_func(s_tir=True)
def _no_blocks(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        B[i] = A[i]


@T.prim_func(s_tir=True)
def _non_affine_binding(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    for i in range(8):
        with T.sblock("B"):
            vi = T.axis.spatial(64, i * i)
            B[vi] = A[vi]


@T.prim_func(s_tir=True)
def _gather(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    for i in range(64):
        with T.sblock("B"):
            vi = T.axis.spatial(64, i)
            B[vi] = A[(vi * vi) % 64]


@pytest.mark.parametrize("func", [_opaque, _no_blocks, _non_affine_binding], ids=["opaque", "no_blocks", "non_affine"])
def test_unsupported_functions_raise_clear_errors(func):
    with pytest.raises(ValueError, match="cannot be normalized"):
        analyze(func)


def test_full_reduction_keeps_one_unit_spatial_axis():
    A = te.placeholder((1024,), "float32", name="A")
    k = te.reduce_axis((0, 1024), name="k")
    total = te.compute((1,), lambda _: te.sum(A[k], axis=k), name="total")
    info = analyze(te.create_prim_func([A, total]))
    assert info.kind == "reduction"
    assert [a.extent for a in info.spatial_axes] == [1] and [a.extent for a in info.reduce_axes] == [1024]


def test_non_primfunc_is_rejected():
    with pytest.raises(ValueError, match="PrimFunc"):
        analyze("not a function")


def test_non_affine_index_falls_back_to_bound_inference():
    info = analyze(_gather)
    acc = info.read("A")
    assert acc.linear is None and acc.innermost_axis() is None
    assert info.footprint((8,)) == {"A": (64,)}  # (v*v) % 64 may touch all of A
    assert info.kind == "elementwise"


@T.prim_func(s_tir=True)
def scale_by_scalar(a: T.Buffer((64, 512), "float16"), s: T.Buffer((), "float16"), b: T.Buffer((64, 512), "float16")):
    for i, j in T.grid(64, 512):
        with T.sblock("b"):  # how a model's scalar constant (1/sqrt(d) in attention) arrives
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = a[vi, vj] * s[()]


def test_a_scalar_parameter_is_no_vector_run_and_the_function_gets_configs():
    info = analyze(scale_by_scalar)
    scalar = next(r for r in info.reads if r.name == "s")
    assert scalar.innermost_axis() is None
    configs = DefaultPolicy(scale_by_scalar, CUDA("nvidia/nvidia-h100")).emit_config(4)
    assert configs and all(c.kind == "elementwise" and c.vector_width("s") == 1 for c in configs)


def test_the_analysis_cache_keeps_each_functions_buffer_names():
    """Structurally equal functions with other buffer names (two models' weight transposes) get
    their own names: configs name buffers (vector widths, the transpose's source)."""
    def transpose(src: str, dst: str):
        x = te.placeholder((256, 128), "float16", name=src)
        return te.create_prim_func([x, te.compute((128, 256), lambda i, j: x[j, i], name=dst)])

    first, second = transpose("A", "B"), transpose("weight", "weight_t")
    assert tvm_ffi.structural_equal(first, second)
    assert analyze(first).reads[0].name == "A"
    assert analyze(second).reads[0].name == "weight" and analyze(second).write.name == "weight_t"


def test_two_parameters_of_one_name_are_two_reads():
    """A fused function can hold two parameters of one name (FuseTIR gave EfficientNet's
    squeeze-excite one): grouped by name, a [1, 32] and a [1, 7, 7, 32] buffer were one access
    whose 2-index and 4-index loads the footprint walked by the larger rank (IndexError)."""
    scale = te.placeholder((1, 32), "float16", name="x")
    data = te.placeholder((1, 7, 7, 32), "float16", name="x")
    out = te.compute((1, 7, 7, 32), lambda n, h, w, c: data[n, h, w, c] * scale[0, c], name="out")
    func = te.create_prim_func([scale, data, out])
    assert [str(p.name) for p in func.params][:2] == ["x", "x"]
    info = analyze(func)
    assert sorted(len(r.tensor.shape) for r in info.reads) == [2, 4]

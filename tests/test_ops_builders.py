"""fastdlight.ops (CPU): every builder the package exports builds its PrimFunc, named and with
its output last, at a small shape; the row count of ``matmul_symbolic_rows`` stays symbolic."""

import pytest
from tvm import tirx

from fastdlight import ops

#: builder name -> its arguments at a small shape (every builder of ``ops.__all__`` that returns an Op)
SMALL = {
    "matmul": (64, 32, 16), "matmul_scaled": (64, 32, 32), "matmul_bias_relu": (64, 32, 16),
    "matmul_gated": (64, 32, 16), "matmul_residual": (64, 32, 16), "gemv": (32, 64),
    "conv2d_nhwc": (1, 8, 8, 16, 16, 3, 3), "conv2d_nhwc_ohwi": (1, 8, 8, 16, 16, 3, 3),
    "elementwise": ((64, 32),), "transpose": ((64, 32), (1, 0)), "reduce": ((64, 32),), "softmax": (64, 32),
    "attention": (1, 2, 16, 16, 16), "decode_attention": (1, 2, 1, 64, 16, 4),
    "matmul_int4": (1, 64, 256), "matmul_int8": (1, 64, 256),
}


def test_every_op_builder_has_a_small_case():
    builders = {n for n in ops.__all__ if callable(getattr(ops, n)) and n.islower() and n not in
                ("matmul_symbolic_rows", "dequantize_weights")}
    assert builders <= set(SMALL), sorted(builders - set(SMALL))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_each_builder_builds_its_primfunc(name):
    op = getattr(ops, name)(*SMALL[name])
    assert isinstance(op.func, tirx.PrimFunc) and op.func.attrs["global_symbol"]
    assert op.flops >= 0 and op.bytes > 0  # (a transpose does no arithmetic)


def test_symbolic_rows_stay_symbolic():
    func = ops.matmul_symbolic_rows(64, 32)
    a = func.params[0]  # (a PrimFunc's parameters are its buffers)
    assert isinstance(a.shape[0], tirx.Var) and [int(d) for d in a.shape[1:]] == [32]
    assert func.attrs["global_symbol"] == "matmul_symbolic_rows"

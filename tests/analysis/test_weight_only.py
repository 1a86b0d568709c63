"""The weight-only matmul as one PrimFunc (``analysis.weight_only``): a function is recognized by
its shape attribute, checked against its buffers, for 4- and 8-bit weights."""

import pytest

from fastdlight import ops
from fastdlight.analysis.weight_only import ATTR, WeightOnlyShape, match_weight_only


def test_the_op_is_recognized_with_its_shape():
    op = ops.matmul_int4(3, 4100, 2048, group_size=64, zero_point=True)
    assert match_weight_only(op.func) == WeightOnlyShape((3,), 4100, 2048, 64, "float16", "float16", True)


def test_an_attribute_the_buffers_disagree_with_is_not_trusted():
    op = ops.matmul_int4(1, 512, 1024)
    lying = WeightOnlyShape((1,), 512, 2048, 128).to_attr()  # another K
    assert match_weight_only(op.func.with_attr(ATTR, lying)) is None
    assert match_weight_only(op.func.without_attr(ATTR)) is None


def test_eight_bit_weights_pack_four_to_a_word():
    op = ops.matmul_int8(1, 512, 1024, group_size=64)
    shape = match_weight_only(op.func)
    assert shape == WeightOnlyShape((1,), 512, 1024, 64, bits=8)
    assert [tuple(int(d) for d in p.shape) for p in op.func.params][1] == (512, 1024 // 4)


@pytest.mark.parametrize("kwargs, says", [
    ({"bits": 3}, "3-bit weights are not supported"),
    ({"bits": 8, "group_size": 6}, "multiple of 4"),
    ({"dtype": "float32"}, "activations must be one of"),
])  # fmt: skip
def test_bad_shapes_are_refused(kwargs, says):
    args = {"lead": (1,), "n": 64, "k": 128, "group_size": 32, **kwargs}
    with pytest.raises(ValueError, match=says):
        WeightOnlyShape(**args)

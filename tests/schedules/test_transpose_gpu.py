"""The transpose template on a real GPU: every config the policy emits for model layout changes
and odd shapes runs on random inputs (output NaN-poisoned) and matches numpy."""

import pytest
import tvm
from gpu_util import check_configs

from fastdlight import ops
from fastdlight.analysis.func_info import analyze
from fastdlight.arch import CUDA
from fastdlight.policies.transpose import transpose_configs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape, axes, dtype, out", [
    ((16, 64, 56, 56), (0, 2, 3, 1), "float16", "float16"),
    ((3, 28, 28, 136), (0, 3, 1, 2), "float16", "float16"),  # 136 channels: a partial tile
    ((1000, 300), (1, 0), "float32", "float32"),
    ((2, 64, 30, 7), (0, 2, 3, 1), "float32", "float16"),
    ((5, 33, 70), (0, 2, 1), "float16", "float32"),  # a widening cast
])
def test_every_transpose_config_matches_numpy(shape, axes, dtype, out):
    arch = CUDA.from_device(tvm.cuda(0))
    op = ops.transpose(shape, axes, dtype, out)
    check_configs(op, transpose_configs(analyze(op.func), arch, 6), arch)

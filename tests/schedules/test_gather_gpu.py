"""Gathers on a real GPU: every gather config of the stem's im2col matches numpy."""

import pytest
import tvm
from gpu_util import check_configs
from test_gather import STEMS, im2col_op

from fastdlight.analysis.func_info import analyze
from fastdlight.arch import CUDA
from fastdlight.policies.gather import gather_configs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("geometry", STEMS)
def test_every_gather_config_matches_numpy(geometry):
    arch = CUDA.from_device(tvm.cuda(0))
    op = im2col_op(*geometry)
    check_configs(op, gather_configs(analyze(op.func), arch, 4), arch)

"""Gathers on a real GPU: every gather config of the stem's im2col matches numpy."""

import pytest
from gpu_util import run_and_check
from test_gather import STEMS, im2col_op

from fastdlight.policies.analysis import analyze
from fastdlight.policies.gather import gather_configs
from fastdlight.schedules import dispatch_config
from fastdlight.tune.compile import build

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("geometry", STEMS)
def test_every_gather_config_matches_numpy(geometry):
    import tvm

    from fastdlight.arch import CUDA

    arch = CUDA.from_device(tvm.cuda(0))
    op = im2col_op(*geometry)
    configs = gather_configs(analyze(op.func), arch, 4)
    assert configs
    for config in configs:
        with arch.target:
            result = dispatch_config(op.func, config, allow_fallback=False)
        run_and_check(build(result.schedule.mod, arch.target), op)

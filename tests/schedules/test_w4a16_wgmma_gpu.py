"""The dequantizing wgmma template (4-bit weights, prefill rows) on the GPU: every config its
policy emits is correct against the float64 dequantized reference, on LLaMA's shapes and odd
ones (M not a multiple of the tile, N not a multiple of the weight tile, K = 11008, zero points,
groups of 64 and 256, persistent CTAs walking several tiles). Needs an sm_90a GPU."""

import pytest

from fastdlight import ops
from fastdlight.analysis.weight_only import match_weight_only
from fastdlight.policies.wgmma_dequant import dequant_wgmma_configs
from fastdlight.search.runner import apply_and_build

pytestmark = pytest.mark.gpu

CASES = {
    "llama_up": (2048, 11008, 4096, 128, False),
    "llama_down": (2048, 4096, 11008, 128, False),
    "odd_rows": (1000, 4096, 4096, 128, False),
    "odd_rows_zeros": (333, 1000, 2048, 64, True),
    "group256": (520, 1088, 1024, 256, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_dequant_wgmma_config_is_correct(name, hopper_arch):
    m, n, k, group, zero_point = CASES[name]
    op = ops.matmul_int4(m, n, k, group_size=group, zero_point=zero_point)
    configs = dequant_wgmma_configs(match_weight_only(op.func), hopper_arch)
    assert configs
    results, best = apply_and_build(op.func, configs, hopper_arch, check="all", budget_ms=5, ref=op.reference,
                                    progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)
    assert best.config.kind == "matmul_wgmma_dequant"

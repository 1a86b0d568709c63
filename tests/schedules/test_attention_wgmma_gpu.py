"""Fused attention template on the GPU: every config the attention policy emits is correct
(against the float64 reference) on ragged sequence ends, causal masks aligned to the bottom
right, GQA, head dims 64 and 128 and others (40, 80, 96, 256), fp16 and bf16, a CTA per tile
and persistent grids. Needs an sm_90a GPU (skipped elsewhere)."""

import pytest

from fastdlight import ops
from fastdlight.analysis.attention import match_attention
from fastdlight.policies.attention import attention_configs
from fastdlight.search.runner import apply_and_build

pytestmark = pytest.mark.gpu

CASES = {
    "causal_d128_tail": ((1, 4, 1000, 1000, 128), dict(causal=True)),
    "causal_d64_bottom_right": ((2, 3, 200, 777, 64), dict(causal=True)),
    "gqa_bf16_tail": ((1, 8, 333, 4097, 128), dict(kv_heads=2, dtype="bfloat16")),
    "one_query": ((2, 4, 1, 300, 128), dict(causal=True)),
    # more tiles than SMs: each tile also on a persistent grid, its CTAs walking several tiles
    "persistent_d64_tail": ((4, 12, 1000, 1000, 64), dict(causal=True)),
    # head dims short of whole 64-column chunks (P·V over the padded dim, zero columns not
    # stored) and 256, both templates' configs
    "causal_d96_tail": ((1, 4, 1000, 1000, 96), dict(causal=True)),
    "cross_d40": ((2, 8, 333, 77, 40), {}),
    "gqa_causal_d256_bf16": ((1, 8, 500, 500, 256), dict(kv_heads=4, causal=True, dtype="bfloat16")),
    "d80_one_query": ((2, 4, 1, 300, 80), dict(causal=True)),
}


@pytest.fixture(scope="module")
def arch(hopper_arch):
    return hopper_arch


@pytest.mark.parametrize("name", list(CASES))
def test_every_attention_config_is_correct(name, arch):
    args, kw = CASES[name]
    op = ops.attention(*args, **kw)
    configs = attention_configs(match_attention(op.func), arch, 8)
    results, best = apply_and_build(op.func, configs, arch, check="all", budget_ms=5, ref=op.reference,
                                    progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)
    assert best.config.kind == "attention_wgmma" or args[4] not in (64, 128)

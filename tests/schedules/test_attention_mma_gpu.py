"""Fused attention with mma.sync on the GPU: every config the policy emits for sm_80 is correct
(against the float64 reference) on ragged sequence ends, causal masks aligned to the bottom
right, GQA, head dims 64 and 128, fp16 and bf16 and the heads' layouts. Runs on an sm_90a GPU
(mma.sync runs there too; skipped elsewhere)."""

import numpy as np
import pytest

from fastdlight import ops
from fastdlight.analysis.attention import AttentionShape, attention_func, match_attention
from fastdlight.arch import CUDA
from fastdlight.policies.attention import mma_attention_configs
from fastdlight.search.runner import apply_and_build

pytestmark = pytest.mark.gpu

CASES = {
    "causal_d128_tail": ((1, 4, 1000, 1000, 128), dict(causal=True)),
    "causal_d64_bottom_right": ((2, 3, 200, 777, 64), dict(causal=True)),
    "gqa_bf16_tail": ((1, 8, 333, 4097, 128), dict(kv_heads=2, dtype="bfloat16")),
    "one_query": ((2, 4, 1, 300, 128), dict(causal=True)),
    # head dims other than 64 and 128 (Hopper measures this kernel beside the wgmma one): padded rows
    "d96_gqa_tail": ((1, 8, 777, 777, 96), dict(kv_heads=2, causal=True)),
    "d80_tail": ((2, 4, 300, 517, 80), dict()),
    "d32_causal": ((2, 4, 256, 256, 32), dict(causal=True)),
    "d192_bf16": ((1, 4, 200, 200, 192), dict(causal=True, dtype="bfloat16")),
    "d256_gqa_tail": ((1, 8, 333, 333, 256), dict(kv_heads=4, causal=True)),
    # head dims of 8-column multiples, computed over whole 16-column steps (zeros past D)
    "d40_cross": ((2, 8, 1000, 77, 40), dict()),
    "d72_causal_bf16": ((1, 4, 300, 300, 72), dict(causal=True, dtype="bfloat16")),
}
#: the heads as models hold them before splitting: the function of that layout, checked against
#: the reference of its Q, K and V transposed to [B, H, T, D]
LAYOUTS = {
    "bthd_gqa_d64": AttentionShape(2, 8, 300, 300, 64, 2, causal=True, layout="bthd"),
    "packed_qkv_tail": AttentionShape(1, 6, 777, 777, 128, 6, causal=True, layout="packed"),
}


def layout_case(shape: AttentionShape):
    """(function, reference) of ``shape``'s layout."""
    s = shape
    bhtd = ops.attention(s.batch, s.heads, s.seq_q, s.seq_kv, s.head_dim, s.kv_heads, s.causal).reference

    def ref(*inputs):
        if s.layout == "packed":
            (qkv,) = inputs
            inputs = (qkv[:, :, :s.heads], qkv[:, :, s.heads:s.heads + s.kv_heads], qkv[:, :, s.heads + s.kv_heads:])
        return bhtd(*(np.swapaxes(x, 1, 2) for x in inputs))

    return attention_func(s), ref


@pytest.mark.parametrize("name", list(CASES) + list(LAYOUTS))
def test_every_mma_attention_config_is_correct(name, hopper_arch):
    if name in CASES:
        args, kw = CASES[name]
        op = ops.attention(*args, **kw)
        func, ref = op.func, op.reference
    else:
        func, ref = layout_case(LAYOUTS[name])
    configs = mma_attention_configs(match_attention(func), CUDA("nvidia/nvidia-a100"), 8)
    results, _ = apply_and_build(func, configs, hopper_arch, check="all", budget_ms=5, ref=ref, progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)
    assert len(results) == len(configs)

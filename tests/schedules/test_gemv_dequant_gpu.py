"""The dequantizing GEMV (4- and 8-bit weights) on the GPU: every config its policy emits is
correct against the float64 dequantized reference, on odd shapes (N not a multiple of a CTA's
rows, a partial last lane step along K, several activation rows, zero points, groups of 32,
persistent CTAs walking the row blocks, bf16 activations, 8-bit weights; the tensor-core form
where it applies). Needs an sm_90 GPU."""

import pytest

from fastdlight import ops
from fastdlight.analysis.weight_only import match_weight_only
from fastdlight.policies.gemv_dequant import dequant_gemv_configs
from fastdlight.search.runner import apply_and_build

pytestmark = pytest.mark.gpu

CASES = {
    "decode_n_tail": (1, 4100, 4096, 128, False),
    "rows3_k_tail_zeros": (3, 1000, 11008, 64, True),
    "rows16_group32": (16, 520, 2048, 32, False),
    "persistent_walk": (1, 11008, 4096, 128, False),  # more row blocks than CTAs at once: persistent
    "bf16_rows2_zeros": (2, 1000, 4096, 64, True, "bfloat16"),
    "bf16_decode": (1, 4100, 11008, 128, False, "bfloat16"),
    "int8_decode": (1, 4100, 4096, 128, False, "float16", 8),
    "int8_rows3_zeros": (3, 1000, 11008, 64, True, "float16", 8),
    # the tensor-core form: 86 steps of K over its warps unevenly, groups of two steps, 3 columns
    "mma_rows3_group256": (3, 1000, 11008, 256, False),
    "mma_rows8": (8, 520, 2048, 128, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_dequant_gemv_config_is_correct(name, hopper_arch):
    m, n, k, group, zero_point, *rest = CASES[name]
    dtype, bits = (rest + ["float16", 4][len(rest):])[:2]
    make = ops.matmul_int8 if bits == 8 else ops.matmul_int4
    op = make(m, n, k, group_size=group, zero_point=zero_point, dtype=dtype)
    configs = dequant_gemv_configs(match_weight_only(op.func), hopper_arch, variants=True)
    results, best = apply_and_build(op.func, configs, hopper_arch, check="all", budget_ms=5, ref=op.reference,
                                    progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)
    assert best.config.kind in ("gemv_dequant", "gemv_dequant_mma")
    if m <= 8 and bits == 4 and dtype == "float16" and not zero_point and k % 128 == 0 and group % 128 == 0:
        assert any(r.config.kind == "gemv_dequant_mma" and r.verified for r in results)

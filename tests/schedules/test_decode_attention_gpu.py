"""The split-KV decode attention template on the GPU: every layout its policy emits is correct
against the float64 reference on odd shapes (a cache length no multiple of the tiles, chunks
left empty, no appended token, bf16, head dims 64 and 256, eight query rows; a paged cache whose
last page is partly filled, pages of 16 and 64 tokens; the step that merges its chunks itself;
head dims 40, 72, 80 and 96; more query rows than a CTA holds (MQA);
tiles staged in shared memory).
Needs an sm_90 GPU."""

import dataclasses

import pytest

from fastdlight import ops
from fastdlight.analysis.decode_attention import match_decode_split
from fastdlight.config import Config
from fastdlight.policies.decode_attention import decode_attention_configs
from fastdlight.search.runner import apply_and_build

pytestmark = pytest.mark.gpu

CASES = {
    "llama3_odd_length": (1, 8, 4, 1000, 128, 33, True),
    "empty_chunks": (1, 8, 4, 5, 128, 33, True),
    "batch16_no_token": (16, 32, 1, 4096, 128, 1, False),
    "bf16_rows8_d64": (2, 4, 8, 777, 64, 16, True, "bfloat16"),
    "d256": (1, 2, 8, 300, 256, 8, False),
    "paged16_odd_length": (2, 8, 4, 1000, 128, 33, False, "float16", 16),
    "paged64_bf16": (3, 4, 2, 777, 64, 8, False, "bfloat16", 64),
    # the step that also merges (its last CTA a head): timed and checked again and again, so the
    # tickets it leaves at zero are the next launch's start
    "merged_llama3": (1, 8, 4, 1000, 128, 33, True, "float16", 0, True),
    "merged_empty_chunks": (1, 8, 4, 5, 128, 33, True, "float16", 0, True),
    "merged_paged16_b2": (2, 8, 4, 1000, 128, 17, False, "float16", 16, True),
    # the last CTA's merge unrolled (17 chunks); one chunk: each CTA writes its output itself
    "merged_b1_h32": (1, 32, 1, 4096, 128, 17, False, "float16", 0, True),
    "merged_one_chunk": (16, 32, 1, 4096, 128, 1, False, "float16", 0, True),
    "merged_one_chunk_token_bf16": (3, 4, 4, 777, 64, 1, True, "bfloat16", 0, True),
    # head dims no power of two (a key's lanes past D hold zeros; the merge kernel's too)
    "phi3_d96_merged": (1, 32, 1, 4096, 96, 17, False, "float16", 0, True),
    "d80_token_odd_length": (1, 8, 4, 1000, 80, 33, True),
    "d40_bf16_rows8": (2, 4, 8, 777, 40, 16, True, "bfloat16"),
    "paged16_d72": (2, 8, 4, 1000, 72, 17, False, "float16", 16),
    # more rows than a CTA holds, in blocks (MQA; a short last block; merged; paged)
    "mqa_rows32": (1, 1, 32, 4096, 128, 32, False),
    "rows12_merged_token": (2, 4, 12, 1000, 128, 9, True, "float16", 0, True),
    "rows20_one_chunk_bf16": (2, 8, 20, 777, 64, 1, True, "bfloat16", 0, True),
    "paged16_rows16": (2, 2, 16, 1000, 128, 9, False, "float16", 16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_decode_attention_config_is_correct(name, hopper_arch):
    batch, kv_heads, rows, seq_kv, head_dim, splits, appended, *rest = CASES[name]
    op = ops.decode_attention(batch, kv_heads, rows, seq_kv, head_dim, splits, appended, *rest)
    configs = decode_attention_configs(match_decode_split(op.func), hopper_arch)
    results, best = apply_and_build(op.func, configs, hopper_arch, check="all", budget_ms=5, ref=op.reference,
                                    progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)
    assert best.config.kind in ("decode_attention", "decode_attention_mma")


@pytest.mark.parametrize("name", ["llama3_odd_length", "empty_chunks", "paged16_odd_length", "merged_llama3"])
@pytest.mark.parametrize("stages", [3, 4])
def test_tiles_staged_in_shared_memory_are_correct(name, stages, hopper_arch):
    """The ring of tiles (cp.async) on the edges: an appended token, chunks left empty, pages."""
    batch, kv_heads, rows, seq_kv, head_dim, splits, appended, *rest = CASES[name]
    op = ops.decode_attention(batch, kv_heads, rows, seq_kv, head_dim, splits, appended, *rest)
    base = Config("decode_attention", block=(16,), thread=(8,), warp=(4,))
    results, best = apply_and_build(op.func, [dataclasses.replace(base, pipeline_stages=stages)], hopper_arch,
                                    check="all", budget_ms=5, ref=op.reference, progress=False)
    bad = [f"{r.config}: {r.error or r.check_message}" for r in results if not r.verified]
    assert not bad, "\n".join(bad)
    assert best.config.pipeline_stages == stages

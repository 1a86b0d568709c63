"""benchmarks/bench_models.py (CPU; torch is needed only on the GPU machine): its report of a
model's profile and of its kernel traces."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_models  # noqa: E402


def test_the_profile_lists_both_sides_kernel_traces_with_their_totals():
    row = bench_models.Row("mlp_gelu", "an MLP", fastdlight_ms=0.6, torch_compile_ms=0.58)
    row.profile = [{"function": "fused_matmul_cast1_add_gelu", "calls": 1, "winner": "fastdlight", "ms": 0.31,
                    "stock_ms": 2.9, "config": "Config[matmul_wgmma](...)", "error": None, "fallback": ""}]
    row.trace = {"fastdlight": [{"kernel": "fused_matmul_cast1_add_gelu_kernel", "us": 330.5, "launches": 1},
                                {"kernel": "fused_matmul1_cast4_add1_kernel", "us": 270.25, "launches": 1}],
                 "torch.compile": [{"kernel": "sm90_xmma_gemm_f16f16_f32", "us": 560.0, "launches": 2}]}
    text = bench_models.profile_text(row)
    assert "fastdlight: kernels as the model runs them (600.8 us of device time a call)" in text
    assert "torch.compile: kernels as the model runs them (560.0 us" in text
    assert "| fused_matmul1_cast4_add1_kernel | 270.25 | 1 |" in text
    assert "| sm90_xmma_gemm_f16f16_f32 | 560.0 | 2 |" in text


def test_a_failing_trace_is_noted_and_the_row_stands():
    row = bench_models.Row("mlp_gelu", "an MLP")

    def fails():
        raise RuntimeError("no GPU here")

    bench_models.traced(row, "fastdlight", fails)
    assert "trace fastdlight" in row.errors and "fastdlight" not in row.trace


def test_without_torch_it_says_so_in_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_models", None)  # as where torch is not installed
    assert bench_models.main(["--models", "mlp_gelu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: bench_models needs torch")

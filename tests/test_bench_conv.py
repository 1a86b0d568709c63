"""benchmarks/bench_conv.py (CPU): its layers have ResNet-18's output sizes, the NHWC ones (fp16
and bf16) reach tensor-core candidates, and the dry run writes its table and JSON."""

import json
import os
import sys

from fastdlight.arch import CUDA
from fastdlight.compiler.compile import build, compile_cubin, cuda_source
from fastdlight.policies.select import candidate_sets
from fastdlight.schedules import dispatch_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_conv  # noqa: E402


def test_every_layer_builds_with_resnet_output_sizes():
    for layer in bench_conv.LAYERS:
        func = bench_conv.Case(layer, 2, "NCHW", "float16").func()
        out = [int(d) for d in func.params[-1].shape]
        size = (layer.size + 2 * layer.pad - layer.kernel) // layer.stride + 1
        assert out == [2, layer.cout, size, size], layer.name
    sizes = {(ly.size, ly.stride) for ly in bench_conv.LAYERS}
    assert {(224, 2), (56, 1), (28, 1), (14, 1), (7, 1)} <= sizes  # stem and every stage


def test_dry_run_writes_rows_and_nhwc_gets_tensor_cores(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    code = bench_conv.main(["--dry-run", "--batch", "2", "--only", "l4 3x3 512", "--dtypes", "float16", "bfloat16"])
    assert code == 0
    rows = json.loads((tmp_path / "bench_conv.json").read_text())["rows"]
    assert len(rows) == 4 and not any(r["error"] for r in rows)
    for r in rows:
        has_tc = "matmul_tc" in r["winner"]
        assert has_tc == (" NHWC " in r["case"]), r  # NCHW: no tensor-core candidates yet
    assert (tmp_path / "bench_conv.md").read_text().count("| l4 3x3") == 4


def test_pipeline_dry_run_makes_the_stem_a_gemm_and_nchw_layers_transposes(tmp_path, monkeypatch):
    """``--pipeline``: the layer as a one-layer model. The 3-channel stem is an im2col gather and
    a GEMM on tensor cores; an NCHW layer is an NHWC convolution between layout changes, which
    get the shared-memory transpose template."""
    monkeypatch.setenv("OUT", str(tmp_path))
    code = bench_conv.main(["--dry-run", "--pipeline", "--batch", "2", "--only", "stem", "l1 3x3", "--layouts", "NHWC",
                            "NCHW"])
    assert code == 0
    rows = {r["case"]: r["winner"] for r in json.loads((tmp_path / "bench_conv_pipeline.json").read_text())["rows"]}
    stem = rows["stem 7x7/2 3->64 @224 NHWC float16 b2"]
    assert "im2col" in stem and "conv2d" not in stem and "matmul_wgmma" in stem
    nchw = rows["l1 3x3 64->64 @56 NCHW float16 b2"].removeprefix("(dry run) ").split("; ")
    assert any(f.startswith("fused_conv2d") and "matmul_wgmma" in f for f in nchw)
    assert sum(f.endswith("/transpose") for f in nchw) == 2  # the input's and the output's layout changes


def test_held_out_shapes_are_drawn_from_the_seed_and_reach_tensor_cores(tmp_path, monkeypatch):
    """``--held-out``: random geometries no test names. The same seed draws the same shapes; the
    NHWC ones with channels a multiple of 8 get tensor-core candidates, whose top one compiles."""
    drawn = bench_conv.held_out_layers(6, seed=11)
    assert drawn == bench_conv.held_out_layers(6, seed=11) != bench_conv.held_out_layers(6, seed=12)
    names = {ly.name for ly in bench_conv.LAYERS}
    for ly in drawn:
        assert ly.name not in names and ly.size >= ly.kernel and ly.stride in (1, 2)
    monkeypatch.setenv("OUT", str(tmp_path))
    assert bench_conv.main(["--dry-run", "--held-out", "3", "--seed", "11", "--batch", "2", "--layouts", "NHWC"]) == 0
    rows = json.loads((tmp_path / "bench_conv.json").read_text())["rows"]
    assert len(rows) == 3 and not any(r["error"] for r in rows)
    h100 = CUDA("nvidia/nvidia-h100")
    layer = next(ly for ly in drawn if ly.cin % 8 == 0)
    func = bench_conv.Case(layer, 2, "NHWC", "float16").func()
    config = next(c for s in candidate_sets(func, h100, 8) for c in s.configs if c.kind in ("matmul_tc", "matmul_wgmma"))
    with h100.target:
        result = dispatch_config(func, config, allow_fallback=False)
    assert compile_cubin(cuda_source(build(result.schedule.mod, h100.target)), h100.target).spill_bytes == 0

"""benchmarks/bench_conv.py (CPU): its layers have ResNet-18's output sizes, the NHWC ones (fp16
and bf16) reach tensor-core candidates, and the dry run writes its table and JSON."""

import json
import os
import sys

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

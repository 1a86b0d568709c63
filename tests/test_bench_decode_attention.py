"""benchmarks/bench_decode_attention.py (CPU): ``--list`` without torch, a bad case is one line,
and (with torch) each case's module exports and prepares into the split-KV pair alone."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_decode_attention.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def test_list_needs_no_torch_and_a_bad_case_is_one_line():
    done = subprocess.run([sys.executable, SCRIPT, "--list"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "b1_gqa_8k B1 H32 G8 L8192 d128" in done.stdout
    bad = subprocess.run([sys.executable, SCRIPT, "--cases", "b1_h32,nope"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        "unknown case(s) nope; known: b1_h32, b16_h32, b64_h32_2k, b1_gqa_8k")


@pytest.mark.parametrize("case", ["b1_h32", "b1_gqa_8k"])
def test_each_case_prepares_into_the_split_pair(case):
    torch = pytest.importorskip("torch")
    import bench_decode_attention as bench

    from fastdlight.relax import prepare

    b, h, g, _, d = bench.CASES[case]
    example = (torch.randn(b, g, h // g, d), torch.randn(b, g, 40, d), torch.randn(b, g, 40, d))
    mod, dim = bench.relax_module(bench.cache_attention_module(), example)
    assert dim in str(mod["main"].params[1].ty.shape)
    names = {gv.name_hint for gv, _ in prepare("nvidia/nvidia-h100")(mod).functions_items()}
    assert {"decode_attention", "decode_combine"} <= names
    assert not any("softmax" in n or "matmul" in n for n in names)

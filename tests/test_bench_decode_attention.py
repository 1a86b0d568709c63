"""benchmarks/bench_decode_attention.py (CPU): ``--list`` without torch, a bad case is one line,
and (with torch) each case's module exports and prepares into the split-KV pair alone."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import fastdlight.arch
from fastdlight.relax import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_decode_attention.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_decode_attention as bench  # noqa: E402


def test_list_needs_no_torch_and_a_bad_case_is_one_line():
    done = subprocess.run([sys.executable, SCRIPT, "--list"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "b1_gqa_8k B1 H32 G8 L8192 d128" in done.stdout
    bad = subprocess.run([sys.executable, SCRIPT, "--cases", "b1_h32,nope"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        "unknown case(s) nope; known: b1_h32, b16_h32, b64_h32_2k, b1_gqa_8k, b4_gqa_8k, b1_phi3_d96, b1_phi2_d80, "
        "b8_mqa_8k")


@pytest.mark.parametrize("case, merge_kernel", [("b1_h32", False), ("b1_gqa_8k", True), ("b1_phi3_d96", False),
                                                  ("b4_gqa_8k", True), ("b8_mqa_8k", True)])
def test_each_case_prepares_into_the_split_kv_step(case, merge_kernel):
    """B1 H32 (16 chunks of one row) merges in its step; 8 K/V heads (66 chunks of 4 rows; at B4
    16), and MQA (16 chunks of 8-row blocks) keep the merge kernel."""
    torch = pytest.importorskip("torch")

    b, h, g, _, d = bench.CASES[case]
    example = (torch.randn(b, g, h // g, d), torch.randn(b, g, 40, d), torch.randn(b, g, 40, d))
    mod, dim = bench.relax_module(bench.cache_attention_module(), example)
    assert dim in str(mod["main"].params[1].ty.shape)
    names = {gv.name_hint for gv, _ in prepare("nvidia/nvidia-h100")(mod).functions_items()}
    assert "decode_attention" in names and ("decode_combine" in names) == merge_kernel
    assert not any("softmax" in n or "matmul" in n for n in names)


def test_a_page_size_the_kernel_has_not_is_one_line():
    bad = subprocess.run([sys.executable, SCRIPT, "--paged", "7"], capture_output=True, text=True, timeout=120,
                         check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        "--paged 7: pages of 8, 16, 32, 64, 128, 256 tokens")


def test_the_paged_table_shows_both_times_and_their_ratio():
    row = {"case": "b16_h32", "batch": 16, "heads": 32, "kv_heads": 32, "length": 4096, "head_dim": 128,
           "page_size": 16, "splits": 2, "errors": {}, "contiguous_ms": 0.03, "paged_ms": 0.032,
           "paged_vs_contiguous": 0.938, "contiguous_tune_s": 9.0, "paged_tune_s": 10.0}
    failed = dict(row, errors={"paged": "TuningError: none"})
    del failed["paged_vs_contiguous"]
    table = bench.paged_markdown([row, failed]).splitlines()
    assert table[2] == "| b16_h32 | B16 H32/G32 L4096 d128 | 16 | 2 | 0.0300 | 0.0320 | 0.94x | 9.0 / 10.0 |"
    assert table[3].endswith("| TuningError: none |")


def test_each_case_is_saved_as_it_finishes(tmp_path, monkeypatch):
    """A run cut short (a time limit's kill) keeps the cases it finished."""
    pytest.importorskip("torch")

    def run_case(name, arch, topk):
        if name == "b16_h32":
            raise SystemExit("killed")  # not an error row: the process ends here
        return {"case": name, "batch": 1, "heads": 32, "kv_heads": 32, "length": 4096, "head_dim": 128, "errors": {},
                "fastdlight_ms": None}

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(fastdlight.arch, "has_gpu", lambda: True)
    monkeypatch.setattr(fastdlight.arch.CUDA, "from_device", staticmethod(lambda dev: SimpleNamespace(device_name="GPU")))
    monkeypatch.setattr(bench, "run_case", run_case)
    with pytest.raises(SystemExit):
        bench.main(["--cases", "b1_h32,b16_h32"])
    saved = json.loads((tmp_path / "bench_decode_attention.json").read_text())
    assert [r["case"] for r in saved["rows"]] == ["b1_h32"]

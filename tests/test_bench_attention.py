"""bench_attention (CPU): its cases, its table and its refusals, without torch or TVM."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_attention.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_attention  # noqa: E402


def test_list_names_every_case_without_importing_torch_or_tvm():
    code = (f"import sys, runpy; sys.argv = [{SCRIPT!r}, '--list']\n"
            f"try:\n    runpy.run_path({SCRIPT!r}, run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "assert 'torch' not in sys.modules and 'tvm' not in sys.modules\nprint('clean')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr
    assert all(f"| {name} |" in done.stdout for name in bench_attention.CASES)


def test_every_case_is_an_attention_the_operator_accepts():
    # fastdlight.ops imports TVM, which this module otherwise leaves out (see its docstring)
    from fastdlight import ops

    for case in bench_attention.CASES.values():
        op = ops.attention(case.batch, case.heads, case.seq_q, case.seq_kv, case.head_dim,
                           kv_heads=case.kv_heads, causal=case.causal)
        assert op.flops > 0


def test_the_table_shows_both_sides_and_their_ratio():
    row = bench_attention.Row("decode_b1", "B1 H32 TQ1 TKV4096 d128 causal", ours_ms=0.02, torch_ms=0.012,
                              ours_tflops=1.7, torch_tflops=2.8, ours_tbs=1.68, torch_tbs=2.8, verified=True, tune_s=9.5)
    failed = bench_attention.Row("prefill_8k", "B1 H32 TQ8192 TKV8192 d128", error="TuningError: none verified")
    text = bench_attention.markdown([row, failed])
    assert "| decode_b1 | B1 H32 TQ1 TKV4096 d128 causal | 0.0200 | 0.0120 | 0.60x | 1.7 / 2.8 | 1.68 / 2.80 | True |" in text
    assert "| prefill_8k |" in text and "TuningError: none verified |" in text


def test_an_unknown_case_is_refused_in_one_line():
    done = subprocess.run([sys.executable, SCRIPT, "--cases", "prefill_9k"], capture_output=True, text=True,
                          timeout=60, check=False)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and err[0].startswith("error: unknown case(s) ['prefill_9k']")

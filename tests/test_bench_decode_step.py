"""benchmarks/bench_decode_step.py and decode_step.py: the two forms of the decode step agree,
the step exports, prepares, and compiles to cubins with every function scheduled (CPU)."""

import os
import subprocess
import sys
import warnings

import pytest

import fastdlight
from fastdlight.arch import CUDA
from fastdlight.relax import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_decode_step.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_decode_step  # noqa: E402


def test_bad_lengths_are_one_line():
    done = subprocess.run([sys.executable, SCRIPT, "--lengths", "0,x"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(
        "--lengths 0,x and --batch 1: positive integers")


def test_the_step_and_the_static_cache_form_agree():
    torch = pytest.importorskip("torch")
    # decode_step imports torch, which is optional
    import decode_step

    s = decode_step.DecodeShape(dim=128, heads=4, kv_heads=2, ffn=256)
    step, static = decode_step.build(s), decode_step.build(s, decode_step.StaticCacheStep)
    x, k, v, cos, sin = decode_step.inputs(s, 2, 21)
    with torch.no_grad():
        y, k_new, v_new = step(x, k, v, cos, sin)
        big_k, big_v = torch.zeros(2, 2, 32, s.head_dim), torch.zeros(2, 2, 32, s.head_dim)
        big_k[:, :, :21], big_v[:, :, :21] = k, v
        torch.testing.assert_close(static(x, big_k, big_v, cos, sin, 21), y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(big_k[:, :, 21:22], k_new)
    torch.testing.assert_close(big_v[:, :, 21:22], v_new)


def test_one_module_with_a_symbolic_cache_length_tunes_per_length_and_compiles():
    """Exported once with L symbolic: the functions that depend on L get a kernel per length
    behind a dispatcher, and the module builds (compile-only here)."""
    pytest.importorskip("torch")
    # decode_step imports torch, which is optional
    import decode_step

    h100 = CUDA("nvidia/nvidia-h100")
    s = decode_step.DecodeShape(dim=256, heads=8, kv_heads=2, ffn=512)
    mod, dim = bench_decode_step.relax_module(decode_step.build(s), decode_step.inputs(s, 1, 40), symbolic=True)
    assert dim is not None and str(mod["main"].params[1].ty.shape[2]) == dim
    tuning = fastdlight.ApplyFastTuning(topk=1, target=h100, measure=False, opt_shapes={dim: [64, 512]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tuning(prepare(h100.target)(mod))
    dispatched = [e for e in tuning.report if e.dispatch]
    assert dispatched and all(f"{dim}<=512" in e.dispatch for e in dispatched)
    # replays that do not compile with L symbolic (the scores' transpose left whole to a thread,
    # the K q^T GEMM's vector stores) give way to another candidate or stock Dlight's rules
    assert not [e.function for e in tuning.report if e.status == "untuned"]
    fastdlight.build(tuned, h100.target)


def test_the_models_named_are_the_layers_decode_step_has():
    pytest.importorskip("torch")
    # decode_step imports torch, which is optional
    import decode_step

    assert tuple(decode_step.SHAPES) == bench_decode_step.MODELS
    assert decode_step.SHAPES["phi3_mini"].head_dim == 96 and decode_step.SHAPES["mqa"].kv_heads == 1
    bad = subprocess.run([sys.executable, SCRIPT, "--model", "nope"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert bad.returncode == 2 and "invalid choice: 'nope'" in bad.stderr.strip().splitlines()[-1]

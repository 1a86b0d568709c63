"""bench_torch_backend (CPU): its table, and the one-line refusals before any GPU work."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_torch_backend.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_torch_backend  # noqa: E402
import zoo_models  # noqa: E402


def test_the_table_shows_the_backend_against_the_relax_path_and_the_second_process():
    rows = [{"model": "resnet50", "size": "1", "compile_s": 71.2, "max_rel_err": 1e-3, "backend_ms": 0.5,
             "relax_ms": 0.49, "queued_ms": 0.61, "second_s": 3.1, "second_process_s": 9.8},
            {"model": "llama_gqa_2l", "size": "1x512", "error": "Unsupported: no"}]
    text = bench_torch_backend.markdown(rows)
    assert "| resnet50 | 1 | 1.0e-03 | 71.2 | 0.500 | 0.490 | 0.98 | 0.610 | 3.1 (9.8) |  |" in text
    assert "| llama_gqa_2l | 1x512 | - | - | - | - | - | - | - (-) | Unsupported: no |" in text


def test_an_unknown_model_is_refused_in_one_line():
    done = subprocess.run([sys.executable, SCRIPT, "--models", "resnet51"], capture_output=True, text=True,
                          timeout=120, check=False)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and err[0].startswith("error: unknown model(s) ['resnet51']")


def test_the_default_models_are_a_cnn_an_encoder_and_a_decoder_of_the_zoo():
    assert all(name in zoo_models.MODELS for name in bench_torch_backend.DEFAULT_MODELS)
    families = {zoo_models.MODELS[name].family for name in bench_torch_backend.DEFAULT_MODELS}
    assert families == {"torchvision", "transformers"}

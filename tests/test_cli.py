"""The ``fastdlight`` command line: an end-to-end compile-only run and clean bad-input errors."""

import json
import os
import subprocess
import sys

import pytest

from fastdlight import cli, ops
from fastdlight.arch import has_gpu
from fastdlight.cli import commands, load_primfunc, main
from fastdlight.compiler import pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "fastdlight.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def test_tune_add_compile_only_end_to_end(tmp_path):
    out = tmp_path / "res.json"
    proc = run_cli("tune", "add", "1024", "1024", "--no-measure", "--topk", "3", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "Nothing was timed because" in text
    if not has_gpu():
        assert "no GPU was found" in text
    assert "compiled to cubin for sm_90a" in text
    table = [ln for ln in text.splitlines() if ln[:1].isdigit()]
    assert len(table) == 3 and "Config[elementwise]" in table[0]
    assert "Tuning wall time" in text and ("built with NVRTC" in text or "built with nvcc" in text)
    doc = json.loads(out.read_text())
    assert doc["measured"] is False and len(doc["results"]) == 3
    assert all(r["registers"] for r in doc["results"] if r["error"] is None)
    # where the build time went, per candidate, and when each worker was ready
    for r in doc["results"]:
        phases = r["build_phases"]
        assert phases["compile_s"] > 0 and phases["end_s"] >= phases["start_s"] + phases["compile_s"]


def test_a_decode_sized_attention_is_tuned_as_a_model_runs_it(tmp_path):
    """One query token a head: the split-KV functions the Relax rewrite gives such an attention
    (on the H100 model's 132 SMs: 16 chunks merged by the step's last CTA; with 8 K/V heads
    over 8192 keys 66 chunks, the step and the merge kernel), each tuned and in the JSON; a
    prefill size stays the fused attention."""
    out = tmp_path / "decode.json"
    proc = run_cli("tune", "attention", "1", "32", "1", "8192", "128", "--kv-heads", "8", "--no-measure", "--topk",
                   "2", "--json", str(out), "--target", "nvidia/nvidia-h100")
    assert proc.returncode == 0, proc.stderr
    assert "the split-KV decode_attention and decode_combine" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["form"] == "split-KV decode" and [f["op"] for f in doc["functions"]] == ["decode_attention",
                                                                                          "decode_combine"]
    assert all(any(r["error"] is None for r in f["results"]) for f in doc["functions"])
    merged = run_cli("tune", "attention", "1", "32", "1", "4096", "128", "--no-measure", "--topk", "2",
                     "--target", "nvidia/nvidia-h100")
    assert merged.returncode == 0, merged.stderr
    assert "the split-KV decode_attention\n" in merged.stdout and "decode_combine" not in merged.stdout
    prefill = run_cli("tune", "attention", "1", "8", "128", "128", "64", "--causal", "--no-measure", "--topk", "1",
                      "--target", "nvidia/nvidia-h100")
    assert prefill.returncode == 0, prefill.stderr
    assert "decode" not in prefill.stdout and "Config[attention" in prefill.stdout


def test_a_matmul_without_a_wgmma_path_says_why():
    """K = 1001 in fp16: A's rows are no whole 16 bytes, so no TMA and no wgmma on sm_90a; the
    run says so where it announces the tensor-core candidates."""
    proc = run_cli("tune", "matmul", "300", "520", "1001", "--dtype", "float16", "--no-measure", "--topk", "2")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("TensorCorePolicy:"))
    assert "mma.sync only, no wgmma: A's rows are 2002 bytes" in line
    aligned = run_cli("tune", "matmul", "300", "520", "1000", "--dtype", "float16", "--no-measure", "--topk", "2")
    assert "no wgmma" not in aligned.stdout


def test_tune_file_compile_only(tmp_path):
    kernel = tmp_path / "kernel.py"
    kernel.write_text(
        "from tvm.script import tirx as T\n\n"
        "@T.prim_func(s_tir=True)\n"
        "def scale(A: T.Buffer((512, 512), 'float32'), B: T.Buffer((512, 512), 'float32')):\n"
        "    for i, j in T.grid(512, 512):\n"
        "        with T.sblock('B'):\n"
        "            vi, vj = T.axis.remap('SS', [i, j])\n"
        "            B[vi, vj] = A[vi, vj] * T.float32(2)\n"
    )
    proc = run_cli("tune", "--file", str(kernel), "--no-measure", "--topk", "2", "--show-source")
    assert proc.returncode == 0, proc.stderr
    assert "scale from" in proc.stdout and "__global__" in proc.stdout


def test_a_file_as_tvm_prints_it_loads(tmp_path):
    """``func.script()`` prints its imports as comments; the file still loads as it is."""
    text = ops.elementwise((64, 64), "float16", "add").func.script()
    assert "# from tvm.script import tirx as T" in text
    kernel = tmp_path / "printed.py"
    kernel.write_text(text)
    name, func = load_primfunc(str(kernel))
    assert len(func.params) == 3 and name in text


def one_error_line(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1, err
    assert err[0].startswith("fastdlight: error:")
    assert "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("argv, needle", [
    (["tune", "conv3d", "1", "2"], "unknown op 'conv3d'"),
    (["tune", "matmul", "1024", "1024"], "expected matmul M N K"),
    (["tune", "matmul", "1024", "x", "8"], "'x' is not an integer"),
    (["tune", "matmul", "1024", "0", "8"], "must be positive"),
    (["tune", "add", "64", "64", "--dtype", "float64"], "unsupported dtype 'float64'"),
    (["tune", "--file", "/no/such/kernel.py"], "no such file"),
    (["tune"], "missing OP"),
    (["tune", "add", "64", "--bogus"], "unrecognized arguments"),
    (["arch", "--target", "no-such-gpu"], "bad --target"),
    (["tune", "add", "64", "--topk", "0"], "--topk: must be positive"),
    (["tune", "add", "64", "--timeout", "0"], "--timeout: must be positive"),
    (["tune", "add", "64", "--budget-ms", "-5"], "--budget-ms: must be positive"),
    (["tune", "add", "64", "--workers", "x"], "--workers: 'x' is not a number"),
    (["tune", "add", "64", "--json", "/no/such/dir/out.json"], "no such directory"),
    (["tune", "add", "64", "--json", "/"], "is a directory"),
    (["tune", "add", "64", "--shape-var", "n"], "expected NAME=VALUE"),
    (["tune", "add", "64", "--shape-var", "n=4"], "--shape-var applies to a --file function"),
    (["tune", "matmul", "1", "64", "100", "--weight-dtype", "int4"], "must be a multiple of 8 dividing K (100)"),
    (["tune", "matmul", "1", "64", "128", "--weight-dtype", "int2"], "invalid choice: 'int2'"),
    (["tune", "matmul", "1", "64", "128", "--weight-dtype", "int8", "--group-size", "6"], "multiple of 4"),
    (["tune", "matmul", "1", "64", "128", "--weight-dtype", "int4", "--layout", "NT"], "takes no --batch"),
    (["tune", "matmul", "1", "64", "128", "--weight-dtype", "int4", "--dtype", "float32"], "must be float16 or"),
    (["tune", "add", "64", "--weight-dtype", "int4"], "--weight-dtype applies to matmul, not add"),
    (["tune", "matmul", "1", "64", "128", "--zero-point"], "--zero-point applies to a matmul with --weight-dtype"),
    (["tune", "matmul", "64", "64", "128", "--dtype", "float8_e4m3fn", "--layout", "NN"], "K-major only: --layout NT"),
    (["tune", "matmul", "64", "64", "128", "--scales", "row"], "--scales applies to a float8 matmul"),
])  # fmt: skip
def test_bad_input_exits_2_with_one_line(capsys, argv, needle):
    assert needle in one_error_line(capsys, argv)


@pytest.mark.parametrize("nodes, argv, probe_started", [
    (True, [], True),
    (True, ["--no-measure"], False),
    (False, [], False),
    (True, ["--serial"], True),
])
def test_the_probe_process_starts_with_the_build_workers_where_kernels_will_be_timed(monkeypatch, nodes, argv,
                                                                                   probe_started):
    """Both start before the command imports TVM; the probe process only where a GPU's device
    node says kernels will be timed. The run is stopped right after (a made-up usage error)."""
    started = []

    class Pool:
        def __init__(self, name):
            self.name = name

        def warm_up(self):
            started.append(self.name)

    def stop(args):
        raise cli.UsageError("stopped after the warm-up")

    monkeypatch.setattr(pool, "gpu_device_nodes", lambda: nodes)
    monkeypatch.setattr(pool, "shared_pool", lambda n=None: Pool("build"))
    monkeypatch.setattr(pool, "probe_pool", lambda: Pool("probe"))
    monkeypatch.setattr(commands, "make_workload", stop)
    assert main(["tune", "add", "64", *argv]) == 2
    assert started == [name for name, on in (("build", "--serial" not in argv), ("probe", probe_started)) if on]


def test_a_bad_compiler_choice_exits_2_with_one_line(capsys, monkeypatch):
    monkeypatch.setenv("FASTDLIGHT_CUDA_COMPILER", "clang")
    assert "FASTDLIGHT_CUDA_COMPILER='clang': expected 'nvrtc' or 'nvcc'" in one_error_line(
        capsys, ["tune", "add", "64", "--no-measure"])


def test_unparsable_tvmscript_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from tvm.script import tirx as T\n\n"
        "@T.prim_func(s_tir=True)\n"
        "def f(A: T.Buffer((8,), 'float32'), B: T.Buffer((8,), 'float32')):\n"
        "    for i in range(8):\n"
        "        with T.sblock('B'):\n"
        "            vi = T.axis.spatial(8, i)\n"
        "            B[vi] = A[vi] + not_defined\n"
    )
    line = one_error_line(capsys, ["tune", "--file", str(bad)])
    assert "cannot parse" in line and "not_defined" in line
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def oops(:\n")
    assert "cannot parse" in one_error_line(capsys, ["tune", "--file", str(syntax)])
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert "no TVMScript PrimFunc" in one_error_line(capsys, ["tune", "--file", str(empty)])


def test_several_primfuncs_without_func_are_listed(tmp_path, capsys):
    kernel = tmp_path / "two.py"
    body = ("@T.prim_func(s_tir=True)\n"
            "def {n}(A: T.Buffer((8,), 'float32'), B: T.Buffer((8,), 'float32')):\n"
            "    for i in range(8):\n"
            "        with T.sblock('B'):\n"
            "            vi = T.axis.spatial(8, i)\n"
            "            B[vi] = A[vi]\n\n")
    kernel.write_text("from tvm.script import tirx as T\n\n" + body.format(n="first") + body.format(n="second"))
    line = one_error_line(capsys, ["tune", "--file", str(kernel)])
    assert "2 PrimFuncs (first, second)" in line and "--func" in line


def test_shape_var_gives_symbolic_dims_a_value(tmp_path):
    kernel = tmp_path / "sym.py"
    kernel.write_text(
        "from tvm.script import tirx as T\n\n"
        "@T.prim_func(s_tir=True)\n"
        "def scale(a: T.handle, b: T.handle):\n"
        "    n = T.int64()\n"
        "    A = T.match_buffer(a, (n, T.int64(256)), 'float32')\n"
        "    B = T.match_buffer(b, (n, T.int64(256)), 'float32')\n"
        "    for i, j in T.grid(n, T.int64(256)):\n"
        "        with T.sblock('B'):\n"
        "            vi, vj = T.axis.remap('SS', [i, j])\n"
        "            B[vi, vj] = A[vi, vj] * T.float32(2)\n"
    )
    proc = run_cli("tune", "--file", str(kernel), "--shape-var", "n=1024", "--no-measure", "--topk", "2")
    assert proc.returncode == 0, proc.stderr
    assert "compiled to cubin" in proc.stdout


def test_help_and_arch(capsys):
    with pytest.raises(SystemExit) as e:
        main(["tune", "--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    for word in ("matmul M N K", "--no-measure", "--topk", "--layout", "--file"):
        assert word in help_text
    assert main(["arch", "--target", "nvidia/nvidia-a100"]) == 0
    out = capsys.readouterr().out
    assert "sm_80" in out and "108 SMs" in out


def test_python_dash_m_fastdlight_is_the_command():
    done = subprocess.run([sys.executable, "-m", "fastdlight", "arch", "--target", "nvidia/nvidia-a100"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert done.returncode == 0 and "sm_80" in done.stdout, done.stderr

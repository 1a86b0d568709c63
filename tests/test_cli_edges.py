"""The edges a new user hits on a machine without a GPU: impossible sizes, a toolkit that cannot
build for the target, reasons cut at a colon, checks made late, and the small ones. A user error
exits 2 with ONE line on stderr, before TVM is imported where no TVM is needed, and writes nothing."""

import os
import re
import subprocess
import sys
import textwrap
import time
import warnings
from argparse import Namespace
from types import SimpleNamespace

import pytest

import fastdlight
import fastdlight.arch
import fastdlight.export as ex
from fastdlight.arch import CUDA
from fastdlight.cli import main, preflight, toolkit
from fastdlight.cli.args import UsageError, build_parser, validate_args
from fastdlight.cli.preflight import once_resolved, select_gpu
from fastdlight.cli.workload import make_op
from fastdlight.compiler.compile import CompileError, compile_cubin, cuda_compiler, first_error_line
from fastdlight.measure.workload import param_buffers, static_shape
from fastdlight.policies.select import candidate_sets
from fastdlight.search import candidates, runner
from fastdlight.search.report import format_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TVM_LOADED = "import sys; from fastdlight.cli import main; rc = main({argv!r}); print(rc, 'tvm' in sys.modules)"


def cli_in_fresh_process(argv, env=None, timeout=120):
    """(exit status, whether TVM got imported, stderr lines, seconds) of ``main(argv)`` in a new process."""
    env = dict(os.environ if env is None else env, PYTHONPATH=ROOT)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", TVM_LOADED.format(argv=list(argv))], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=ROOT)
    rc, tvm = proc.stdout.split()[-2:]
    return int(rc), tvm == "True", proc.stderr.strip().splitlines(), time.perf_counter() - t0


def one_error_line(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("fastdlight: error:"), (rc, err)
    return err[0]


def nvcc_lacks(arch_number: int) -> bool:
    path = toolkit.nvcc_path()
    archs = toolkit.nvcc_facts(path)[1] if path else None
    return archs is not None and arch_number not in archs


# -- checks before any work: no worker pool, no TVM ------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["tune", "matmull", "1", "2", "3"], "unknown op 'matmull'"),
    (["tune", "add", "64", "--dtype", "float64"], "unsupported dtype 'float64'"),
    (["tune", "softmax", "64", "64", "--dtype", "int8"], "softmax: unsupported dtype 'int8'"),
    (["tune", "matmul", "64", "64", "64", "--out-dtype", "float8"], "unsupported --out-dtype 'float8'"),
    (["tune", "matmul", "64", "64", "64", "--layout", "XY"], "use NN, NT, TN or TT"),
    (["tune", "conv2d", "1", "2", "2", "8", "8", "--kernel", "7", "--pad", "0"], "kernel is larger than the padded"),
    (["tune", "gemv", "64", "64", "--m", "0"], "--m: must be positive"),
    (["tune", "add", "64", "--func", "f"], "--func applies to a --file function"),
    (["tune", "matmul", "1099511627776", "4096", "4096"],
     "A (1099511627776x4096 float16) is 8 PiB, more than the 80 GiB of H100 SXM5 80GB"),
    (["tune", "add", "4611686018427387904"], "is 8 EiB, more than"),
    (["tune", "add", "9223372036854775808"], "does not fit in int64"),
    (["tune", "matmul", "64", "64", "64", "--batch", str(2**63)], f"--batch: {2**63} is too large"),
    (["export", "matmull", "1", "2", "3", "--out", "/tmp/fastdlight-never-written"], "unknown op 'matmull'"),
    (["tune", "add", "64", "--devices", "0,0"], "expected distinct GPU indices"),
    (["tune", "add", "64", "--devices", "1", "--rpc", "h:9000"], "--devices and --rpc"),
])  # fmt: skip
def test_a_user_error_exits_2_before_tvm_is_imported(argv, needle):
    rc, tvm_loaded, err, seconds = cli_in_fresh_process(argv)
    assert rc == 2 and len(err) == 1 and needle in err[0], err
    assert not tvm_loaded and seconds < 20
    assert not os.path.exists("/tmp/fastdlight-never-written")


def test_sizes_are_checked_against_the_target_memory(capsys):
    # each fp32 65536² tensor is 16 GiB: one fits a T4, the three do not
    line = one_error_line(capsys, ["tune", "matmul", "65536", "65536", "65536", "--dtype", "float32",
                                   "--target", "nvidia/nvidia-t4"])
    assert "its tensors need 48 GiB together (A, B, C), more than the 16 GiB of Tesla T4" in line


def test_once_resolved_the_gpu_own_memory_is_the_bound():
    """A live GPU's memory is known only once TVM asks it: the second round of checks."""
    args = build_parser().parse_args(["tune", "add", "4096", "1048576", "--dtype", "float32"])
    small = SimpleNamespace(dram_bytes=8 * 2**30, name="an 8 GiB GPU", arch="sm_90a")
    with pytest.raises(fastdlight.cli.UsageError, match=r"A \(4096x1048576 float32\) is 16 GiB, more than the 8 GiB"):
        once_resolved(args, small, None)
    once_resolved(args, SimpleNamespace(dram_bytes=80 * 2**30, name="H100", arch="sm_90a"), None)


def test_an_export_of_impossible_sizes_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    line = one_error_line(capsys, ["export", "add", "4611686018427387904", "--out", str(out)])
    assert "8 EiB" in line and os.listdir(tmp_path) == []


def test_a_file_function_too_large_for_int32_indexing_or_memory_is_refused(tmp_path, capsys):
    kernel = tmp_path / "big.py"
    body = textwrap.dedent("""\
        from tvm.script import tirx as T

        @T.prim_func(s_tir=True)
        def big(A: T.Buffer(({n}, 65536), "float16"), B: T.Buffer(({n}, 65536), "float16")):
            for i, j in T.grid({n}, 65536):
                with T.sblock("B"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    B[vi, vj] = A[vi, vj]
        """)
    kernel.write_text(body.format(n=65536))
    line = one_error_line(capsys, ["tune", "--file", str(kernel), "--no-measure", "--serial"])
    assert "buffer A has 4294967296 elements, beyond int32 indexing" in line
    kernel.write_text(body.format(n="T.int64(1099511627776)").replace("65536)", "T.int64(65536))"))
    line = one_error_line(capsys, ["tune", "--file", str(kernel), "--no-measure", "--serial"])
    assert "A (1099511627776x65536 float16) is 128 PiB, more than the 80 GiB of H100 SXM5 80GB" in line


# -- the toolkit -----------------------------------------------------------------------------------
def test_a_missing_nvcc_is_one_line_at_once(tmp_path):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin",
               CUDA_HOME=str(tmp_path), FASTDLIGHT_CUDA_COMPILER="nvcc")
    if any(os.path.isfile(os.path.join(d, "nvcc")) for d in env["PATH"].split(os.pathsep)):
        pytest.skip("nvcc sits beside python or in /usr/bin")
    rc, tvm_loaded, err, seconds = cli_in_fresh_process(["tune", "add", "64"], env=env)
    assert rc == 2 and len(err) == 1, err
    assert "nvcc not found on PATH nor in $CUDA_HOME/bin (FASTDLIGHT_CUDA_COMPILER=nvcc)" in err[0]
    assert not tvm_loaded and seconds < 20


def test_an_arch_this_nvcc_dropped_is_refused_naming_both(capsys, monkeypatch):
    monkeypatch.setenv("FASTDLIGHT_CUDA_COMPILER", "nvcc")
    monkeypatch.setattr(toolkit, "nvcc_path", lambda: "/opt/cuda-13/bin/nvcc")
    monkeypatch.setattr(toolkit, "nvcc_facts", lambda path: ("13.0", frozenset({75, 80, 90, 100, 120})))
    line = one_error_line(capsys, ["tune", "add", "64", "--target", "nvidia/nvidia-v100"])
    assert "nvcc 13.0 (/opt/cuda-13/bin/nvcc) cannot compile for sm_70 (--target nvidia/nvidia-v100)" in line
    assert "sm_75 to sm_120" in line
    line = one_error_line(capsys, ["tune", "add", "64", "--target", "cuda -arch=sm_52"])
    assert "cannot compile for sm_52" in line


@pytest.mark.skipif(not nvcc_lacks(70), reason="this nvcc still builds sm_70")
def test_the_real_nvcc_refuses_the_v100_up_front():
    rc, tvm_loaded, err, _ = cli_in_fresh_process(["tune", "add", "64", "--target", "nvidia/nvidia-v100"])
    assert rc == 2 and len(err) == 1 and "cannot compile for sm_70" in err[0] and not tvm_loaded, err


@pytest.mark.parametrize("target", ["cuda", "cuda -max_num_threads=1024", '{"kind": "cuda"}'])
def test_a_target_that_leaves_the_arch_to_a_missing_gpu_says_so(capsys, monkeypatch, target):
    monkeypatch.setattr(preflight, "gpu_device_nodes", lambda: False)
    line = one_error_line(capsys, ["tune", "add", "64", "--target", target])
    assert "names no GPU, and there is no GPU here to read the arch from" in line


@pytest.mark.parametrize("asked", ["", "nvcc", "nvrtc", "clang"])
def test_the_compiler_is_chosen_as_the_compile_module_chooses_it(monkeypatch, asked):
    monkeypatch.setenv("FASTDLIGHT_CUDA_COMPILER", asked)

    def outcome(choose, error):
        try:
            return choose()
        except error as e:
            return str(e)

    assert outcome(toolkit.compiler_choice, fastdlight.cli.UsageError) == outcome(cuda_compiler, CompileError)


# -- reasons that survive ----------------------------------------------------------------------------
def test_nvcc_fatal_line_is_the_reason():
    log = "nvcc fatal   : Unsupported gpu architecture 'compute_70'\n"
    reason = "nvcc fatal : Unsupported gpu architecture 'compute_70'"
    assert first_error_line(f"nvcc failed for sm_70:\n{log}") == reason
    assert first_error_line("kernel.cu(3): error: identifier \"x\" is undefined") == \
        'kernel.cu(3): error: identifier "x" is undefined'


@pytest.mark.skipif(not nvcc_lacks(70), reason="this nvcc still builds sm_70")
def test_a_compile_for_a_dropped_arch_says_why_on_its_first_line():
    with pytest.raises(CompileError) as e:
        compile_cubin("__global__ void k() {}", "nvidia/nvidia-v100")
    assert str(e.value).splitlines()[0] == \
        "nvcc failed for sm_70: nvcc fatal : Unsupported gpu architecture 'compute_70'"


@pytest.mark.parametrize("body, gist", [
    ("    i = T.alloc_buffer((1,), 'int32', scope='local')\n    i[0] = 0\n    while i[0] < 8:\n"
     "        B[i[0]] = A[i[0]]\n        i[0] = i[0] + 1\n", "but got: a while loop"),
    ("    T.evaluate(T.call_extern('int32', 'my_kernel', A.data, B.data))\n", "T.call_extern('my_kernel')"),
    ("    T.evaluate(T.call_packed('my.packed', A.data, B.data))\n", "T.call_packed('my.packed')"),
])  # fmt: skip
def test_an_unschedulable_body_is_named_not_cut_at_the_colon(tmp_path, capsys, body, gist):
    kernel = tmp_path / "opaque.py"
    kernel.write_text("from tvm.script import tirx as T\n\n@T.prim_func(s_tir=True)\n"
                      "def f(A: T.Buffer((8,), 'float32'), B: T.Buffer((8,), 'float32')):\n" + body)
    line = one_error_line(capsys, ["tune", "--file", str(kernel), "--no-measure", "--serial"])
    assert "expected to be the root block" in line and gist in line and not line.endswith(":")


# -- the small ones ----------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["tune", "export", "arch"])
def test_help_says_each_default_once(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "(default: from --dtype) (default" not in text and "nvidia/nvidia-h100) (default" not in text
    if command != "arch":
        assert "matmul layout: NN, NT, TN, TT" in text and "default NN, NT for float8 inputs)" in text


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith(f"fastdlight {fastdlight.__version__} (")


def test_arch_does_not_say_tuning(capsys, monkeypatch):
    monkeypatch.setattr(fastdlight.arch, "has_gpu", lambda: False)
    assert main(["arch"]) == 0
    out = capsys.readouterr().out
    assert "tuning" not in out and out.startswith("No GPU was found: the nvidia/nvidia-h100 hardware model.")
    assert "DRAM 80 GiB" in out


def test_fp16_on_a_t4_says_why_it_runs_on_cuda_cores(capsys, monkeypatch):
    """Tuning is stopped after the sets are announced: no candidate is built."""
    def announce_only(func, arch, topk, opts, opt_shapes=None, on_set=None):
        for cset in candidate_sets(func, arch, topk):
            on_set(cset)
        raise runner.TuningError("stopped after the announcement")

    monkeypatch.setattr(candidates, "tune_function", announce_only)
    argv = ["tune", "matmul", "256", "256", "256", "--target", "nvidia/nvidia-t4", "--no-measure", "--serial"]
    assert main(argv) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("DefaultPolicy:"))
    assert "(CUDA cores, no tensor cores: compute capability (7, 5) < 8.0: no m16n8k16 mma.sync)" in line


def test_the_cost_column_says_its_unit():
    assert "pred. cost (policy units)" in format_table([]).splitlines()[0]


def test_a_large_export_says_its_size_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ex, "LARGE_DATA_BYTES", 1000)
    out = tmp_path / "add"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["export", "add", "256", "256", "--out", str(out), "--no-measure", "--serial", "--topk", "1",
                     "--target", "nvidia/nvidia-h100"]) == 0
    size = os.path.getsize(out / "add_data.bin")
    [message] = [str(w.message) for w in caught]
    assert f"add_data.bin is {size / 2**20:.3g} MiB" in message and "smaller shape" in message
    assert "\n" not in message  # the command prints a warning's message alone: one line


def test_a_library_warning_points_at_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CUDA("cuda -arch=sm_86")  # no table row: a warning about generic numbers
    assert [w.filename for w in caught] == [__file__]


# -- the CLI's tensor model is fastdlight.ops' -------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["matmul", "64", "32", "16"], ["matmul", "64", "32", "16", "--layout", "tt", "--batch", "3"],
    ["matmul", "64", "32", "16", "--dtype", "int8"], ["matmul", "64", "32", "16", "--out-dtype", "float32"],
    ["gemv", "64", "32", "--m", "4"], ["add", "8", "4", "2"], ["copy", "100"], ["bias_relu", "6", "10"],
    ["sum", "12", "34"], ["max", "12", "34", "--axis", "0"], ["softmax", "16", "32", "--dtype", "bfloat16"],
    ["conv2d", "2", "9", "9", "8", "16"], ["conv2d", "2", "9", "9", "8", "16", "--dtype", "float32", "--stride", "2"],
    ["conv2d", "1", "8", "8", "4", "4", "--kernel", "1", "--pad", "0", "--dtype", "float16", "--out-dtype", "float32"],
    ["attention", "2", "8", "16", "16", "64"], ["attention", "1", "8", "4", "32", "64", "--causal", "--kv-heads", "2"],
    ["attention", "1", "4", "1", "100", "128", "--kv-heads", "1", "--dtype", "bfloat16"],
    ["matmul", "4", "32", "256", "--weight-dtype", "int4", "--group-size", "64"],
    ["matmul", "64", "32", "256", "--dtype", "float8_e5m2"],
    ["matmul", "64", "32", "256", "--dtype", "float8_e4m3fn", "--scales", "row", "--out-dtype", "bfloat16"],
    ["matmul", "64", "32", "256", "--dtype", "float8_e4m3fn", "--scales", "tensor"],
    ["matmul", "1", "32", "256", "--weight-dtype", "int4", "--zero-point", "--dtype", "bfloat16"],
])  # fmt: skip
def test_the_size_checks_see_the_tensors_ops_builds(argv):
    args = build_parser().parse_args(["tune", *argv])
    built = [(static_shape(b), str(b.dtype)) for b in param_buffers(make_op(args).func)]
    assert [(t.shape, t.dtype) for t in validate_args(args)] == built


@pytest.mark.parametrize("op", ["matmul", "gemv", "add", "sum", "softmax", "conv2d", "attention"])
def test_the_dtypes_refused_early_are_those_ops_refuses(op):
    shape = {"matmul": ["16"] * 3, "add": ["8"], "conv2d": ["1", "4", "4", "4", "4"],
             "attention": ["1", "2", "4", "4", "8"]}.get(op, ["16", "16"])
    for dtype in ("float16", "bfloat16", "float32", "int8", "int32", "float64"):
        args = build_parser().parse_args(["tune", op, *shape, "--dtype", dtype])
        try:
            validate_args(args)
            early = True
        except UsageError:
            early = False
        try:
            make_op(args)
            built = True
        except UsageError:
            built = False
        assert early == built, (op, dtype)


@pytest.mark.parametrize("argv, says", [
    (["attention", "1", "8", "16", "16", "64", "--kv-heads", "3"], "--kv-heads 3 must divide H (8)"),
    (["attention", "1", "8", "32", "16", "64", "--causal"], "--causal needs TQ <= TKV (got 32 > 16)"),
    (["softmax", "16", "16", "--causal"], "--causal applies to attention, not softmax"),
    (["matmul", "16", "16", "16", "--kv-heads", "2"], "--kv-heads applies to attention, not matmul"),
    (["attention", "1", "8", "16", "16"], "attention"),
])  # fmt: skip
def test_bad_attention_arguments_are_refused_in_one_line(argv, says):
    with pytest.raises(UsageError, match=re.escape(says)) as caught:
        validate_args(build_parser().parse_args(["tune", *argv]))
    assert "\n" not in str(caught.value)


def test_devices_become_this_process_s_gpus_in_their_order(monkeypatch):
    """--devices are the process's GPUs 0, 1, ..., counted within a CUDA_VISIBLE_DEVICES the
    user set."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert select_gpu((1, 0), Namespace(rpc=None)) == (0, 1)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert select_gpu((1,), Namespace(rpc=None)) == (0,)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")
    with pytest.raises(UsageError, match=r"--devices 2,3: CUDA_VISIBLE_DEVICES=4 makes 1 GPU"):
        select_gpu((0, 2, 3), Namespace(rpc=None))

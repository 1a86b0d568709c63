"""``fastdlight.export`` / ``fastdlight export``: a tuned kernel as a CUDA header, an example host
program and its data. CPU tests read the launch geometry back from the header (against the
config and the source's ``__launch_bounds__``), check the stored expected values against numpy
and build each example with nvcc (skipped without nvcc); the ``gpu`` tests run the examples."""

import json
import math
import os
import re
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import fastdlight
import fastdlight.export as ex
from fastdlight import ops
from fastdlight.arch import CUDA, auto_arch
from fastdlight.cli import main
from fastdlight.compiler import build_task
from fastdlight.compiler.compile import build
from fastdlight.config import Config
from fastdlight.export import DATA_MAGIC, ExportError, export
from fastdlight.measure.timing import function_name, time_module
from fastdlight.measure.workload import Workload
from fastdlight.policies.default import DefaultPolicy
from fastdlight.search.database import TuningDatabase

H100, A100 = "nvidia/nvidia-h100", "nvidia/nvidia-a100"
LAUNCH = re.compile(r"cudaLaunchKernel\(\(const void\*\)(\w+), dim3\((\d+), (\d+), (\d+)\), "
                    r"dim3\((\d+), (\d+), (\d+)\), fdl_args, (\d+), stream\)")


def launches(header: str) -> list[tuple[str, tuple, tuple, int]]:
    """(kernel, grid, block, dynamic smem) of every launch the header's launch function makes."""
    return [(m[1], tuple(map(int, m.groups()[1:4])), tuple(map(int, m.groups()[4:7])), int(m[8]))
            for m in LAUNCH.finditer(header)]


def launch_bounds(header: str, kernel: str) -> int:
    return int(re.search(r"__launch_bounds__\((\d+)\)\s+" + kernel + r"\(", header)[1])


def read_data(out_dir, name: str) -> tuple[list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """(inputs, [(expected, allowed)] per output) from NAME_data.bin, by the manifest's params."""
    manifest = json.loads((out_dir / f"{name}.json").read_text())
    raw = (out_dir / f"{name}_data.bin").read_bytes()
    assert raw[:8] == DATA_MAGIC
    pos, inputs, outputs = 8, [], []

    def take(dtype, shape):
        nonlocal pos
        n = math.prod(shape)
        arr = np.frombuffer(raw, dtype, n, pos).reshape(shape)
        pos += -(-n * np.dtype(dtype).itemsize // 8) * 8
        return arr

    for p in manifest["params"]:
        if not p["output"]:
            inputs.append(take(p["dtype"], p["shape"]))
    for p in manifest["params"]:
        if p["output"]:
            outputs.append((take("float32", p["shape"]), take("float32", p["shape"])))
    assert pos == len(raw)
    return inputs, outputs


def build_example(out_dir, name: str) -> str:
    """Run the export's own nvcc command; the path of the executable."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    command = json.loads((out_dir / f"{name}.json").read_text())["build_command"]
    proc = subprocess.run(command, shell=True, cwd=out_dir, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exe = out_dir / f"{name}_example"
    assert exe.is_file() and os.access(exe, os.X_OK)
    return str(exe)


def test_elementwise_from_a_tuned_result(tmp_path):
    op = ops.elementwise((128, 1024), "float16", "add")
    _, best = fastdlight.tune(op.func, H100, topk=1, measure=False)
    out = tmp_path / "add"
    result = export(best, out, ref=op.reference)
    header = (out / "add.cuh").read_text()
    assert "__global__" in header and "add_kernel" in header
    assert "static inline cudaError_t add_launch(const half* A, const half* B, half* C, cudaStream_t stream)" in header
    [(kernel, grid, block, smem)] = launches(header)
    cfg = best.config
    assert kernel == "add_kernel" and smem == 0 and result.launches[0].grid == grid
    assert math.prod(grid) * math.prod(cfg.block) == 128 * 1024  # elements per block, from the config
    assert math.prod(block) == launch_bounds(header, kernel) == math.prod(cfg.block) // math.prod(cfg.thread)
    (a, b), [(want, allowed)] = read_data(out, "add")
    ref = a.astype(np.float64) + b.astype(np.float64)
    assert np.all(np.abs(want - ref) <= 1e-7 * np.abs(ref) + 1e-30) and np.all(allowed > 0)
    assert "nvcc" in (out / "README.md").read_text() and "add_example:" in (out / "Makefile").read_text()
    build_example(out, "add")


def test_softmax_through_the_cli(tmp_path, capsys):
    out = tmp_path / "sm"
    argv = ["export", "softmax", "64", "1024", "--out", str(out), "--topk", "1", "--no-measure", "--target", H100]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Exported Config[" in text and "Build and run: cd" in text
    header = (out / "softmax.cuh").read_text()
    manifest = json.loads((out / "softmax.json").read_text())
    [(kernel, grid, block, _)] = launches(header)
    config = manifest["config"]
    assert math.prod(grid) * math.prod(config["block"]) == 64  # output rows per block
    assert math.prod(block) == launch_bounds(header, kernel)
    assert manifest["launches"] == [{"kernel": kernel, "grid": list(grid), "block": list(block), "dynamic_smem": 0,
                                     "cluster": [1, 1, 1]}]
    [x], [(want, _)] = read_data(out, "softmax")
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(want, e / e.sum(axis=1, keepdims=True), rtol=1e-6)
    build_example(out, "softmax")


def test_tensor_core_matmul(tmp_path):
    """fp16 in, fp32 accumulation (mma.sync at sm_80), dynamic shared memory."""
    op = ops.matmul(256, 256, 256, "float16", "float16", "NN", acc_dtype="float32")
    out = tmp_path / "mm"
    result = export(op.func, out, name="mm", target=A100, topk=2, measure=False, ref=op.reference)
    header = (out / "mm.cuh").read_text()
    assert "mma.sync" in header and "ldmatrix" in header
    cfg = result.config
    assert cfg.kind == "matmul_tc"
    [(kernel, grid, block, smem)] = launches(header)
    bm, bn = cfg.block
    wm, wn = cfg.warp
    assert math.prod(grid) == (256 // bm) * (256 // bn)
    assert math.prod(block) == launch_bounds(header, kernel) == 32 * (bm // wm) * (bn // wn)
    assert smem > 0 and ("cudaFuncSetAttribute" in header) == (smem > 48 * 1024)
    (a, b), [(want, allowed)] = read_data(out, "mm")
    np.testing.assert_allclose(want, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-6, atol=1e-6)
    assert np.all(allowed > 0)
    assert "compute_80,code=sm_80" in result.build_command
    build_example(out, "mm")


def export_wgmma(out_dir, name: str, m: int, n: int, cluster: int = 1) -> str:
    """Export an fp16 NT GEMM ``m x n x 256`` under a 128 x 128 wgmma config; its header."""
    op = ops.matmul(m, n, 256, "float16", "float16", "NT", acc_dtype="float32")
    cfg = Config("matmul_wgmma", block=(128, 128), warp=(64, 128), rstep=(64,), pipeline_stages=4,
                 use_async_copy=True, rasterization=8, cluster=cluster)
    export(op.func, out_dir / name, name=name, target=H100, config=cfg, ref=op.reference)
    return (out_dir / name / f"{name}.cuh").read_text()


def test_hopper_tma_kernel(tmp_path):
    """The wgmma template's TMA descriptors are encoded in the launcher (driver entry point)."""
    header = export_wgmma(tmp_path, "tma", 256, 512)
    assert header.count("if (fdl_encode(&") == 3 and '"cuTensorMapEncodeTiled"' in header
    [(kernel, grid, block, smem)] = launches(header)
    assert block == (384, 1, 1) and smem > 48 * 1024 and "cudaFuncSetAttribute" in header
    assert 1 <= math.prod(grid) <= (256 // 128) * (512 // 128)
    build_example(tmp_path / "tma", "tma")


def test_a_kernel_storing_output_rows_tma_cannot_address(tmp_path):
    """N = 1001: two TMA descriptors (A and B) in the launcher, the output passed as a pointer."""
    header = export_wgmma(tmp_path, "rows", 256, 1001)
    assert header.count("if (fdl_encode(&") == 2
    build_example(tmp_path / "rows", "rows")


def test_a_cluster_kernel_launches_with_its_cluster_dimension(tmp_path):
    """A 2-CTA cluster config (the tuner picks them for large GEMMs) is launched through
    ``cudaLaunchKernelExC`` with the cluster attribute, and the example builds."""
    header = export_wgmma(tmp_path, "cl", 512, 512, cluster=2)
    assert "cudaLaunchKernelExC(&fdl_config" in header and "cudaLaunchAttributeClusterDimension" in header
    dims = re.findall(r"fdl_cluster\[0\]\.val\.clusterDim\.([xyz]) = (\d+);", header)
    assert not launches(header)  # no plain launch left
    [launch] = json.loads((tmp_path / "cl" / "cl.json").read_text())["launches"]
    assert launch["cluster"] == [2, 1, 1] and launch["grid"][0] % 2 == 0
    assert dims == [("x", "2"), ("y", "1"), ("z", "1")]
    build_example(tmp_path / "cl", "cl")


@T.prim_func(s_tir=True)
def rowscale(A: T.Buffer((128, 256), "float32"), s: T.Buffer((128,), "float32"), B: T.Buffer((128, 256), "float32")):
    for i, j in T.grid(128, 256):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] * s[vi] + T.float32(1)


def rowscale_config():
    return DefaultPolicy(rowscale, CUDA(H100)).emit_config(1)[0]


def test_without_a_numpy_reference_the_function_runs_on_the_cpu(tmp_path):
    result = export(rowscale, tmp_path / "rs", target=H100, config=rowscale_config())
    assert result.name == "rowscale" and "CPU" in result.reference and result.latency_ms is None
    (a, s), [(want, _)] = read_data(tmp_path / "rs", "rowscale")
    np.testing.assert_allclose(want, a.astype(np.float64) * s[:, None] + 1, rtol=1e-7)


def test_nothing_half_written(tmp_path, monkeypatch):
    out = tmp_path / "never"

    def broken_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ex.os, "rename", broken_rename)
    with pytest.raises(OSError):
        export(rowscale, out, target=H100, config=rowscale_config())
    assert os.listdir(tmp_path) == []  # neither the directory nor its temporary twin
    monkeypatch.undo()
    with pytest.raises(ExportError, match="cannot export a str"):
        export("rowscale", out, target=H100)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty"):
        export(rowscale, tmp_path / "full", target=H100, config=rowscale_config())
    export(rowscale, tmp_path / "full", target=H100, config=rowscale_config(), force=True)
    assert not (tmp_path / "full" / "keep.txt").exists() and (tmp_path / "full" / "rowscale.cuh").exists()
    assert sorted(os.listdir(tmp_path)) == ["full"]


@pytest.mark.parametrize("argv, needle", [
    (["export", "softmax", "64", "64"], "required: --out"),
    (["export", "conv3d", "1", "--out", "{tmp}/x"], "unknown op 'conv3d'"),
    (["export", "softmax", "64", "--out", "{tmp}/x"], "expected softmax R C"),
    (["export", "add", "64", "--out", "{tmp}/no/such/x"], "no such directory"),
    (["export", "add", "64", "--out", "{tmp}/file"], "it is a file"),
    (["export", "add", "64", "--out", "{tmp}/full"], "is not empty"),
    (["export", "add", "64", "--out", "{tmp}/x", "--name", "9lives"], "bad --name"),
    (["export", "--file", "/no/such/kernel.py", "--out", "{tmp}/x"], "no such file"),
])  # fmt: skip
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, argv, needle):
    (tmp_path / "file").write_text("a file")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    before = sorted(os.listdir(tmp_path))
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastdlight: error:") and needle in err[0], err
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "full" / "keep.txt").read_text() == "mine"


# -- on a GPU ---------------------------------------------------------------------------------
GPU_CASES = {
    "add_f16_4096x8192": lambda: ops.elementwise((4096, 8192), "float16", "add"),
    "softmax_f16_4096x4096": lambda: ops.softmax(4096, 4096, "float16"),
    "matmul_f16_4096_f32acc": lambda: ops.matmul(4096, 4096, 4096, "float16", "float16", "NN", acc_dtype="float32"),
}


def run_example(exe: str, out_dir) -> tuple[str, float]:
    proc = subprocess.run([exe], cwd=out_dir, capture_output=True, text=True, timeout=300)
    print(proc.stdout.strip())
    assert proc.returncode == 0 and proc.stdout.strip().endswith("PASS"), proc.stdout + proc.stderr
    return proc.stdout, float(re.search(r"time: median ([\d.]+) ms", proc.stdout)[1])


@pytest.mark.gpu
def test_example_runs_and_passes_on_the_gpu(tmp_path):
    op = ops.softmax(256, 1024, "float16")
    result = export(op.func, tmp_path / "sm", topk=4, ref=op.reference)
    run_example(build_example(tmp_path / "sm", result.name), tmp_path / "sm")


@pytest.mark.gpu
def test_a_cluster_example_runs_and_passes_on_the_gpu(tmp_path):
    op = ops.matmul(1000, 520, 264, "float16", "float16", "NT", acc_dtype="float32")  # edges in M, N, K
    cfg = Config("matmul_wgmma", block=(128, 128), warp=(64, 128), rstep=(64,), pipeline_stages=4,
                 use_async_copy=True, rasterization=8, cluster=2)
    export(op.func, tmp_path / "cl", name="cl", config=cfg, ref=op.reference)
    run_example(build_example(tmp_path / "cl", "cl"), tmp_path / "cl")


def tvm_timer(func, config):
    """A function timing the same config built through TVM (``fastdlight.measure.timing``: inputs
    rotated, queued launches between CUDA events, median), ms."""
    arch = auto_arch()
    with arch.target:
        mod = build_task.as_module(build_task.apply_template(func, config))
    built = build(mod, arch.target)
    lib = getattr(built, "mod", built)
    wl = Workload(func, tvm.cuda(0), 0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    return lambda: time_module(lib, function_name(lib, func), arg_sets, tvm.cuda(0), budget_ms=100).median_ms


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_exported_kernel_times_like_the_tuner(tmp_path, case):
    """Tuned on the live GPU; the example's median (C++, CUDA events) against the same kernel
    timed through TVM just before and just after it, and against the tuner's own measurement."""
    op = GPU_CASES[case]()
    result = export(op.func, tmp_path / case, name=case, topk=4, ref=op.reference)
    exe = build_example(tmp_path / case, case)
    timer = tvm_timer(op.func, result.config)
    before = timer()
    stdout, exported_ms = run_example(exe, tmp_path / case)
    after = timer()
    tvm_ms = (before + after) / 2
    err = re.search(r"max \|error\| (\S+)", stdout)[1]
    ratio = exported_ms / tvm_ms
    print(f"EXPORT {case}: {result.config!r} launches {[ln.to_dict() for ln in result.launches]}\n"
          f"EXPORT {case}: TVM {before:.4f} ms before / {after:.4f} ms after, exported {exported_ms:.4f} ms, "
          f"ratio {ratio:.3f} (tuner's own measurement {result.latency_ms:.4f} ms), max |error| {err}")
    assert 0.8 < ratio < 1.25


def test_a_database_hit_exports_its_stored_config(tmp_path):
    op = ops.elementwise((128, 1024), "float16", "add")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU: compiled, not timed
        _, tuned = fastdlight.tune(op.func, H100, topk=2, measure=False, max_workers=2)
    TuningDatabase(tmp_path / "db").commit(op.func, CUDA(H100), tuned.config, 0.0123, True, reference="test")
    _, hit = fastdlight.tune(op.func, H100, database=tmp_path / "db", measure=False)
    assert hit.origin == "database"
    for given in (hit, op.func):  # the replayed row, or the function with the database
        out = tmp_path / f"from_{type(given).__name__}"
        result = export(given, out, ref=op.reference, database=tmp_path / "db", measure=False)
        assert result.config == tuned.config and result.latency_ms == 0.0123
        assert "__global__" in (out / "add.cuh").read_text()

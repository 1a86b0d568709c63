"""The tuning database: verified records only, keyed by function, target, TVM version and
template code; bad lines skipped with one warning; concurrent writers lose nothing (CPU)."""

import json
import subprocess
import sys
import textwrap
import warnings

import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.compiler import build_task
from fastdlight.config import Config
from fastdlight.schedules import apply_config, dispatch
from fastdlight.schedules.wgmma.template import WgmmaMatmulTemplate
from fastdlight.search import candidates, database
from fastdlight.search.database import TuningDatabase
from fastdlight.search.options import TuneOptions

H100, A100 = CUDA("nvidia/nvidia-h100"), CUDA("nvidia/nvidia-a100")
CFG = Config("elementwise", (1, 128), (1, 1))


@pytest.fixture(scope="module")
def func():
    return ops.elementwise((64, 64), "float16", "add").func


def test_round_trip_and_newest_wins(tmp_path, func):
    db = TuningDatabase(tmp_path)
    db.commit(func, H100, CFG, 0.02, True, reference="float64 numpy reference")
    newer = Config("elementwise", (1, 256), (1, 1))
    db.commit(func, H100, newer, 0.01, True, reference="naive")
    hit = TuningDatabase(tmp_path).lookup(func, H100)  # a fresh reader of the same file
    assert hit.config == newer and hit.verified is True and hit.reference == "naive"
    assert TuningDatabase(tmp_path).lookup(func, A100) is None
    other = ops.elementwise((64, 64), "float16", "copy").func
    assert db.lookup(other, H100) is None


@pytest.mark.parametrize("verified", [None, False])
def test_an_unverified_winner_is_refused(tmp_path, func, verified):
    db = TuningDatabase(tmp_path)
    with pytest.raises(ValueError, match="not verified"):
        db.commit(func, H100, CFG, 0.01, verified)
    assert len(db) == 0 and db.lookup(func, H100) is None


def test_a_bad_line_is_skipped_with_one_warning_naming_it(tmp_path, func):
    db = TuningDatabase(tmp_path)
    db.commit(func, H100, CFG, 0.02, True)
    with open(db.file, "a") as f:
        f.write('{"key": "torn", "arch": \n')
        f.write("garbage\n")
    db.commit(func, H100, CFG, 0.01, True)
    reader = TuningDatabase(tmp_path)
    with pytest.warns(UserWarning, match=r"fastdlight_records.jsonl:2: not a tuning record, skipped \(and 1 more"):
        assert reader.lookup(func, H100).latency_ms == 0.01
    assert reader.stats.skipped_lines == 2 and reader.stats.records == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read once: no second warning
        assert reader.lookup(func, H100) is not None


def test_records_of_another_tvm_target_or_template_are_ignored_and_counted(tmp_path, func, monkeypatch):
    db = TuningDatabase(tmp_path)
    db.commit(func, H100, CFG, 0.02, True)
    row = json.loads(open(db.file).read())
    with open(db.file, "a") as f:
        f.write(json.dumps(dict(row, tvm="0.0.1", latency_ms=0.001)) + "\n")
    db.commit(func, A100, CFG, 0.03, True)
    reader = TuningDatabase(tmp_path)
    assert reader.lookup(func, H100).latency_ms == 0.02  # not the other TVM's faster record
    assert reader.stats.other_version == 1 and reader.stats.other_target == 1
    # a changed template hides every record it made
    monkeypatch.setattr(database, "template_fingerprint", lambda kind: "changed")
    stale = TuningDatabase(tmp_path)
    assert stale.lookup(func, H100) is None and len(stale) == 0
    assert stale.stats.stale_template == 2


WRITER = textwrap.dedent("""
    import sys
    from fastdlight import ops
    from fastdlight.arch import CUDA
    from fastdlight.config import Config
    from fastdlight.search.database import TuningDatabase
    func = ops.elementwise((64, 64), "float16", "add").func
    db, arch = TuningDatabase(sys.argv[1]), CUDA("nvidia/nvidia-h100")
    for i in range(int(sys.argv[3])):
        db.commit(func, arch, Config("elementwise", (1, 128), (1, 1)), float(sys.argv[2]) + i, True)
""")


def test_two_writer_processes_at_once_lose_nothing(tmp_path):
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(base), str(n)])
             for base in (0, 10000)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    lines = open(tmp_path / database.FILE_NAME).read().splitlines()
    assert len(lines) == 2 * n
    latencies = sorted(json.loads(line)["latency_ms"] for line in lines)  # every line parses
    assert latencies == sorted([float(i) for i in range(n)] + [10000.0 + i for i in range(n)])
    assert len(TuningDatabase(tmp_path)) == 2 * n


def test_an_unusable_directory_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="cannot use .* as a tuning database"):
        TuningDatabase(blocker / "db")


def test_a_wgmma_record_replays_as_the_same_kernel_and_its_kernel_text_is_in_the_fingerprint(tmp_path, monkeypatch):
    """TIRx kernels have no schedule trace: the record holds the config, from which the kernel
    can be regenerated; editing the kernel text (not a Python module) retires the record."""
    gemm = ops.matmul(512, 512, 512, "float16", "float16", "NN", acc_dtype="float32").func
    config = Config("matmul_wgmma", block=(128, 256), warp=(64, 256), rstep=(64,), pipeline_stages=4,
                    use_async_copy=True, rasterization=1)
    TuningDatabase(tmp_path).commit(gemm, H100, config, 0.01, True)
    hit = TuningDatabase(tmp_path).lookup(gemm, H100)
    assert hit.config == config
    with H100.target:
        assert tvm_ffi.structural_equal(apply_config(gemm, hit.config), apply_config(gemm, config))

    before = dispatch.template_fingerprint("matmul_wgmma")
    edited = tmp_path / "kernel.tvmscript"
    edited.write_text(WgmmaMatmulTemplate.sources[0].read_text() + "\n# edited\n")
    monkeypatch.setattr(WgmmaMatmulTemplate, "sources", (edited,))
    dispatch.template_fingerprint.cache_clear()
    try:
        assert dispatch.template_fingerprint("matmul_wgmma") != before
        assert TuningDatabase(tmp_path).lookup(gemm, H100) is None
    finally:
        dispatch.template_fingerprint.cache_clear()


def test_metaschedule_reads_the_records_and_applies_the_same_schedules(tmp_path):
    """TVM's own JSONDatabase opens the view written beside our records, and
    MetaScheduleApplyDatabase schedules the function exactly as our template does."""
    func = ops.softmax(256, 1024).func
    config = Config("general_reduction", (1,), (1,), rstep=(256,), reduce_thread=(128,))
    TuningDatabase(tmp_path).commit(func, H100, config, 0.02, True)
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(database) == 1
    with database, H100.target:
        applied = relax.transform.MetaScheduleApplyDatabase()(tvm.IRModule({"softmax": func}))["softmax"]
    with H100.target:
        ours = apply_config(func, config).mod["main"]
    assert applied.attrs["tirx.is_scheduled"]
    assert tvm_ffi.structural_equal(applied.without_attr("tirx.is_scheduled"), ours.with_attrs(dict(applied.attrs)).without_attr("tirx.is_scheduled"))


def test_a_kernel_without_a_trace_stays_out_of_the_view(tmp_path):
    gemm = ops.matmul(512, 512, 512, "float16", "float16", "NN", acc_dtype="float32").func
    wgmma = Config("matmul_wgmma", block=(128, 256), warp=(64, 256), rstep=(64,), pipeline_stages=4,
                   use_async_copy=True, rasterization=1)
    db = TuningDatabase(tmp_path)
    db.commit(gemm, H100, wgmma, 0.01, True)
    assert db.lookup(gemm, H100).config == wgmma  # our records keep it
    assert not db.meta_schedule.add(gemm, H100, wgmma, 0.01)


def test_a_stored_wgmma_kernel_is_replayed_without_parsing_the_template_again(tmp_path, monkeypatch):
    """A wgmma winner's kernel is stored with its record, compressed; a hit hands it back and
    the template is not applied again."""
    gemm = ops.matmul(512, 512, 512, "float16", "float16", "NN", acc_dtype="float32").func
    config = Config("matmul_wgmma", block=(128, 256), warp=(64, 256), rstep=(64,), pipeline_stages=4,
                    use_async_copy=True, rasterization=1)
    with H100.target:
        kernel = apply_config(gemm, config)
    TuningDatabase(tmp_path).commit(gemm, H100, config, 0.01, True, kernel=kernel)

    def never(*args, **kwargs):
        raise AssertionError("the template was applied again")

    monkeypatch.setattr(build_task, "apply_template", never)
    tuned = candidates.tune_function(gemm, H100, 4, TuneOptions(measure=False), db=TuningDatabase(tmp_path))
    assert tuned.source == "database" and tuned.config == config
    assert tvm_ffi.structural_equal(tuned.kernel, kernel)
    assert len((tmp_path / "fastdlight_records.jsonl").read_bytes()) < 100_000  # compressed

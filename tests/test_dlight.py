"""``fastdlight.dlight`` stands in for ``tvm.s_tir.dlight``: the same rules and pass, plus
ApplyFastTuning, in one pipeline where Dlight schedules only what tuning left."""

import subprocess
import sys
import warnings

import pytest
import tvm
from tvm.s_tir import dlight as tvm_dl
from tvm.script import tirx as T

import fastdlight.dlight as dl
from fastdlight.arch import CUDA
from fastdlight.relax import ApplyFastTuning


def test_every_dlight_name_is_the_same_object():
    names = [n for n in dir(tvm_dl) if not n.startswith("_")]
    assert {"ApplyDefaultSchedule", "gpu"} <= set(names)
    for name in names:
        assert getattr(dl, name) is getattr(tvm_dl, name), name
    assert dl.gpu.Matmul is tvm_dl.gpu.Matmul
    assert dl.ApplyFastTuning is ApplyFastTuning and "ApplyFastTuning" in dl.__all__


IMPORT_FORMS = [
    "import fastdlight.dlight as dl",
    "from fastdlight.dlight.gpu import Matmul",
    "from fastdlight.dlight import gpu",
    "import fastdlight.dlight.gpu.matmul",
]


@pytest.mark.parametrize("first", IMPORT_FORMS)
def test_every_import_form_gives_tvms_own_objects(first):
    # in a fresh process, so that the form under test is the first import of fastdlight.dlight
    code = f"""{first}
import tvm.s_tir.dlight as tvm_dl
import fastdlight.dlight as dl
from fastdlight.dlight.gpu import Matmul
import fastdlight.dlight.gpu.matmul as matmul_module
assert dl.gpu is tvm_dl.gpu and dl.gpu.Matmul is tvm_dl.gpu.Matmul is Matmul
assert matmul_module is tvm_dl.gpu.matmul
assert isinstance(dl.gpu.Matmul(), tvm_dl.ScheduleRule)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@T.prim_func(private=True, s_tir=True)
def scale(a: T.Buffer((1024, 256), "float32"), b: T.Buffer((1024, 256), "float32")):
    for i, j in T.grid(1024, 256):
        with T.sblock("b"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = a[vi, vj] * T.float32(2)


@T.prim_func(private=True, s_tir=True)
def row_sum(a: T.Buffer((1024, 256), "float32"), b: T.Buffer((1024,), "float32")):
    for i, k in T.grid(1024, 256):
        with T.sblock("b"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                b[vi] = T.float32(0)
            b[vi] = b[vi] + a[vi, vk]


def test_the_seed_pipeline_line_runs_as_written(tmp_path):
    """The seed's usage, then Dlight's rules for the rest: tuned functions stay as tuned."""
    mod = tvm.IRModule({"scale": scale, "row_sum": row_sum})
    target = CUDA("nvidia/nvidia-h100")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU: compile-only
        tuned = dl.ApplyFastTuning(topk=2, target=target, parallel_build=True, meta_database_dir=str(tmp_path),
                                   measure=False)(mod)
    assert all(f.attrs["tirx.is_scheduled"] for _, f in tuned.functions_items())
    with target.target:
        after = dl.ApplyDefaultSchedule(dl.gpu.Reduction(), dl.gpu.Fallback())(tuned)
    tvm.ir.assert_structural_equal(after, tuned)  # Dlight leaves the tuned functions alone
    with target.target:
        stock = dl.ApplyDefaultSchedule(dl.gpu.Reduction(), dl.gpu.Fallback())(mod)
    assert "threadIdx" in stock["row_sum"].script()  # and schedules what was not tuned


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError):
        dl.NoSuchRule  # noqa: B018

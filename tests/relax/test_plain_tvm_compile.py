"""A tuned module builds with a plain ``tvm.compile`` (what Dlight users call), not only with
``fastdlight.build``: a symbolic matmul (a dispatcher of pre-lowered branches) and a static
Hopper wgmma matmul (a TIRx kernel), compiled for the H100 on the CPU."""

import re
import warnings

import pytest
import tvm
import tvm_ffi
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.s_tir import dlight as dl
from tvm.tirx import compilation_pipeline as cp

import fastdlight
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import PASS_CONFIG, PASS_CONFIG_ATTR, compile_cubin, cuda_source
from fastdlight.relax.pipeline import prepare, prim_funcs

H100 = CUDA("nvidia/nvidia-h100")
TARGET = "nvidia/nvidia-h100"


@I.ir_module
class Symbolic:
    @R.function
    def main(x: R.Tensor(("m", 4096), "float16"), w: R.Tensor((4096, 4096), "float16")):
        with R.dataflow():
            y = R.matmul(x, w)
            R.output(y)
        return y


@I.ir_module
class Static:
    @R.function
    def main(x: R.Tensor((2048, 2048), "float16"), w: R.Tensor((2048, 2048), "float16")):
        with R.dataflow():
            y = R.matmul(x, w)
            R.output(y)
        return y


def tuned(mod, **kwargs):
    tuning = fastdlight.ApplyFastTuning(topk=2, target=TARGET, measure=False, max_workers=2, progress=False,
                                        **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tuning(prepare(H100.target)(mod))
    assert [e.status for e in tuning.report] == ["tuned"], tuning.report
    return out, tuning.report[0]


def kernels(src: str) -> str:
    return re.sub(r"\b\w+_kernel\b", "kernel", src)


@pytest.fixture(scope="module")
def symbolic():
    return tuned(Symbolic, opt_shapes={"m": [16, 256]})


@pytest.fixture(scope="module")
def static():
    return tuned(Static)


def test_tuned_functions_carry_the_pass_config_their_kernels_need(symbolic, static):
    for mod, _ in (symbolic, static):
        for func in prim_funcs(mod).values():
            assert dict(func.attrs[PASS_CONFIG_ATTR]) == PASS_CONFIG


def test_a_symbolic_matmul_builds_with_plain_tvm_compile(symbolic):
    mod, report = symbolic
    assert "matmul_wgmma" in report.dispatch and "matmul_tc" in report.dispatch  # both kinds of kernel
    src = cuda_source(tvm.compile(mod, target=TARGET))  # the default Relax and TIR pipelines
    assert "wgmma.mma_async" in src and "mma.sync" in src
    assert compile_cubin(src, H100.target).binary


def test_a_static_wgmma_matmul_builds_with_plain_tvm_compile(static):
    mod, report = static
    assert report.config.kind == "matmul_wgmma"
    src = cuda_source(tvm.compile(mod, target=TARGET))
    assert "wgmma.mma_async" in src
    # the kernel fastdlight.build makes (tvm.compile names it after the function, not the template)
    assert kernels(src) == kernels(cuda_source(fastdlight.build(mod, H100.target)))


def test_a_module_without_tuned_functions_is_lowered_as_tvm_lowers_it(symbolic):
    """The routed default pipeline hands other modules to TVM's s_tir pipeline unchanged."""
    untuned = prepare(H100.target)(Static)
    with H100.target:
        scheduled = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.Fallback())(untuned)
    routed = cp.get_tir_pipeline("s_tir")[0]
    stock = cp.PIPELINE_MAP["s_tir"].fastdlight_stock()[0]
    funcs = tvm.IRModule({gv: f for gv, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)})
    with H100.target:
        bound = tvm.tirx.transform.BindTarget(H100.target)(funcs)
        assert tvm_ffi.structural_equal(routed(bound), stock(bound))

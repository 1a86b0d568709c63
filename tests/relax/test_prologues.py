"""A decode step's SiLU gate and RMSNorms merged into the GEMVs that read them (CPU)."""

import re

import numpy as np
import pytest
import tvm
from tvm import relax

from fastdlight.analysis.func_info import analyze
from fastdlight.arch import CUDA
from fastdlight.compiler.compile import compile_mod_to_cubin
from fastdlight.policies import DefaultPolicy
from fastdlight.relax import prepare
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.schedules import dispatch_config
from test_pipeline import run_on_cpu

H100 = CUDA("nvidia/nvidia-h100")


def decode_mlp(rows: int = 1, d: int = 200, hidden: int = 344, separate: bool = False, residual_norm: bool = False):
    """``x + down(silu(gate) * up)`` of ``rms_norm(x)``: a decode step's gated MLP, the gate and
    up projections one GEMM (Phi-3) or two (``separate``, LLaMA); ``residual_norm``: the norm's
    output added to the result too (read by other than a projection)."""
    rng = np.random.default_rng(0)

    def const(*shape, dtype="float16"):
        return relax.const((rng.standard_normal(shape) * 0.05).astype(dtype))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, d), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            norm = bb.emit(relax.op.astype(relax.op.nn.rms_norm(x, const(d, dtype="float32") + relax.const(1.0),
                                                                axes=[-1], epsilon=1e-5), "float16"))
            if separate:
                gate = bb.emit(relax.op.matmul(norm, const(d, hidden)))
                up = bb.emit(relax.op.matmul(norm, const(d, hidden)))
            else:
                both = bb.emit(relax.op.matmul(norm, const(d, 2 * hidden)))
                parts = bb.emit(relax.op.split(both, 2, axis=-1))
                gate, up = bb.emit(relax.TupleGetItem(parts, 0)), bb.emit(relax.TupleGetItem(parts, 1))
            act = bb.emit(relax.op.multiply(relax.op.multiply(gate, relax.op.sigmoid(gate)), up))
            down = bb.emit(relax.op.matmul(act, const(hidden, d), out_dtype="float32"))
            out = x + down
            if residual_norm:
                out = out + relax.op.astype(norm, "float32")
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def kinds(mod) -> dict[str, str]:
    return {name: analyze(f).kind for name, f in prim_funcs(mod).items()}


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("separate", [False, True])
def test_the_gate_and_the_norm_merge_into_the_gemvs_with_the_same_values(rows, separate):
    mod = decode_mlp(rows, separate=separate)
    prepared = prepare(H100.target)(mod)
    found = kinds(prepared)
    assert sorted(found.values()) == ["gemv"] * len(found), found
    assert len(found) == (3 if separate else 2), found  # no norm or gate kernel left
    # one norm, computed by each projection that reads it; the gate in front of the down GEMV
    # (separate projections: FuseOps already put it into the up projection's epilogue)
    assert sum("rms_norm" in name for name in found) == (2 if separate else 1), found
    assert any("sigmoid" in name for name in found), found
    x = np.random.default_rng(1).standard_normal((rows, 200)).astype("float32")
    np.testing.assert_allclose(run_on_cpu(prepared, [x]), run_on_cpu(mod, [x]), rtol=1e-3, atol=1e-3)


def test_a_norm_read_by_more_than_projections_and_a_prefill_stay_apart():
    found = kinds(prepare(H100.target)(decode_mlp(1, residual_norm=True)))
    assert any(name.startswith("fused_rms_norm") and kind != "gemv" for name, kind in found.items()), found
    found = kinds(prepare(H100.target)(decode_mlp(17)))
    assert not any("rms_norm" in name and "matmul" in name for name in found), found


@pytest.mark.parametrize("rows", [1, 4])
def test_every_config_of_the_merged_gemvs_compiles(rows):
    merged = {n: f for n, f in prim_funcs(prepare(H100.target)(decode_mlp(rows))).items() if "matmul" in n}
    assert len(merged) == 2, list(merged)
    for name, func in merged.items():
        configs = DefaultPolicy(func, H100).emit_config(6)
        assert configs, name
        for config in configs:
            applied = dispatch_config(func, config)
            assert applied.template == "gemv", (name, config, applied.template)
            kernel = applied.schedule.mod["main"].with_attr("global_symbol", "main")  # prepare's are private
            src, cubin = compile_mod_to_cubin(tvm.IRModule({"main": kernel}), H100.target)
            # (several rows a thread: its partial sums are combined in a loop nvcc may leave rolled)
            assert cubin.spill_bytes == 0 or rows > 1, (name, config)
            kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", src))
            assert len(kernels) == 1, (name, config, kernels)  # the gate or norm: no kernel of its own


@pytest.mark.gpu
@pytest.mark.parametrize("rows,d,hidden,separate",
                         [(1, 520, 1000, False), (3, 520, 1000, True), (1, 3072, 8192, False)])
def test_the_merged_gemvs_are_tuned_ours_and_compute_the_same_on_the_gpu(rows, d, hidden, separate):
    import fastdlight

    dev = tvm.cuda(0)
    arch = CUDA.from_device(dev)
    mod = decode_mlp(rows, d, hidden, separate=separate)
    tuning = fastdlight.ApplyFastTuning(topk=6, target=arch)
    tuned = tuning(prepare(arch.target)(mod))
    merged = {e.function: e for e in tuning.report if "rms_norm" in e.function or "sigmoid" in e.function}
    assert len(merged) == 2, [e.function for e in tuning.report]
    assert all(e.status == "tuned" and e.verified and e.candidates > 0 for e in merged.values()), merged
    vm = relax.VirtualMachine(fastdlight.build(tuned, arch.target), dev)
    x = np.random.default_rng(1).standard_normal((rows, d)).astype("float32")
    out = vm["main"](tvm.runtime.tensor(x, dev)).numpy()
    np.testing.assert_allclose(out, run_on_cpu(mod, [x]), rtol=2e-2, atol=2e-2)

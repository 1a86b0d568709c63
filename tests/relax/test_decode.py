"""Decode steps' projections (CPU): read their bound weights [N, K], as GEMVs, with the same values."""

import numpy as np
import pytest
import tvm
from tvm import relax

from fastdlight.analysis.func_info import analyze
from fastdlight.arch import CUDA
from fastdlight.relax import for_inference, prepare
from fastdlight.relax.decode import DECODE_ROWS, decode_weight_layout
from fastdlight.relax.pipeline import prim_funcs

H100 = CUDA("nvidia/nvidia-h100")


def mlp(rows: int, d: int = 256, hidden: int = 688):
    """A GELU MLP as torch.export gives it: ``x @ W.T`` with torch's [N, K] weights passed in."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, d), "float32"))
    w1 = relax.Var("w1", relax.TensorType((hidden, d), "float32"))
    w2 = relax.Var("w2", relax.TensorType((d, hidden), "float32"))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.gelu(relax.op.matmul(x, relax.op.permute_dims(w1))))
            out = bb.emit_output(relax.op.matmul(h, relax.op.permute_dims(w2)))
        bb.emit_func_output(out)
    return bb.get()


def weights(d: int = 256, hidden: int = 688):
    rng = np.random.default_rng(0)
    return [rng.uniform(-0.1, 0.1, (hidden, d)).astype("float32"), rng.uniform(-0.1, 0.1, (d, hidden)).astype("float32")]


def run_cpu(mod, args):
    out = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy()


@pytest.mark.parametrize("rows", [1, DECODE_ROWS])
def test_a_decode_steps_projections_become_gemvs_over_nk_weights(rows):
    mod = for_inference(mlp(rows), [tvm.runtime.tensor(w) for w in weights()], fp16=True)
    kinds = [analyze(f).kind for f in prim_funcs(prepare(H100.target)(mod)).values()]
    assert kinds.count("gemv") == 2, kinds
    x = np.random.default_rng(1).uniform(-1, 1, (rows, 256)).astype("float32")
    np.testing.assert_allclose(run_cpu(decode_weight_layout()(mod), [x]), run_cpu(mod, [x]), rtol=1e-3, atol=1e-3)


def test_a_prefill_keeps_its_matmuls():
    mod = for_inference(mlp(DECODE_ROWS + 1), [tvm.runtime.tensor(w) for w in weights()], fp16=True)
    kinds = [analyze(f).kind for f in prim_funcs(prepare(H100.target)(mod)).values()]
    assert "gemv" not in kinds and kinds.count("matmul") == 2, kinds

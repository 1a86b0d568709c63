"""Gathers (CPU): which elementwise functions get thread tiles along both axes, ranked first, and
that those schedule with the elementwise template and compile to cubin. (GPU: test_gather_gpu.py.)"""

import types

import numpy as np
import pytest
from tvm import te
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.analysis.func_info import analyze
from fastdlight.policies.gather import gather_configs, is_gather
from fastdlight.relax.convs import im2col
from fastdlight.schedules import dispatch_config
from fastdlight.policies.select import candidate_sets
from fastdlight.compiler.compile import build, compile_cubin, cuda_source

H100 = CUDA("nvidia/nvidia-h100")

#: (N, H, W, C, R, S, stride, pad): ResNet's stem (batch 2), an odd one
STEMS = [(2, 224, 224, 3, 7, 7, 2, 3), (1, 31, 45, 3, 5, 3, 1, 2)]  # the second: 1457 pixels, odd


def im2col_op(n, h, w, c, r, s, stride, pad):
    """The stem's column gather as :mod:`fastdlight.relax.convs` builds it, with a numpy reference."""
    p, q = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
    x = te.placeholder((n, h, w, c), "float16", name="x")
    cols = im2col(x, (r, s), (stride, stride), (pad, pad), (p, q))

    def reference(x_np):
        xp = np.pad(x_np.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        out = np.empty((r * s * c, n * p * q))
        for ri in range(r):
            for si in range(s):
                patch = xp[:, ri:ri + stride * p:stride, si:si + stride * q:stride, :]  # [n, p, q, c]
                out[(ri * s + si) * c:(ri * s + si + 1) * c] = patch.reshape(-1, c).T
        return out

    return types.SimpleNamespace(func=te.create_prim_func([x, cols]), reference=reference, name="im2col")


@pytest.mark.parametrize("geometry", STEMS)
def test_an_im2col_gets_thread_tiles_along_both_axes_first(geometry):
    func = im2col_op(*geometry).func
    info = analyze(func)
    assert is_gather(info)
    configs = gather_configs(info, H100, 4)
    outer = info.spatial_axes[0].extent
    assert configs and all(c.kind == "elementwise" for c in configs)
    for c in configs:
        assert c.thread[0] > 1 and outer % c.thread[0] == 0, c  # a run of taps per thread
        assert c.block[0] == c.thread[0] and c.num_threads in (128, 256)
    (first, *_) = candidate_sets(func, H100, 20)
    assert first.configs[: len(configs)] == tuple(configs) and len(first.configs) <= 20


def test_affine_elementwise_functions_are_no_gathers():
    assert not is_gather(analyze(ops.elementwise((1024, 1024)).func))
    assert not is_gather(analyze(ops.transpose((64, 128), (1, 0)).func))
    assert gather_configs(analyze(ops.elementwise((1024, 1024)).func), H100, 4) == []


def test_the_stem_gather_configs_compile_to_cubin_without_spills():
    func = im2col_op(*STEMS[0]).func
    for config in gather_configs(analyze(func), H100, 4)[:2]:
        with H100.target:
            result = dispatch_config(func, config, allow_fallback=False)
        cubin = compile_cubin(cuda_source(build(result.schedule.mod, H100.target)), H100.target)
        assert cubin.spill_bytes == 0, config


@T.prim_func(s_tir=True)
def bool_gather(table: T.Buffer((1, 512), "bool"), rows: T.Buffer((1,), "int64"), cols: T.Buffer((512,), "int64"),
                out: T.Buffer((512,), "bool")):
    """torch.export's advanced indexing of a bool mask (Hugging Face attention masks)."""
    for i in range(512):
        with T.sblock("out"):
            vi = T.axis.spatial(512, i)
            out[vi] = table[rows[0], cols[vi]]


def test_bool_buffers_are_never_vectorized():
    # TVM 0.27 stores two bools as a ushort2 (4 bytes, 2-byte aligned): a misaligned address
    # on the GPU, and writes past the pair
    configs = [c for s in candidate_sets(bool_gather, H100, 20) for c in s.configs if c.kind == "elementwise"]
    assert configs
    for config in configs[:4]:
        src = cuda_source(build(dispatch_config(bool_gather, config).schedule.mod, H100.target))
        kernel = src[src.index("__global__"):]
        assert not any(v in kernel for v in ("ushort", "char2", "char4")), (config, kernel)

"""Copies carved from one allocation (``measure.arena``), on the CPU; the GPU test runs a kernel
on them."""

import gc

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.compiler.compile import build
from fastdlight.config import Config
from fastdlight.measure import arena
from fastdlight.measure import timing as measure
from fastdlight.measure.workload import params_bytes
from fastdlight.schedules import dispatch_config


def _tensor(values: np.ndarray, dev=None):
    return tvm.runtime.tensor(values, dev or tvm.cpu(0))


@pytest.mark.parametrize("dtype, shape", [("float32", (7, 5)), ("float16", (3, 11)), ("int32", (13,)),
                                          ("bool", (9,)), ("float32", ())])
def test_every_copy_holds_the_values_at_an_aligned_start_of_its_own(dtype, shape):
    rng = np.random.default_rng(0)
    values = (rng.random(shape) > 0.5) if dtype == "bool" else rng.standard_normal(shape).astype(dtype)
    t = _tensor(np.asarray(values))
    copies = arena.copies_of(t, 13)  # not a power of two: the last doubling is partial
    assert len(copies) == 13
    starts = [c.data_ptr() for c in copies]
    assert len(set(starts)) == 13 and t.data_ptr() not in starts
    # offsets of ALIGN bytes from a base TVM allocated (64-byte aligned on the CPU, 256 on a GPU)
    assert all((s - starts[0]) % arena.ALIGN == 0 and s % 64 == 0 for s in starts)
    assert min(b - a for a, b in zip(starts, starts[1:])) >= arena.nbytes(t)
    for c in copies:
        assert tuple(c.shape) == tuple(t.shape) and str(c.dtype) == dtype
        np.testing.assert_array_equal(c.numpy(), t.numpy())


def test_no_copies_and_one_copy():
    t = _tensor(np.arange(6, dtype="float32"))
    assert arena.copies_of(t, 0) == []
    (one,) = arena.copies_of(t, 1)
    np.testing.assert_array_equal(one.numpy(), t.numpy())


def test_a_kernel_takes_a_copy_and_the_copies_outlive_the_arena_handle():
    """TVM's generated code refuses a tensor of nonzero ``byte_offset``: a copy has none, and
    the allocation lives as long as any copy does."""
    op = ops.elementwise((4, 8), "float32", "add")
    mod = tvm.compile(tvm.IRModule({"main": op.func}), target="llvm").mod
    fn = mod[measure.function_name(mod, op.func)]
    rng = np.random.default_rng(1)
    a, b = (_tensor(rng.standard_normal((4, 8)).astype("float32")) for _ in range(2))
    a_copies, b_copies = arena.copies_of(a, 5), arena.copies_of(b, 5)
    out = tvm.runtime.empty((4, 8), "float32", tvm.cpu(0))
    gc.collect()
    for ac, bc in zip(a_copies, b_copies):
        fn(ac, bc, out)
        np.testing.assert_allclose(out.numpy(), a.numpy() + b.numpy(), rtol=1e-6)


def test_nbytes_counts_whole_bytes_per_element():
    assert arena.nbytes(tvm.runtime.empty((3, 4), "float16", tvm.cpu(0))) == 24
    assert arena.nbytes(tvm.runtime.empty((10,), "bool", tvm.cpu(0))) == 10


def test_a_functions_buffers_count_as_the_runtime_allocates_them():
    """One count of a tensor's bytes for the arena and for a function's parameters: sub-byte
    types packed, a bool a byte."""
    @T.prim_func(s_tir=True)
    def f(a: T.Buffer((7,), "int4"), b: T.Buffer((10,), "bool"), c: T.Buffer((3, 4), "float16")):
        for i in range(7):
            with T.sblock("s"):
                vi = T.axis.spatial(7, i)
                a[vi] = a[vi]

    assert arena.data_bytes((7,), "int4") == 4
    assert params_bytes(f) == 4 + 10 + 24
    assert arena.nbytes(tvm.runtime.empty((), "float32", tvm.cpu(0))) == 4


@pytest.mark.gpu
def test_a_gpu_kernel_runs_on_device_copies():
    dev = tvm.cuda(0)
    op = ops.elementwise((1000, 33), "float16", "add")  # rows of 66 bytes: copies start padded
    sch = dispatch_config(op.func, Config("elementwise", block=(1, 256), thread=(1, 64))).schedule
    mod = build(sch.mod, tvm.target.Target.from_device(dev))
    fn = mod[measure.function_name(mod, op.func)]
    rng = np.random.default_rng(2)
    a, b = (_tensor(rng.standard_normal((1000, 33)).astype("float16"), dev) for _ in range(2))
    out = tvm.runtime.empty((1000, 33), "float16", dev)
    for ac, bc in zip(arena.copies_of(a, 37), arena.copies_of(b, 37)):
        fn(ac, bc, out)
        np.testing.assert_array_equal(out.numpy(), (a.numpy() + b.numpy()).astype("float16"))

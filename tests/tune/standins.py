"""Stand-in templates and test hooks for the build loop (module-level so workers can unpickle them)."""

import os
import time

from tvm import s_tir
from tvm.s_tir.dlight.analysis import normalize_prim_func

from fastdlight import ops


def flat_template(func, config):
    """Fuse every loop of the last block and split it into blocks of ``config.num_threads``
    threads (correct for any injective function; the config only picks the block size)."""
    sch = s_tir.Schedule(func)
    blocks = normalize_prim_func(sch)
    for info in blocks[:-1]:
        sch.compute_inline(info.block_rv)
    block = blocks[-1].block_rv
    fused = sch.fuse(*sch.get_loops(block))
    bx, tx = sch.split(fused, [None, config.num_threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return sch


def wrong_add_template(func, config):
    """Schedules a *different* function with the same signature when block[0] == 1: C = A (a copy,
    cheaper than A + B, so it would win on speed). Correct otherwise."""
    if config.block[0] == 1:
        shape = [int(d) for d in func.params[0].shape]
        dtype = str(func.params[0].dtype)
        from tvm import te

        A = te.placeholder(shape, dtype, name="A")
        B = te.placeholder(shape, dtype, name="B")
        C = te.compute(shape, lambda *i: A[i], name="C")
        func = te.create_prim_func([A, B, C]).with_attr("global_symbol", "add")
    return flat_template(func, config)


def failing_template(func, config):
    raise ValueError(f"this template rejects every config ({config.block})")


def abort_on_odd(index, config):
    if index % 2 == 1:
        os.abort()


def sleep_on_first(index, config):
    if index == 0:
        time.sleep(600)


def delay_early_ones(index, config):
    """Makes completion order the reverse of submission order (more or less)."""
    time.sleep(max(0.0, 0.6 - 0.15 * index))


def add_op(n=1024, dtype="float16"):
    return ops.elementwise((n, n), dtype, "add")


def _far_store_copy(n: int, dtype: str):
    """``add``'s signature, but the kernel stores 512 GiB past C: an illegal address on a GPU."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def far(A: T.Buffer((n, n), dtype), B: T.Buffer((n, n), dtype), C: T.Buffer((n, n), dtype)):
        T.func_attr({"global_symbol": "add"})
        C_far = T.decl_buffer((T.int64(1) << 40,), dtype, data=C.data)
        for i, j in T.grid(n, n):
            with T.sblock("C"):
                vi, vj = T.axis.remap("SS", [i, j])
                C_far[(T.int64(1) << 38) + T.Cast("int64", vi * n + vj)] = A[vi, vj]

    return far


def faulting_add_template(func, config):
    """Schedules a kernel that faults (illegal address) when block[0] == 1; correct otherwise."""
    if config.block[0] == 1:
        func = _far_store_copy(int(func.params[0].shape[0]), str(func.params[0].dtype))
    return flat_template(func, config)

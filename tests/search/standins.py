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
        # here, not at the top: the templates run in build workers, which unpickle them by name
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
    # here, not at the top: called from a template in a build worker
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


# -- sabotage: real wrong kernels made the fastest candidates -------------------------------------
#: the variant a sabotage config builds, by its threads per block: the wrong kernels run 64+
#: threads per block, the correct ones 1 or 2 (so every wrong one is faster than every right one)
SABOTAGE = {1: "correct", 2: "correct", 64: "sign_flip", 128: "broken_index", 256: "dropped_edge_tile", 512: "nan"}
MATMUL_SHAPE = (256, 256, 256)


def sabotage_matmul(variant: str, m: int = 256, n: int = 256, k: int = 256):
    """C = A·B (fp16 in, fp32 out), correct or wrong in one of four realistic ways; always a
    single reduction block, so one schedule fits every variant."""
    # here, not at the top: called from a template in a build worker
    from tvm import te, tirx

    A = te.placeholder((m, k), "float16", name="A")
    B = te.placeholder((k, n), "float16", name="B")
    r = te.reduce_axis((0, k), name="k")

    def a_at(i, j, kk):
        if variant == "sign_flip":  # one 16x16 tile comes out negated
            return tirx.if_then_else(tirx.all(i < 16, j < 16), -A[i, kk], A[i, kk])
        if variant == "broken_index":  # row 7 reads row 8 of A
            return A[tirx.if_then_else(i == 7, 8, i), kk]
        if variant == "nan":  # one element picks up a NaN
            nan = tirx.const(float("nan"), "float16")
            return tirx.if_then_else(tirx.all(i == 5, j == 9, kk == 0), nan, A[i, kk])
        if variant == "dropped_edge_tile":  # the last 16x16 tile is never computed (stays 0)
            return tirx.if_then_else(tirx.all(i >= m - 16, j >= n - 16), tirx.const(0, "float16"), A[i, kk])
        return A[i, kk]

    def body(i, j):
        return te.sum(a_at(i, j, r).astype("float32") * B[r, j].astype("float32"), axis=r)

    C = te.compute((m, n), body, name="C")
    return te.create_prim_func([A, B, C]).with_attr("global_symbol", "matmul")


def sabotage_template(func, config):
    """One thread per output element, serial k, ``config.num_threads`` threads per block, on the
    variant :data:`SABOTAGE` names for that block size (the function given is ignored: it is the
    correct matmul)."""
    sch = s_tir.Schedule(sabotage_matmul(SABOTAGE[config.num_threads], *MATMUL_SHAPE))
    (block,) = [info.block_rv for info in normalize_prim_func(sch)]
    i, j, _k = sch.get_loops(block)
    bx, tx = sch.split(sch.fuse(i, j), [None, config.num_threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return sch


def flat_template_except_64(func, config):
    """:func:`flat_template`, except that it rejects 64-thread configs."""
    if config.num_threads == 64:
        raise ValueError("64 threads rejected")
    return flat_template(func, config)

"""The arguments a kernel is timed and checked on (:class:`Workload`).

* Inputs are random (floats in [-1, 1], integers never zero), generated once per tuning run
  and shared by every candidate and the reference (and copied, not made again, for another GPU:
  :meth:`Workload.copy`).
* Checking poisons the outputs (NaN, or a sentinel for integers) and runs once
  (:meth:`Workload.run_outputs`); :mod:`fastdlight.measure.verify` judges every element.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Callable

import numpy as np
import tvm
from tvm import tirx

from fastdlight.measure import clock, host
from fastdlight.measure.arena import copies_of, data_bytes, nbytes
from fastdlight.measure.inputs import distinct_index_inputs, index_bounds, known_input_values, random_bits_inputs
from fastdlight.measure.timing import rotation_copies

#: integer outputs are poisoned with this (a computed result is very unlikely to equal it)
INT_SENTINEL = {"int8": -128, "int16": -32768, "int32": -(2**31) + 7, "int64": -(2**62) + 7, "uint8": 251}


def output_indices(func: tirx.PrimFunc) -> list[int]:
    """Parameters the function writes (its outputs); the last parameter if none is found."""
    written = []
    try:
        from tvm import s_tir

        sch = s_tir.Schedule(func)
        from fastdlight.schedules.base import root_block

        stack = [rv for rv in [root_block(sch)] if rv is not None]
        while stack:
            rv = stack.pop()
            written += [_region_tensor(region) for region in sch.get(rv).writes]
            stack += list(sch.get_child_blocks(rv))
    except Exception:  # noqa: BLE001 - not in block form: fall back to "last parameter"
        written = []
    outs = [i for i, p in enumerate(param_buffers(func)) if any(p.same_as(b) for b in written)]
    return outs or [len(func.params) - 1]


def _region_tensor(region):
    return region.source if hasattr(region, "source") else region.buffer


def param_buffers(func: tirx.PrimFunc) -> list:
    """The tensor parameters (in TVM 0.27 the parameters themselves carry shape and dtype)."""
    bufs = []
    buffer_map = getattr(func, "buffer_map", None) or {}
    for p in func.params:
        buf = buffer_map[p] if p in buffer_map else p
        if getattr(buf, "shape", None) is None:  # a 0-d buffer (shape ()) is a tensor too
            raise ValueError(f"parameter {p} is not a tensor; only tensor arguments are supported")
        bufs.append(buf)
    return bufs


def static_shape(buf: tirx.Buffer) -> tuple[int, ...]:
    shape = []
    for d in buf.shape:
        if not isinstance(d, (int, tirx.IntImm)):
            raise ValueError(f"buffer {buf.name} has a symbolic shape {list(buf.shape)}; specialize it first")
        shape.append(int(d))
    return tuple(shape)


# -- host data --------------------------------------------------------------------------------
def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit pattern (round to nearest even)."""
    def bits(u, dst):
        dst[...] = (u + 0x7FFF + ((u >> 16) & 1)) >> 16

    return host.map_into(np.ascontiguousarray(x, dtype=np.float32).view(np.uint32), np.uint16, bits)


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def random_array(shape, dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random host data in ``dtype`` (bfloat16: float32 values exactly representable in bf16)."""
    dtype = str(dtype)
    if dtype.startswith(("int", "uint")):
        hi = {"int8": 4, "uint8": 4}.get(dtype, 100)
        mag = rng.integers(1, hi + 1, size=shape)  # never zero
        if dtype.startswith("uint"):
            return mag.astype(dtype)
        return (mag * rng.choice(np.array([-1, 1]), size=shape)).astype(dtype)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "bfloat16":
        return host.uniform(shape, rng, np.float32, lambda v: _bf16_values(bf16_bits(v)))
    return host.uniform(shape, rng, dtype)


def to_device(arr: np.ndarray, dtype: str, dev) -> tvm.runtime.Tensor:
    if str(dtype) == "bfloat16":
        t = tvm.runtime.empty(arr.shape, "bfloat16", dev)
        t.copyfrom(bf16_bits(arr))
        return t
    # np.require, not np.ascontiguousarray: the latter turns a 0-d array into shape (1,)
    return tvm.runtime.tensor(np.require(arr, requirements="C"), dev)


def to_host(t: tvm.runtime.Tensor) -> np.ndarray:
    """Device tensor -> numpy (bfloat16 comes back as float32 values)."""
    if str(t.dtype) == "bfloat16":
        bits = t._create_view(t.shape, "uint16").numpy()
        return _bf16_values(bits).reshape(t.shape)
    return t.numpy()


def params_bytes(func: tirx.PrimFunc) -> int:
    """Bytes of all of ``func``'s buffers as allocated (static shapes: ValueError otherwise)."""
    return sum(data_bytes(static_shape(b), b.dtype) for b in param_buffers(func))


def poison_value(dtype: str):
    dtype = str(dtype)
    if dtype.startswith(("float", "bfloat")):
        return np.nan
    return INT_SENTINEL.get(dtype, 77)


# -- the workload every candidate runs on ------------------------------------------------------
def host_inputs(func: tirx.PrimFunc, seed: int = 0) -> list[np.ndarray | None]:
    """Per parameter of ``func``, its host input (None for an output): the model's value where
    :func:`~fastdlight.measure.inputs.known_input_values` has one, indices inside what they
    index (:func:`~fastdlight.measure.inputs.index_bounds`), packed words over their whole range
    (:func:`~fastdlight.measure.inputs.random_bits_inputs`), else random (:func:`random_array`)."""
    rng = np.random.default_rng(seed)
    bounds, known, outs = index_bounds(func), known_input_values(func), set(output_indices(func))
    every_bit, distinct = random_bits_inputs(func), distinct_index_inputs(func)
    host: list[np.ndarray | None] = []
    for i, buf in enumerate(param_buffers(func)):
        shape, dtype, name = static_shape(buf), str(buf.dtype), str(buf.name)
        if i in outs:
            host.append(None)
        elif name in known:
            host.append(np.full(shape, known[name], dtype=np.float32 if dtype == "bfloat16" else dtype))
        elif name in bounds:
            host.append(_indices(rng, bounds[name], shape, name in distinct).astype(dtype))
        elif name in every_bit:
            info = np.iinfo(dtype)
            host.append(rng.integers(info.min, int(info.max) + 1, size=shape, dtype=np.int64).astype(dtype))
        else:
            host.append(random_array(shape, dtype, rng))
    return host


def _indices(rng, bound: int, shape, distinct: bool) -> np.ndarray:
    """Random indices below ``bound``; ``distinct``: none repeated (a random choice without
    replacement; ValueError where ``bound`` has too few values)."""
    count = math.prod(shape)
    if not distinct:
        return rng.integers(0, bound, size=shape)
    if count > bound:
        raise ValueError(f"{count} distinct indices asked below {bound}")
    return rng.permutation(bound)[:count].reshape(shape)


class Workload:
    """Device arguments for ``func`` (random inputs, outputs poisoned before every check)."""

    def __init__(self, func: tirx.PrimFunc, dev=None, seed: int = 0, device_lock=None, host=None):
        """``device_lock``: held while the inputs are copied to the device, not while they are
        made (a tuning run passes its GPU turn: a copy queued between another function's timing
        events would count in that timing). ``host``: the inputs already made (:meth:`copy`)."""
        self.func = func
        self.dev = dev if dev is not None else tvm.cuda(0)
        self.buffers = param_buffers(func)
        self.out_idx = output_indices(func)
        host = self._host = host if host is not None else host_inputs(func, seed)
        self.host_inputs: list[np.ndarray] = [a for a in host if a is not None]
        with clock.holding(device_lock, "workload: GPU") if device_lock is not None else contextlib.nullcontext():
            self.args = [tvm.runtime.empty(static_shape(buf), str(buf.dtype), self.dev) if arr is None
                         else to_device(arr, str(buf.dtype), self.dev) for buf, arr in zip(self.buffers, host)]
        self._arg_sets: list[list] | None = None
        self.bytes = sum(nbytes(t) for t in self.args)

    def copy(self, dev, device_lock=None) -> Workload:
        """The same inputs on ``dev`` (made once: random inputs of a large function take the
        host seconds)."""
        return Workload(self.func, dev, device_lock=device_lock, host=self._host)

    @classmethod
    def background(cls, func, given: Workload | None = None, seed: int = 0, dev=None,
                   device_lock=None, source: Callable[[], Workload | None] | None = None) -> WorkloadMaker:
        """A workload made on ``dev`` (default GPU 0) in a thread of its own, while candidates
        build; its copies hold ``device_lock`` (see ``__init__``). ``source``: a workload on
        another GPU whose inputs this one copies."""
        return WorkloadMaker(func, given, seed, dev, device_lock, source)

    def timing_arg_sets(self, l2_bytes: int) -> list[list]:
        """Argument lists for "rotate" timing: ``self.args`` first, then device copies of the
        inputs (outputs shared), as many as :func:`rotation_copies` asks, each input's copies in
        one allocation (:func:`.arena.copies_of`). Made once."""
        if self._arg_sets is None:
            inputs = [i for i in range(len(self.args)) if i not in self.out_idx]
            in_bytes = sum(nbytes(self.args[i]) for i in inputs)
            sets = [list(self.args)]
            extra = rotation_copies(in_bytes, l2_bytes) - 1
            copies = {i: copies_of(self.args[i], extra) for i in inputs}
            for k in range(extra):
                sets.append([copies[i][k] if i in copies else a for i, a in enumerate(self.args)])
            self._arg_sets = sets
        return self._arg_sets

    def poison(self) -> None:
        for i in self.out_idx:
            t = self.args[i]
            host = np.full(t.shape, poison_value(t.dtype), dtype=np.float32 if str(t.dtype) == "bfloat16" else t.dtype)
            if str(t.dtype) == "bfloat16":
                t.copyfrom(bf16_bits(host))
            else:
                t.copyfrom(host)

    def run_outputs(self, fn) -> list[np.ndarray]:
        """Poison the outputs, run ``fn(*args)`` once, return the outputs on the host."""
        self.poison()
        fn(*self.args)
        self.dev.sync()
        return [to_host(self.args[i]) for i in self.out_idx]

class WorkloadMaker:
    def __init__(self, func, given: Workload | None, seed: int, dev=None, device_lock=None, source=None):
        self.workload, self.error = given, None
        self._thread = None
        if given is None:
            self._thread = threading.Thread(target=self._make, args=(func, seed, dev, device_lock, source),
                                            daemon=True)
            self._thread.start()

    def _make(self, func, seed: int, dev, device_lock, source) -> None:
        try:
            if source is None:
                with clock.stage("workload"):
                    self.workload = Workload(func, dev, seed, device_lock)
                return
            original = source()
            if original is None:
                self.error = "the inputs it copies were not made"
                return
            with clock.stage("workload"):
                self.workload = original.copy(dev, device_lock)
        except Exception as e:  # noqa: BLE001 - reported by get()'s caller
            self.error = f"{type(e).__name__}: {e}"

    def get(self) -> Workload | None:
        if self._thread is not None:
            self._thread.join()
        return self.workload

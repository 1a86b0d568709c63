"""Host-side array work of a tuning run on several cores: random inputs, their float64
widening, and the element checks of large outputs.

numpy releases the GIL inside its loops, so fixed-size chunks of one large array run on
several threads at once. On an H100 machine (16 cores) one core took 0.9 s to make each
8192x8192 fp16 input, 0.7 s to widen it to float64, and 2.5 s to check the winner's output;
tuning that GEMM took 13.5 s in all. Chunks are cut by element count alone, never by the
number of cores, so every result (random values included) is the same on every machine.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import numpy as np

#: elements per chunk: 32 MB of float64, large enough that a chunk's numpy calls dwarf the
#: thread hand-off, small enough that an 8192x8192 array gives every core work
CHUNK_ELEMENTS = 1 << 22
#: threads at most: memory bandwidth, not cores, bounds these loops beyond about eight
MAX_THREADS = 8

T = TypeVar("T")
_POOL: ThreadPoolExecutor | None = None


def chunks(n: int) -> list[slice]:
    """Consecutive slices covering ``range(n)``, :data:`CHUNK_ELEMENTS` each (the last shorter)."""
    return [slice(i, min(i + CHUNK_ELEMENTS, n)) for i in range(0, max(n, 1), CHUNK_ELEMENTS)]


def map_chunks(fn: Callable[[int, slice], T], n: int) -> list[T]:
    """``[fn(i, s) for i, s in enumerate(chunks(n))]``, on threads when there are several."""
    parts = chunks(n)
    if len(parts) == 1 or MAX_THREADS < 2:
        return [fn(i, s) for i, s in enumerate(parts)]
    return list(_pool().map(fn, range(len(parts)), parts))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, os.cpu_count() or 1)),
                                   thread_name_prefix="fastdlight-host")
    return _POOL


def flat(a: np.ndarray) -> np.ndarray:
    """A 1-D view of ``a`` (a copy only where it is not contiguous)."""
    return np.ravel(np.asarray(a), order="C")


def map_into(a: np.ndarray, dtype, fill: Callable[[np.ndarray, np.ndarray], None]) -> np.ndarray:
    """A new array of ``a``'s shape in ``dtype``, written chunk by chunk: ``fill(src, dst)``
    with ``src`` a chunk of ``a`` (flattened) and ``dst`` the same chunk of the result."""
    a = np.asarray(a)
    out = np.empty(a.shape, dtype=dtype)
    src, dst = flat(a), out.reshape(-1)
    map_chunks(lambda _, s: fill(src[s], dst[s]), src.size)
    return out


def as_float64(a: np.ndarray, absolute: bool = False) -> np.ndarray:
    """``a`` in float64 (``a`` itself when it already is), or its absolute values in float64
    (exact for every float dtype), in one pass."""
    a = np.asarray(a)
    if a.dtype == np.float64 and not absolute:
        return a
    return map_into(a, np.float64, _widen_absolute if absolute else _widen)


def _widen(src: np.ndarray, dst: np.ndarray) -> None:
    dst[...] = src


def _widen_absolute(src: np.ndarray, dst: np.ndarray) -> None:
    np.abs(src, out=dst)


def absolute(a: np.ndarray) -> np.ndarray:
    """``np.abs(a)``, chunk by chunk."""
    a = np.asarray(a)
    return map_into(a, a.dtype, _widen_absolute)


def uniform(shape, rng: np.random.Generator, dtype=np.float32,
            rounded: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Values uniform in [-1, 1) of ``shape`` in ``dtype`` (float32 values, passed through
    ``rounded`` when given): one seed per chunk drawn from ``rng``, each chunk drawn from its
    own generator on a thread of its own."""
    n = math.prod(shape)
    seeds = rng.integers(0, 2**63, size=len(chunks(n)))
    out = np.empty(n, dtype=dtype)

    def draw(i, s):
        vals = np.random.default_rng(seeds[i]).random(s.stop - s.start, dtype=np.float32)
        vals *= 2  # in place: the values of ``* 2 - 1`` without two more arrays of the size
        vals -= 1
        out[s] = rounded(vals) if rounded is not None else vals

    map_chunks(draw, n)
    return out.reshape(shape)

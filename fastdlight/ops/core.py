"""What every op builder shares: the :class:`Op` it returns and the checks and PrimFunc
construction the builders of :mod:`fastdlight.ops` call."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from tvm import te, tirx

from fastdlight.analysis.dtypes import OP_DTYPES as DTYPES


@dataclass(frozen=True)
class Op:
    name: str
    func: tirx.PrimFunc
    reference: Callable[..., np.ndarray]  # float64 result from the numpy inputs
    flops: float
    bytes: float

    @property
    def memory_bound(self) -> bool:
        # Arithmetic intensity below ~20 FLOP/byte cannot be compute bound on any modern GPU.
        return self.flops < 20 * self.bytes


def check_dtype(dtype: str, allowed=DTYPES) -> str:
    if dtype not in allowed:
        raise ValueError(f"unsupported dtype {dtype!r}; supported: {', '.join(allowed)}")
    return dtype


def check_shape(*dims: int) -> None:
    for d in dims:
        if not isinstance(d, (int, np.integer)) or d <= 0:
            raise ValueError(f"shape dimensions must be positive integers, got {dims}")
        if d >= 2**63:  # TVM's FFI would say only that the value is not an int64
            raise ValueError(f"shape dimensions must be below 2^63 (int64), got {d}")


#: tensors with more elements than this are indexed with int64 (int32 offsets would overflow)
INT32_ELEMENTS = 2**31 - 1


def prim_func(tensors, name: str) -> tirx.PrimFunc:
    big = any(math.prod(int(d) for d in t.shape) > INT32_ELEMENTS for t in tensors)
    return te.create_prim_func(tensors, index_dtype_override="int64" if big else None).with_attr("global_symbol", name)

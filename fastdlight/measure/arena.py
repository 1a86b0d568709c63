"""Copies of a tensor carved from one allocation: the inputs a "rotate" timing cycles through.

A small function's rotation asks for up to :data:`~fastdlight.measure.timing.MAX_COPIES` copies
of each input (enough other data between two uses of one copy to push it out of the L2). Made
one ``empty`` + ``copyfrom`` at a time they were as many device allocations and copies, each
with its own driver call and Python overhead, while the GPU turn was held: 9-12 s of a CNN's
tune on the H200 (``time: input copies`` in the stage clock), and as many frees after it.
Here each input takes one allocation; the first copy is written from the input and the filled
part then doubles, so ``n`` copies take ``1 + ceil(log2 n)`` device copies.

TVM kernels refuse a tensor whose ``byte_offset`` is not 0, which is what a view into the
allocation has (``Tensor._create_view``). Each copy is therefore that view handed over through
DLPack with its offset folded into the data pointer: the DLPack capsule's deleter is TVM's own,
so the copy keeps the allocation alive as long as any copy lives.
"""

from __future__ import annotations

import ctypes

import tvm
import tvm_ffi

#: where each copy starts: a multiple of this many bytes (cudaMalloc's own alignment; TVM's
#: kernels assume 64, vector loads 16)
ALIGN = 256

_CAPSULE = b"dltensor"


class _DLTensor(ctypes.Structure):
    """DLPack's ``DLTensor`` (the head of the ``DLManagedTensor`` an unversioned capsule holds)."""

    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype_code", ctypes.c_uint8), ("dtype_bits", ctypes.c_uint8),
                ("dtype_lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def data_bytes(shape, dtype) -> int:
    """Bytes TVM allocates for a tensor of ``shape`` and ``dtype``: its elements' bits rounded
    up to a whole byte once (sub-byte types packed; a bool is 8 bits), as the runtime's
    ``GetDataSize`` counts them."""
    n = 1
    for d in shape:
        n *= int(d)
    dt = tvm.runtime.DataType(str(dtype))
    return (n * dt.bits * dt.lanes + 7) // 8


def nbytes(t) -> int:
    """Bytes a tensor's allocation holds (:func:`data_bytes`)."""
    return data_bytes(t.shape, t.dtype)


def _aligned(n: int) -> int:
    return -(-max(n, 1) // ALIGN) * ALIGN


def _without_offset(view) -> tvm.runtime.Tensor:
    """``view`` as a tensor of offset 0 whose data pointer is the view's start."""
    capsule = view._to_dlpack()
    dl = _DLTensor.from_address(_capsule_pointer(capsule, _CAPSULE))
    dl.data, dl.byte_offset = dl.data + dl.byte_offset, 0
    return tvm_ffi.from_dlpack(capsule)


def copies_of(t, count: int) -> list:
    """``count`` tensors on ``t``'s device with ``t``'s shape, dtype and values, each starting
    :data:`ALIGN`-aligned in one allocation. ``t`` itself is not among them."""
    if count <= 0:
        return []
    size = nbytes(t)
    stride = _aligned(size)
    arena = tvm.runtime.empty((stride * count,), "uint8", t.device)
    if size:
        arena._create_view((size,), "uint8", 0).copyfrom(t._create_view((size,), "uint8", 0))
    filled = 1
    while filled < count:
        n = min(filled, count - filled)
        arena._create_view((n * stride,), "uint8", filled * stride).copyfrom(
            arena._create_view((n * stride,), "uint8", 0))
        filled += n
    return [_without_offset(arena._create_view(tuple(t.shape), str(t.dtype), k * stride)) for k in range(count)]

"""Which inputs of a function are not free to be random: indices into another buffer (kept
inside it) and scalars a model always passes (made with the model's value). The tuning run's
inputs (:func:`fastdlight.measure.workload.host_inputs`) follow both."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx


#: a PrimFunc attribute, ``{parameter name: value}``: inputs a model always passes as one scalar
#: constant (a GELU's 0.5 and 3.0, an attention scale), made with that value instead of random ones
#: so that candidates are checked on the arithmetic the model does
INPUT_VALUES = "fastdlight.input_values"


def known_input_values(func: tirx.PrimFunc) -> dict[str, float]:
    """The :data:`INPUT_VALUES` of ``func`` (empty when it has none)."""
    if func.attrs is None or INPUT_VALUES not in func.attrs:
        return {}
    return {str(k): float(v) for k, v in func.attrs[INPUT_VALUES].items()}


#: a PrimFunc attribute: the names of integer parameters whose every bit is data (sub-byte values
#: packed into words, e.g. 4-bit weights eight to a uint32): random inputs take the whole range,
#: so that every packed value varies (small random integers would leave the high nibbles zero)
RANDOM_BITS = "fastdlight.random_bits"


def random_bits_inputs(func: tirx.PrimFunc) -> set[str]:
    """The :data:`RANDOM_BITS` of ``func`` (empty when it has none)."""
    if func.attrs is None or RANDOM_BITS not in func.attrs:
        return set()
    return {str(name) for name in func.attrs[RANDOM_BITS]}


#: a PrimFunc attribute: the names of index parameters whose values are distinct, as a paged
#: cache's page table is (a sequence's pages are its own): random indices drawn with repeats
#: read some pages twice, from the L2 the second time, and timed a paged kernel faster than the
#: cache it stands for
DISTINCT_INDICES = "fastdlight.distinct_indices"


def distinct_index_inputs(func: tirx.PrimFunc) -> set[str]:
    """The :data:`DISTINCT_INDICES` of ``func`` (empty when it has none)."""
    if func.attrs is None or DISTINCT_INDICES not in func.attrs:
        return set()
    return {str(name) for name in func.attrs[DISTINCT_INDICES]}


def index_bounds(func: tirx.PrimFunc) -> dict[str, int]:
    """Integer parameters whose values index another buffer (a gather, a quantization group
    index), each with the smallest extent it indexes: random values beyond it would read out
    of bounds, which may fault in one process and not in another. An index may reach the load
    through intermediate buffers (``torch.export``'s advanced indexing broadcasts its index
    tensors first): every parameter a stored index value reads is bounded alike."""
    # buffers by identity: the printer tells apart intermediates that share a name, the IR does not
    params = {p: str(p.name) for p in func.params
              if hasattr(p, "shape") and str(p.dtype).startswith(("int", "uint"))}
    sources: dict = {}  # buffer -> the buffers its stored values read

    def loads_in(expr) -> list:
        found: list = []
        tvm_ffi.structural_walk(expr, (tvm.ir.TensorLoad, found.append), order="post")
        return found

    def visit_store(store):
        sources.setdefault(store.buffer, set()).update(ld.source for ld in loads_in(store.value))

    tvm_ffi.structural_walk(func.body, (tirx.BufferStore, visit_store), order="post")
    bounds: dict[str, int] = {}

    def bound(buf, extent: int, seen: frozenset = frozenset()):
        if buf in params:
            name = params[buf]
            bounds[name] = min(bounds.get(name, extent), extent)
        for src in sources.get(buf, ()):  # an intermediate: the parameters its values come from
            if src not in seen:
                bound(src, extent, seen | {buf})

    def visit_load(load):
        for dim, index in zip(load.source.shape, load.indices):
            if isinstance(dim, (int, tirx.IntImm)):
                for inner in loads_in(index):
                    bound(inner.source, int(dim))

    tvm_ffi.structural_walk(func.body, (tvm.ir.TensorLoad, visit_load), order="post")
    return bounds

"""Configs for transposes: injective functions that read a parameter along another axis than the
one they write innermost (a layout change such as NCHW -> NHWC, with any casts fused).

The elementwise template vectorizes along the output's innermost axis, so such a read gathers:
each lane loads from another row of the input, and the kernel moves 0.6-0.8 TB/s on an H100/H200.
The ``transpose`` template stages a tile through shared memory instead: the block reads it with
the input's innermost axis across the threads (coalesced), then writes it with the output's
innermost axis across the threads (coalesced); a padded row keeps the column reads free of bank
conflicts.

A config's ``block`` is the output tile (one entry per output axis; the tile spans the two
innermost axes, ``a`` of the input's and ``b`` of the output's); ``thread`` is each thread's
share of it (only its size matters: the block has ``prod(block) / prod(thread)`` threads); ``vectorize`` gives
the output's store width and the input's load width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastdlight.analysis.func_info import Access, FuncInfo
from fastdlight.config import Config
from fastdlight.policies.roller import largest_pow2_divisor

#: tile sides tried along the input's and the output's innermost axes
TILE_SIDES = (32, 64)
#: threads per block tried
THREADS = (128, 256)
#: widest vector of the shared-memory side: a column read packs values from as many rows, and
#: TVM 0.27 packs 8 gathered 16-bit values with an 8-argument make_uint4 that nvcc rejects
MAX_GATHER_LANES = 4
#: bytes each thread loads per vector from the input: one 32-bit word, so that a row padded by
#: one word stays aligned for it
LOAD_BYTES = 4
#: a transposed read must be at least this share of the output's size (else it is a small
#: operand: a transposed bias, not a layout change)
MIN_SHARE = 0.5


@dataclass(frozen=True)
class TransposedRead:
    access: Access
    axis: int  # the output axis that moves the read's innermost index
    next_axis: int | None  # the one that moves its second-innermost index (None: not one axis)


def transposed_read(info: FuncInfo) -> TransposedRead | None:
    """The largest parameter read of an elementwise ``info`` whose innermost index moves with
    another output axis than the last one, when it is at least :data:`MIN_SHARE` of the output."""
    if info.kind != "elementwise" or len(info.spatial_axes) < 2:
        return None
    last = len(info.spatial_axes) - 1
    out_size = math.prod(a.extent for a in info.spatial_axes)
    found = []
    for access in info.reads:
        axis = access.innermost_axis() if access.linear is not None else _innermost_iter(access)
        if access.is_param and axis is not None and axis != last and len(access.indices) == 1:
            if math.prod(access.tensor.shape) >= MIN_SHARE * out_size:
                found.append(TransposedRead(access, axis, _second_innermost_axis(access)))
    return max(found, key=lambda t: math.prod(t.access.tensor.shape), default=None)


def _innermost_iter(access: Access) -> int | None:
    """The block iter that is, alone, the innermost index of every load: a read whose other
    indices are not affine (a reshape folded in: ``b = bh // 16``) but whose rows are contiguous."""
    found = set()
    for load in access.indices:
        index = load[-1] if load else None
        match = [i for i, v in enumerate(access.iter_vars) if index is not None and index.same_as(v)]
        if len(match) != 1:
            return None
        found.add(match[0])
    return found.pop() if len(found) == 1 else None


def _second_innermost_axis(access: Access) -> int | None:
    if len(access.tensor.shape) < 2 or access.linear is None:
        return None
    moving = {i for load in access.linear for i, c in enumerate(load[-2][:-1]) if c != 0}
    return moving.pop() if len(moving) == 1 else None


def transpose_configs(info: FuncInfo, arch, limit: int) -> list[Config]:
    """Up to ``limit`` transpose configs (squarest, widest tiles first), none when ``info`` is
    no transpose."""
    read = transposed_read(info)
    if read is None or limit <= 0:
        return []
    extents = [a.extent for a in info.spatial_axes]
    last, a = len(extents) - 1, read.axis
    out_bits, in_bits = info.write.tensor.bits, read.access.tensor.bits
    configs = []
    for side_a in TILE_SIDES:
        for side_b in TILE_SIDES:
            tile = [1] * len(extents)
            tile[a], tile[last] = min(side_a, extents[a]), min(side_b, extents[last])
            grow = read.next_axis not in (None, a, last) and tile[a] < side_a
            if grow:  # a short input row (7 or 14 pixels): take several rows of the input
                tile[read.next_axis] = min(extents[read.next_axis], side_a // tile[a])
            for threads in THREADS:
                split = _thread_tile(tile, last, threads, min(MAX_GATHER_LANES, 128 // out_bits))
                if split is None or math.prod(tile) * in_bits // 8 > arch.smem_per_block:
                    continue
                thread, vec_out = split
                vec_in = largest_pow2_divisor(tile[a], max(1, LOAD_BYTES * 8 // in_bits))
                configs.append(Config("transpose", block=tuple(tile), thread=thread,
                                      vectorize=((info.write.name, vec_out), (read.access.name, vec_in)),
                                      cost=_cost(tile, a, last)))
    configs.sort(key=lambda c: (c.cost, -c.num_threads, repr(c)))
    return configs[:limit]


def _thread_tile(tile, last, threads: int, max_vec: int) -> tuple[tuple[int, ...], int] | None:
    """``(thread tile, store vector)``: each thread's share of the tile as a divisor of it per
    axis, the part along ``last`` with the widest power-of-two factor (up to ``max_vec``), the
    store vector. None when ``threads`` does not split the tile that way."""
    size = math.prod(tile)
    if size % threads:
        return None
    best = None
    for along_last in range(1, tile[last] + 1):
        rest = size // threads
        if tile[last] % along_last or rest % along_last:
            continue
        rest //= along_last
        thread = [1] * len(tile)
        thread[last] = along_last
        for i in range(len(tile)):
            if i != last:
                thread[i] = math.gcd(tile[i], rest)
                rest //= thread[i]
        vec = largest_pow2_divisor(along_last, max_vec)
        if rest == 1 and (best is None or vec > best[1]):
            best = (tuple(thread), vec)
    return best


def _cost(tile, a, last) -> float:
    """Prefer full 128-byte rows on both sides and square tiles (ranks; unmeasured)."""
    return -min(tile[a], tile[last]) - 0.01 * math.prod(tile) / 64



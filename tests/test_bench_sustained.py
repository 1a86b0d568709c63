"""benchmarks/bench_sustained.py (CPU): torch reads each case's own first two arguments, so the
layout a case names must be the one its function stores B in."""

import os
import sys

import pytest

from fastdlight.arch import CUDA

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_sustained as bench  # noqa: E402


@pytest.mark.parametrize("case", bench.CASES, ids=[c[0] for c in bench.CASES])
def test_each_case_names_the_layout_its_function_stores_b_in(case):
    name, make, _tiles, layout = case
    a, b = ([int(x) for x in p.shape] for p in make().params[:2])
    out = [int(x) for x in make().params[-1].shape]
    assert layout in ("NN", "NT")
    k, n = (b[1], b[0]) if layout == "NT" else (b[0], b[1])
    assert a[1] == k, name  # A is [M, K]; B [K, N] or, read transposed, [N, K]
    assert out[0] == a[0] and n in (out[1], 2 * out[1]), name  # the gated product halves N


def test_every_tile_of_every_case_is_a_valid_policy_config():
    """The policy emits 256x128 with a cluster along N: the same tile alone must not keep it."""
    h100 = CUDA("nvidia/nvidia-h100")
    for name, make, tiles, _layout in bench.CASES:
        func = make()
        for tile in tiles:
            c = bench.policy_config(func, h100, tile)
            if c is None:  # three consumer warpgroups come only 192 wide: the case records an error row
                assert tile[:2] == (192, 128), (name, tile)
                continue
            assert (c.block[0], c.block[1], c.warp[0], c.cluster) == tile[:4], (name, tile)
            assert c.pipeline_stages == (tile[4] if len(tile) > 4 else c.pipeline_stages)

"""Tile sizes for one axis: the extent's factors and the powers of two below it, found as fast
for an extent of 2^62 as for 4096 (trial division to the square root took 137 s there)."""

import math
import time

import pytest

from fastdlight.policies.roller import TRIAL_FACTOR_CAP, candidate_sizes, prime_factors


def by_trial_division(extent, limit=None):
    limit = extent if limit is None else min(limit, extent)
    sizes = {d for d in range(1, math.isqrt(extent) + 1) if extent % d == 0}
    sizes |= {extent // d for d in sizes}
    sizes |= {1 << p for p in range(extent.bit_length()) if 1 << p < extent}
    return sorted(s for s in sizes if s <= limit) or [1]


def test_the_same_sizes_as_trial_division_below_2_to_the_32():
    extents = [*range(1, 400), 1000, 4096 * 3, 65521 * 65521, 2**31 - 1, 4294967291, 3 * 5 * 7 * 11 * 13 * 17 * 19]
    for extent in extents:
        for limit in (None, 1, 7, 16, 128, 1024):
            assert candidate_sizes(extent, limit) == by_trial_division(extent, limit), (extent, limit)


@pytest.mark.parametrize("extent", [2**62, 2**63 - 1, 2**62 - 57, 2**40 * 3**20, 720720**3])
def test_huge_extents_are_quick(extent):
    t0 = time.perf_counter()
    sizes = candidate_sizes(extent)
    capped = candidate_sizes(extent, 256)
    assert time.perf_counter() - t0 < 1.0
    assert all(extent % s == 0 or s & (s - 1) == 0 for s in sizes) and capped == [s for s in sizes if s <= 256]
    assert 1 in sizes and max(sizes) == extent


def test_a_cofactor_beyond_the_cap_stays_one_factor():
    big = 65537 * 65537  # both factors above the cap: left as one
    assert TRIAL_FACTOR_CAP < 65537 and prime_factors(big) == [big]
    assert prime_factors(2**10 * 3 * 65537) == [2] * 10 + [3, 65537]

"""Host array work in chunks on threads: the same values as one pass, on any machine."""

import numpy as np
import pytest

from fastdlight.measure import host
from fastdlight.measure.workload import random_array


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(host, "CHUNK_ELEMENTS", 1000)


def test_chunks_cover_the_range_once():
    for n in (0, 1, host.CHUNK_ELEMENTS, host.CHUNK_ELEMENTS + 1, 3 * host.CHUNK_ELEMENTS - 7):
        covered = np.zeros(max(n, 1), dtype=int)
        for s in host.chunks(n):
            covered[s] += 1
        assert covered[:n].tolist() == [1] * n


def test_widening_and_absolute_values_match_numpy(small_chunks):
    a = np.random.default_rng(0).uniform(-3, 3, (37, 301)).astype(np.float16)
    assert len(host.chunks(a.size)) > 10
    wide = host.as_float64(a)
    assert wide.dtype == np.float64 and np.array_equal(wide, a.astype(np.float64))
    assert np.array_equal(host.absolute(wide), np.abs(wide))
    assert np.array_equal(host.as_float64(a, absolute=True), np.abs(a).astype(np.float64))
    assert np.array_equal(host.absolute(a[:, ::2]), np.abs(a[:, ::2]))  # not contiguous
    assert host.as_float64(wide) is wide


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_random_inputs_do_not_depend_on_the_thread_count(dtype, small_chunks, monkeypatch):
    shape = (33, 517)
    a = random_array(shape, dtype, np.random.default_rng(7))
    monkeypatch.setattr(host, "MAX_THREADS", 1)
    b = random_array(shape, dtype, np.random.default_rng(7))
    c = random_array(shape, dtype, np.random.default_rng(8))
    assert a.shape == shape and np.array_equal(a, b) and not np.array_equal(a, c)
    assert -1 <= a.min() < -0.9 and 0.9 < a.max() <= 1  # rounded to fp16/bf16: 1 itself
    # every chunk draws its own values: no two chunks repeat each other
    flat = a.reshape(-1)
    assert not np.array_equal(flat[:1000], flat[1000:2000])

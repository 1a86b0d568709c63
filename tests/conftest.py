"""Shared test fixtures: GPU detection and the compile-to-cubin helper."""

import pytest

from fastdlight.arch import auto_arch, has_gpu

HAS_GPU = has_gpu()


def _needs_gpu(item) -> bool:
    return "gpu" in item.keywords or "hopper_arch" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        # GPU tests time kernels: under pytest-xdist's --dist loadgroup they all run in one
        # worker, so no two of them time on the GPU at once
        for item in items:
            if _needs_gpu(item):
                item.add_marker(pytest.mark.xdist_group("gpu"))
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (tvm.cuda(0).exist is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def hopper_arch():
    """The live GPU's hardware model where it has wgmma (sm_90a); the test is skipped elsewhere."""
    if not HAS_GPU:
        pytest.skip("no CUDA GPU")
    arch = auto_arch()
    if not arch.has_wgmma:
        pytest.skip(f"{arch.arch}: no wgmma")
    return arch

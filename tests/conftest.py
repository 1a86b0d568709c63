"""Shared test fixtures: GPU detection and the compile-to-cubin helper."""

import pytest

from fastdlight.arch import has_gpu

HAS_GPU = has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (tvm.cuda(0).exist is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

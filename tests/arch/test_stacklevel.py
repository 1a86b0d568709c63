"""Warnings name the line that called into fastdlight, whatever the depth of the call."""

import inspect
import warnings

from fastdlight.arch import CUDA
from fastdlight.arch.stacklevel import caller_stacklevel


def warn_here():
    warnings.warn("from a test frame", stacklevel=caller_stacklevel())


def test_outside_the_package_the_warning_is_the_callers_own_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_here()
    # this file is not fastdlight's: stacklevel 1, the warn call itself
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, warn_here.__code__.co_firstlineno + 1)]


def test_through_several_package_frames_it_names_the_caller():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        here = inspect.currentframe().f_lineno + 1
        CUDA("cuda -arch=sm_86")  # CUDA() -> _spec_for_target -> warn: a generic arch
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, here)]

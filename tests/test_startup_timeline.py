"""benchmarks/startup_timeline.py (CPU): it wraps the tuner's internals by name, so a rename there
must fail here rather than on a GPU machine."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import startup_timeline as timeline  # noqa: E402


def test_every_traced_function_exists():
    missing = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in timeline.TRACED
               if not callable(getattr(owner, name, None))]
    assert not missing


def test_a_wrapped_static_method_is_still_called_without_an_instance():
    class Owner:
        @staticmethod
        def double(x):
            return 2 * x

    trace = timeline.Trace()
    trace.wrap(Owner, "double")
    assert Owner().double(3) == 6 and Owner.double(4) == 8
    assert [e[1] for e in trace.events] == ["Owner.double", "Owner.double"]


def test_both_case_lists_make_their_functions():
    for name, make in timeline.GEMM_CASES[:1] + timeline.SOFTMAX_CASES[:1]:
        assert make().params, name

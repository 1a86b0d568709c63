"""Run the GPU tests of test_apply_and_build.py without pytest (for machines that lack it).

    python tests/search/gpu_smoke.py
"""

import os
import sys
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]

if "pytest" not in sys.modules:
    try:
        import pytest  # noqa: F401
    except ImportError:  # a stub good enough for importing the test module
        stub = types.ModuleType("pytest")

        class _Mark:
            def __getattr__(self, name):
                if name == "parametrize":
                    def parametrize(names, values, ids=None):
                        def deco(fn):
                            fn._params = values
                            return fn
                        return deco
                    return parametrize
                return lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda fn: fn))

        stub.mark = _Mark()
        stub.raises = stub.warns = None
        sys.modules["pytest"] = stub

import test_apply_and_build as t  # noqa: E402


def main() -> int:
    failed = 0
    for name in dir(t):
        if not name.startswith("test_gpu_"):
            continue
        fn = getattr(t, name)
        params = getattr(fn, "_params", None)
        if params is None:  # real pytest: read the parametrize mark
            params = [v for m in getattr(fn, "pytestmark", []) if m.name == "parametrize" for v in m.args[1]]
        for args in [(p,) for p in params] or [()]:
            try:
                fn(*args)
                print(f"PASS {name}{'' if not args else ' ' + str(args[0])}", flush=True)
            except Exception:  # noqa: BLE001
                failed += 1
                print(f"FAIL {name}", flush=True)
                traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

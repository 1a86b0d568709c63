"""Build, time, verify and pick: ``apply_and_build`` and the one-call ``tune``.

``fastdlight.tune`` is itself callable (``fastdlight.tune(func)`` == ``fastdlight.tune.tune(func)``)
so the top-level export ``fastdlight.tune`` and this subpackage can share the name.
Submodules are imported lazily: worker processes import only what they need.
"""

import sys
import types

_LAZY = {
    "apply_and_build": ".runner",
    "CompileResult": ".candidate",
    "TuneOptions": ".options",
    "TuningError": ".runner",
    "format_table": ".report",
    "tune": ".tuner",
    "tune_dispatch": ".tuner",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from .tuner import tune

        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

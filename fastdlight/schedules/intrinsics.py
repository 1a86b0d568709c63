"""TVM's CUDA tensor intrinsics, registered one by one as schedules name them.

Importing ``tvm.s_tir.tensor_intrin.cuda`` registers all 91 of its ldmatrix / mma / wmma
intrinsics: 182 TVMScript parses, 1.4 s on one core and 2-3 s while 16 build workers start at
once. Every build worker that takes an mma.sync candidate or stock Dlight at sm_80/sm_90 paid
it before its first compile, and a schedule uses five of them.

:func:`load_deferred` runs that module with each top-level ``TensorIntrin.register(NAME, ...)``
statement set aside under the value of NAME (0.04 s); :func:`ensure` runs the statements of the
names given. The module's ``get_*_intrin_group`` functions, which Dlight's tensor-core rules
call for the names they tensorize with, register what they return. Only build workers load the
module this way: in any other process something may look an intrinsic up by name without
asking for it first (MetaSchedule does, from C++), so there the module is imported as is.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import inspect
import linecache
import sys
import threading
from collections.abc import Iterable

MODULE = "tvm.s_tir.tensor_intrin.cuda"
#: the statements :func:`load_deferred` set aside, by intrinsic name, until registered
_DEFERRED: dict[str, ast.Module] = {}
_LOCK = threading.RLock()


@contextlib.contextmanager
def cheap_inspect_stack():
    """Make ``inspect.stack()`` cheap while TVMScript parses many functions.

    Each ``@T.prim_func`` calls ``inspect.stack()``, whose per-frame source lookup
    (``inspect.getmodule`` scans all of ``sys.modules``) is ~90% of the time of importing
    ``tvm.s_tir.tensor_intrin.cuda`` (~35 s on 2 cores). The parser only needs the frames, their
    locals and the current source line of each, which ``linecache`` gives cheaply."""
    original = inspect.stack

    def stack(context: int = 1):
        frame, infos = sys._getframe(1), []
        while frame is not None:
            code, lineno = frame.f_code, frame.f_lineno
            line = linecache.getline(code.co_filename, lineno) if context > 0 else ""
            infos.append(inspect.FrameInfo(frame, code.co_filename, lineno, code.co_name,
                                           [line] if line else None, 0 if line else None))
            frame = frame.f_back
        return infos

    inspect.stack = stack
    try:
        yield
    finally:
        inspect.stack = original


def _is_register(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and bool(stmt.value.args)
            and ast.unparse(stmt.value.func) == "TensorIntrin.register")


def load_deferred() -> None:
    """Put TVM's CUDA intrinsics module in ``sys.modules`` with its registrations deferred.
    Nothing happens where the module is already imported (either way). The package's
    ``__init__`` is skipped: it imports this module as is, and parses the x86, ARM, ROCm,
    Hexagon and RISC-V intrinsics, which a CUDA build never uses."""
    with _LOCK:
        if MODULE in sys.modules:
            return
        package = MODULE.rpartition(".")[0]
        if package not in sys.modules:
            _bare_package(package)
        spec = importlib.util.find_spec(MODULE)
        tree = ast.parse(spec.loader.get_source(MODULE), spec.origin)
        registers = [s for s in tree.body if _is_register(s)]
        rest = ast.Module([s for s in tree.body if not _is_register(s)], type_ignores=[])
        module = importlib.util.module_from_spec(spec)
        with cheap_inspect_stack():
            exec(compile(rest, spec.origin, "exec"), module.__dict__)  # noqa: S102 - TVM's own source
        for stmt in registers:
            name = eval(compile(ast.Expression(stmt.value.args[0]), spec.origin, "eval"), module.__dict__)  # noqa: S307
            _DEFERRED[name] = ast.Module([stmt], type_ignores=[])
        for attr, value in list(vars(module).items()):
            if attr.startswith("get_") and attr.endswith("_intrin_group") and callable(value):
                setattr(module, attr, _registering(value))
        sys.modules[MODULE] = module
        setattr(sys.modules[package], "cuda", module)


def _bare_package(name: str) -> None:
    """Make package ``name`` importable as a parent without running its ``__init__``."""
    spec = importlib.util.find_spec(name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)


def _registering(group):
    @functools.wraps(group)
    def wrapper(*args, **kwargs):
        names = group(*args, **kwargs)
        ensure(names.values())
        return names

    return wrapper


def ensure(names: Iterable[str]) -> None:
    """Register those of ``names`` that :func:`load_deferred` set aside (others: nothing)."""
    with _LOCK:
        todo = [n for n in dict.fromkeys(names) if n in _DEFERRED]
        if not todo:
            return
        from tvm.s_tir import TensorIntrin

        module = sys.modules[MODULE]
        with cheap_inspect_stack():
            for name in todo:
                if TensorIntrin.get(name, allow_missing=True) is None:  # else registered elsewhere
                    exec(compile(_DEFERRED[name], module.__file__, "exec"), module.__dict__)  # noqa: S102
                del _DEFERRED[name]


def ensure_all() -> None:
    """Register every intrinsic still set aside (a MetaSchedule trace names them from C++)."""
    ensure(list(_DEFERRED))


def deferred() -> frozenset[str]:
    """The names set aside and not registered yet."""
    with _LOCK:
        return frozenset(_DEFERRED)

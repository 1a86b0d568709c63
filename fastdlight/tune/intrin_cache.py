"""TVM's CUDA tensor intrinsics, registered from a file instead of 182 TVMScript parses.

Importing ``tvm.s_tir.tensor_intrin.cuda`` registers 91 ldmatrix/mma/wmma intrinsics, each a
pair of PrimFuncs written in TVMScript and parsed at import: about 1.5 s alone, 2-3 s in each
of the build workers that start together (the mma.sync candidates' critical path in a process's
first tune). The first worker to import it records every registration and saves the pairs with
``tvm.ir.save_json``; later ones run the module without its top-level ``TensorIntrin.register``
statements (its functions and constants are all the templates use) and register the saved
pairs, which load in about 0.25 s. The file is keyed by TVM's version and the module's source,
and is checked against the names the module registers: a missing, stale or unreadable one is
ignored and the module imported as it is.

The file lives in ``$FASTDLIGHT_CACHE_DIR`` (else ``$XDG_CACHE_HOME/fastdlight``, else
``~/.cache/fastdlight``); where it cannot be written, every import takes the slow way.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile

import tvm

MODULE = "tvm.s_tir.tensor_intrin.cuda"
#: ``FASTDLIGHT_CACHE_DIR``: where fastdlight keeps files it can make again
CACHE_ENV = "FASTDLIGHT_CACHE_DIR"


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(CACHE_ENV) or os.path.join(base, "fastdlight")


def cache_path(source: str) -> str:
    key = hashlib.sha256(f"{tvm.__version__}\0{source}".encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), f"tensor_intrin_cuda_{key}.json")


def import_module() -> None:
    """Import :data:`MODULE` (its parent package already in ``sys.modules``), its intrinsics
    from the cache where one matches."""
    if MODULE in sys.modules:
        return
    spec = importlib.util.find_spec(MODULE)
    source = spec.loader.get_source(MODULE)
    path = cache_path(source)
    body, registers = _split(ast.parse(source, spec.origin))
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        exec(compile(ast.Module(body, []), spec.origin, "exec"), module.__dict__)  # noqa: S102
        names = [eval(compile(ast.Expression(r.value.args[0]), spec.origin, "eval"), module.__dict__)  # noqa: S307
                 for r in registers]
        pairs = _load(path, names)
        if pairs is None:
            pairs = _parse(registers, module, spec.origin)
            _save(path, names, pairs)
        from tvm.s_tir import TensorIntrin

        for name, (desc, impl) in zip(names, pairs):
            TensorIntrin.register(name, desc, impl)
    except BaseException:
        del sys.modules[MODULE]
        raise
    parent, _, child = MODULE.rpartition(".")
    setattr(sys.modules[parent], child, module)


def _split(tree: ast.Module) -> tuple[list[ast.stmt], list[ast.Expr]]:
    """The module's statements without its top-level ``TensorIntrin.register(...)`` calls, and those."""
    def is_register(st):
        return (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
                and ast.unparse(st.value.func) == "TensorIntrin.register")

    return [st for st in tree.body if not is_register(st)], [st for st in tree.body if is_register(st)]


def _parse(registers: list[ast.Expr], module, origin: str) -> list[tuple]:
    """Each registration's (desc, impl), made as the module makes them: its generators parse them."""
    pairs = []
    for r in registers:
        args = ast.Tuple(r.value.args[1:], ast.Load())
        pair = eval(compile(ast.fix_missing_locations(ast.Expression(args)), origin, "eval"), module.__dict__)  # noqa: S307
        pairs.append(tuple(pair))
    return pairs


def _load(path: str, names: list[str]) -> list[tuple] | None:
    try:
        with open(path) as f:
            saved = tvm.ir.load_json(f.read())
        if [str(n) for n in saved[0]] != names or len(saved[1]) != 2 * len(names):
            return None
        return [(saved[1][2 * i], saved[1][2 * i + 1]) for i in range(len(names))]
    except Exception:  # noqa: BLE001 - a missing, partial or foreign file: parse instead
        return None


def _save(path: str, names: list[str], pairs: list[tuple]) -> None:
    """Written to a temporary file and renamed: workers starting together never read half a file."""
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(tvm.ir.save_json([names, [f for pair in pairs for f in pair]]))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

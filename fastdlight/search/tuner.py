"""``tune(func)``: arch → policy → apply_and_build in one call."""

from __future__ import annotations

from fastdlight.analysis.prepare import as_prim_func
from fastdlight.arch import CUDA, auto_arch
from fastdlight.search.candidates import tune_function
from fastdlight.search.database import TuningDatabase
from fastdlight.search.dynamic import check_dispatch
from fastdlight.search.dynamic import tune_dispatch as tune_points
from fastdlight.search.options import TuneOptions
from fastdlight.search.results import CompileResult


def tune(func, target=None, topk: int = 20, options: TuneOptions | None = None, *, opt_shapes: dict | None = None,
         database=None, **overrides) -> tuple[list[CompileResult], CompileResult]:
    """Tune ``func`` (a PrimFunc, or an IRModule holding one) for ``target`` (a Target, tag,
    :class:`CUDA`; default: the live GPU, else the H100 model). Tensor-core eligible matmuls use
    :class:`TensorCorePolicy`; if none of its configs works, the CUDA-core :class:`DefaultPolicy`
    is tried. ``opt_shapes`` gives
    symbolic dimensions a value. ``database``: a :class:`fastdlight.search.database.TuningDatabase`
    (or its directory) to replay from and store a verified winner in; a directory that cannot
    be used raises :class:`~fastdlight.search.database.DatabaseError` before any tuning.
    ``options``/keywords: :class:`TuneOptions`. Returns ``(ranked results, best)``; a database
    hit gives ``([best], best)`` with ``best.origin == "database"``, the stored config and
    time (rebuilt and retimed with ``recheck_database`` on a GPU). Raises :class:`TuningError`
    when nothing could be used."""
    func = as_prim_func(func)
    arch, opts, database = _setup(target, topk, options, database, overrides)
    tuned = tune_function(func, arch, topk, opts, opt_shapes=opt_shapes, db=database)
    return list(tuned.results), tuned.best


def tune_dispatch(func, target=None, topk: int = 20, options: TuneOptions | None = None, *,
                  opt_shapes: dict | None = None, database=None, check: bool = True, **overrides):
    """Tune a function with symbolic dimensions: a kernel at each value of ``opt_shapes``
    (``{"m": [1, 16, 128, 2048]}``; a variable left out gets
    :func:`fastdlight.search.dynamic.default_points`), each compiled with the dimension still
    symbolic, behind one dispatcher PrimFunc with the function's signature. Returns
    ``(Dispatched, checks)``: with a GPU and ``check``, ``checks`` verifies the dispatcher at
    every tuned value, inside each range and above the largest, and times it at the tuned
    values (:class:`fastdlight.search.dynamic.DispatchCheck`)."""
    func = as_prim_func(func)
    arch, opts, database = _setup(target, topk, options, database, overrides)
    dispatched = tune_points(func, arch, topk, opts, opt_shapes, db=database)
    checks = check_dispatch(dispatched, func, arch, opts) if check else []
    return dispatched, checks


def _setup(target, topk: int, options, database, overrides) -> tuple[CUDA, TuneOptions, TuningDatabase | None]:
    """The arch, options and database of a call; a bad ``topk`` or option is refused first."""
    if topk <= 0:
        raise ValueError(f"topk must be positive, got {topk}")
    opts = TuneOptions.of(options, **overrides)
    arch = target if isinstance(target, CUDA) else auto_arch(target)
    if database is not None and not isinstance(database, TuningDatabase):
        database = TuningDatabase(database)
    return arch, opts, database

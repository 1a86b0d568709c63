"""Run a built kernel on the GPU and compare it with its op's float64 reference.

Reusable by any GPU test::

    from gpu_util import run_and_check        # tests/ is on sys.path (tests/conftest.py)
    built = fastdlight.compiler.compile.build(sch.mod, "cuda")   # or any target of the live GPU
    err = run_and_check(built, op)             # asserts err <= tol, returns err

Inputs are random (uniform in [-1, 1] for floats, small integers for ints — never all zeros);
the output is poisoned (NaN / a sentinel) first, so an output element the kernel never writes
fails the check. The error is ``||out - ref|| / ||ref||`` in float64.
"""

from __future__ import annotations

import numpy as np
import tvm

from fastdlight.compiler.compile import build
from fastdlight.schedules import dispatch_config

#: default relative-norm tolerance per output dtype
TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2, "int32": 0.0, "int8": 0.0}


def func_of(op_or_func):
    return getattr(op_or_func, "func", op_or_func)


def param_specs(func) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each parameter of a PrimFunc, in order (the last one is the output)."""
    specs = []
    for p in func.params:
        # TVM 0.27: params are buffer-typed vars carrying shape/dtype (no buffer_map)
        buf = func.buffer_map[p] if hasattr(func, "buffer_map") else p
        specs.append((tuple(int(d) for d in buf.shape), str(buf.dtype)))
    return specs


def random_inputs(func, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for shape, dtype in param_specs(func)[:-1]:
        if dtype.startswith("float") or dtype.startswith("bfloat"):
            a = rng.uniform(-1.0, 1.0, size=shape)
            arrays.append(a.astype("float32" if dtype == "bfloat16" else dtype))
        else:
            arrays.append(rng.integers(-8, 8, size=shape).astype(dtype))
    return arrays


def poisoned_output(func) -> np.ndarray:
    shape, dtype = param_specs(func)[-1]
    if dtype.startswith("float"):
        return np.full(shape, np.nan, dtype=dtype)
    return np.full(shape, np.iinfo(dtype).min, dtype=dtype)


def kernel_name(func) -> str:
    return str(func.attrs["global_symbol"])


def get_function(built, name: str):
    """The callable for ``name`` in what ``fastdlight.compiler.compile.build`` returned (an
    Executable: its ``.mod``) or in a plain runtime Module."""
    mod = built.mod if hasattr(built, "mod") and not callable(getattr(built, "get_function", None)) else built
    return mod[name]


def run(built, func, inputs: list[np.ndarray], dev=None) -> np.ndarray:
    """Call the built module's function (by the PrimFunc's global symbol) on ``inputs``."""
    dev = dev or tvm.cuda(0)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    out = tvm.runtime.tensor(poisoned_output(func), dev)
    get_function(built, kernel_name(func))(*args, out)
    dev.sync()
    return out.numpy()


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    out = out.astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64).reshape(out.shape)
    if not np.all(np.isfinite(out)):
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def run_and_check(built, op, tol: float | None = None, seed: int = 0, dev=None) -> float:
    """Run ``built`` on random inputs, compare with ``op.reference`` (float64) by relative norm,
    assert it is within ``tol`` (default by output dtype, see TOLERANCE); return the error."""
    func = func_of(op)
    inputs = random_inputs(func, seed)
    out = run(built, func, inputs, dev)
    ref = op.reference(*inputs)
    err = relative_error(out, ref)
    if tol is None:
        tol = TOLERANCE.get(param_specs(func)[-1][1], 1e-2)
    assert err <= tol, f"{getattr(op, 'name', kernel_name(func))}: relative error {err:.3g} > {tol:g}"
    return err


def check_configs(op, configs, arch) -> None:
    """Each of ``configs`` scheduled by its own template (no fallback), built for ``arch`` and
    checked against ``op.reference`` (see :func:`run_and_check`)."""
    assert configs
    for config in configs:
        with arch.target:
            result = dispatch_config(func_of(op), config, allow_fallback=False)
        run_and_check(build(result.schedule.mod, arch.target), op)

"""Strict, per-element verification of a candidate's outputs against an independent reference.

Every element of every output is checked. NaN/Inf where the reference is finite fails, except
an infinity of the reference's sign where the exact value overflows a narrow float the function
computes in (fp16 beyond 65504: what its own arithmetic gives); a NaN reference element accepts
only NaN, an infinite one only the same infinity; integer
and bool outputs must match exactly. A failure says how many elements failed, of how many,
and the worst one (index, got, expected, allowed).

Each float output is checked with one of two bounds, chosen per output by :func:`output_kinds`:

* **sum of products** (matmul, conv, GEMV, sum reductions, and epilogues that keep the bound)::

      |out - ref| <= u(acc) * (C_MAGNITUDE * S + C_DRIFT * sqrt(K) * |ref|)
                     + C_OUT * u(narrow) * |ref|  +  FLOOR

  plus ``C_OUT * u(inner) * S`` where an intermediate buffer holds a float coarser than the
  accumulator: fp32 sum -> fp16 -> + bias rounds the sum relative to the sum, which the bias
  may cancel in ref (S bounds the sum).

  S is the reference run on |inputs| (the sum of |every term|); K the number of additions on
  the way (the summed extents of the sum reductions feeding the output); acc the least
  precise dtype those sums are carried in (integer sums are exact: u = 0); narrow the least
  precise float any value feeding the output is rounded to (the output buffer included, the
  exact input values excluded).
* **elementwise** (no reduction, max/min reductions, softmax/norm chains, anything else)::

      |out - ref| <= C_REL * (u(narrow) + u(acc) * sqrt(K)) * (|ref| + rms(ref))  +  FLOOR

  K and acc as above but over every accumulating reduction (max/min are exact and count
  nothing): internal sums (a softmax's row sum, a norm's variance) add their relative error.
  rms(ref), the output's own scale, is the absolute part: elements near zero (a GELU of a
  small input, a normalized value near the mean) are judged at that scale, not at |ref|.

Why that accumulation bound. Adding term j rounds the partial sum P_j, by at most u·|P_j|
with a sign that is as good as random; the error is ~u·sqrt(sum_j P_j^2). Write P_j as a
drift toward the result, (j/K)·ref, plus a random walk of the terms' signs:

* the random walk gives ~u·K·rms(term) ~ u·S whatever K is: measured below 3.1·u·S for
  serial fp16 and fp32 accumulation of zero-mean, relu'd and 95 %-sparse products at
  K = 256, 4096 and 16384 (numpy simulation, 1024-8192 sums each; the K = 4096 matmuls and
  the K = 16384 sum of squares are in tests/tune/test_verify.py). In any other order
  (split-K, tree, tensor-core partial sums) partial sums are smaller, and so is the error;
* the drift gives ~u·sqrt(K)·|ref|, the part that grows with K: one-signed sums (sums of
  squares, |x|·|y|) measured below 1.5·u·(S + sqrt(K)·|ref|) in fp32 at K up to 16384, and
  below 3 in fp16 at K = 4096, where partial sums so large swamp the terms.

K·u·S, the deterministic worst case (every rounding the same way), never happens with round
to nearest and is vacuous for fp16 (2·S at K = 4096). sqrt(K)·u·S (Higham & Mary, SIAM J.
Sci. Comput. 2019) covers both parts at once, but is sqrt(K) times the error of zero-mean
sums, the usual case (the inputs are zero-mean random), so it hides wrong elements up to
that size; and with a multiplier of 1 a serial fp32 sum of squares exceeds it (1.5×).

Constants (one place; the reasoning)

  ===============  ====================================================================
  u(dtype)         unit roundoff, half an ulp at 1: fp16 2^-11, bf16 2^-8, fp32 2^-24,
                   fp64 2^-53, integers 0 (exact sums).
  C_MAGNITUDE 16   5× the largest random-walk error measured (3.1·u·S), for tails over
                   10^8 output elements. At fp32, K = 4096 (S ~ K/4 = 1024, outputs
                   ~21 rms) the bound is ~1e-3 absolute: a sign flip, a zeroed row or
                   tile, a wrong-row read, a dropped K tile are all off by ~1 or more.
                   At fp16 accumulation (the TIR says so) it is ~10: such kernels are
                   that imprecise; the wrong elements above ~5 in size stand out.
  C_DRIFT 4        2.7× the largest one-signed drift measured in fp32 (1.5), 1.3× the
                   fp16 one (3, at K = 4096; fp16 one-signed sums much longer than that
                   are garbage in any order and are not accepted).
  C_OUT 2          the stored result is rounded once (u·|ref|, half an ulp, for an fp16
                   or bf16 output) and once more in an epilogue (a cast before a bias).
  C_REL 8          a few roundings per elementwise chain (GELU: ~8 fp16 operations),
                   fast-math intrinsics (__expf, __logf: 2-3 fp32 ulps, i.e. 4-6 u),
                   and internal one-signed sums (a softmax row sum: 1.5·u·sqrt(K)).
  FLOOR 1e-6       absolute: far below any fp16 normal (6.1e-5) and realistic fp16/bf16/
                   fp32 error, above fp32 noise on outputs that cancel to ~0.
  ===============  ====================================================================

Which outputs are sums of products (:func:`output_kinds`). The blocks feeding the output
(those writing it and, transitively, every buffer they read) must hold at least one reduction,
every reduction must add into itself (``acc = acc + x``), and every value stored or bound
must be built from loads, +, ×, casts (of floats, or of unsigned/bool loads), non-negative
constants, division by a positive constant, max of such values, and select/if_then_else whose
condition reads no float or signed data. For exactly those, running the function on |inputs|
(:func:`magnitude_inputs`) gives S >= |every partial sum| (|max(a, b)| <= max(|a|, |b|)).
min, subtraction, negative constants, data-dependent selects, transcendental calls, and bit
operations break it (min(|x|, c) and |x| - 7 say nothing about |min(x, c)| and |x - 7|):
those outputs use the elementwise bound. The decision reads the TIR blocks directly rather
than :func:`fastdlight.analysis.func_info.analyze`, which classifies only the anchor block,
needs dlight normalization and refuses reductions to a scalar.

The function's own arithmetic. An elementwise chain through a 16-bit float can cancel: GPT-2's
tanh GELU computes ``0.5 x (1 + tanh(...))`` in fp16, and where tanh is near -1 the rounding of
1 + tanh (u relative to 1) is 4 % of the result, beyond the bound above, in every correct
schedule. For such outputs the reference module also holds the function in its own dtypes
under the same naive schedule; its distance from the float64 result is what the function's
arithmetic gives at that element, and the bound there is at least ``C_OWN`` times it. A wrong
element (a misplaced index, a dropped term) is off by the size of the values, far beyond both.

Limits. A NaN reference element (log of a negative input) accepts the NaN poison, i.e. an
element never written. The drift term follows |ref|: an epilogue adding two large one-signed
sums that cancel would be rejected (falsely). fp16/bf16 constants keep the value they were
written with in the float64 twin (within one fp16 rounding, which C_OUT and C_REL allow).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from tvm import tirx

from fastdlight.measure import host
from fastdlight.measure.check_kinds import (  # noqa: F401 - part of this module's API
    UNIT_ROUNDOFF,
    absolute_inputs,
    take_absolute,
    CheckKind,
    check_kind,
    expr_dtype,
    is_float,
    output_kinds,
    unit_roundoff,
    walk_exprs,
    wants_own_dtype_run,
)
from fastdlight.measure.workload import output_indices, param_buffers, static_shape

#: multiplier of u·S, the random-walk part of an accumulation's error (module docstring)
C_MAGNITUDE = 16.0
#: multiplier of u·sqrt(K)·|ref|, the drift part of an accumulation's error
C_DRIFT = 4.0
#: roundings of the stored result (the final cast, plus one in an epilogue)
C_OUT = 2.0
#: roundings allowed per element of an elementwise chain, relative to u
C_REL = 8.0
#: absolute floor on every float bound
FLOOR = 1e-6
#: multiple of the function's own-dtype error a candidate may show at an element (a schedule
#: may contract a multiply-add or vectorize where the naive one did not)
C_OWN = 8.0


# -- the data passed between stages -----------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """Where the expected outputs came from. ``name`` is shown in verdicts and stored with a
    tuning record; ``source`` is ``"numpy"`` (a float64 numpy function of the inputs) or
    ``"naive"`` (the function widened to float64 under a naive schedule)."""

    name: str
    source: str


NUMPY_REFERENCE = Reference("float64 numpy reference", "numpy")
NAIVE_REFERENCE = Reference("naive float64 schedule of the function", "naive")


@dataclass(frozen=True, eq=False)
class Expected:
    """What a candidate must produce, per output: the reference values, S (the reference on
    |inputs|; None where the output is not a sum of products), the check, the output dtype
    (a bf16 output arrives as float32 values: the dtype comes from the function); and where
    the reference came from."""

    outputs: tuple[np.ndarray, ...]
    magnitudes: tuple[np.ndarray | None, ...]
    kinds: tuple[CheckKind, ...]
    out_dtypes: tuple[str, ...]
    source: Reference
    #: per output, |the function run in its own dtypes - reference| (None: not run; see
    #: :func:`wants_own_dtype_run`)
    own_errors: tuple[np.ndarray | None, ...] = ()

    @property
    def reference(self) -> str:
        return self.source.name


@dataclass(frozen=True)
class Verdict:
    """The result of checking one candidate: ``bad`` of ``total`` elements out of bound, the
    worst one described (``""`` when none), a one-line message, and the reference's name."""

    ok: bool
    bad: int
    total: int
    worst: str
    message: str
    reference: str

    @classmethod
    def passed(cls, reference: str, message: str, total: int = 0) -> Verdict:
        return cls(True, 0, total, "", message, reference)

    @classmethod
    def failed(cls, message: str, reference: str, bad: int = 0, total: int = 0, worst: str = "") -> Verdict:
        return cls(False, bad, total, worst, message, reference)


# -- comparing ---------------------------------------------------------------------------------
def allowed_error(ref: np.ndarray, mag: np.ndarray | None, kind: CheckKind, out_dtype: str,
                  rms: float | None = None) -> np.ndarray:
    """The largest |out - ref| accepted per element (float outputs; see the module docstring).
    ``rms``: that of the whole reference output, where ``ref`` is a part of it."""
    ref = np.asarray(ref, dtype=np.float64)
    narrow = max(unit_roundoff(out_dtype), unit_roundoff(kind.narrow_dtype))
    if kind.sum_of_products and mag is not None:
        # u_acc (C_MAGNITUDE S + C_DRIFT sqrt(k) |ref|) + C_OUT (narrow |ref| + inner S) + FLOOR,
        # gathered per array and computed in place (outputs of 67M elements: seconds otherwise).
        # An intermediate rounded more coarsely than the accumulator (fp32 sum -> fp16, then +
        # bias) errs relative to its own value, which the bias may cancel in ref: S bounds it
        inner = unit_roundoff(kind.inner_dtype) if unit_roundoff(kind.inner_dtype) > unit_roundoff(kind.acc_dtype) else 0.0
        u_acc = unit_roundoff(kind.acc_dtype)
        allowed = np.abs(np.asarray(mag, dtype=np.float64))
        allowed *= u_acc * C_MAGNITUDE + C_OUT * inner
        of_ref = np.abs(ref)
        of_ref *= u_acc * C_DRIFT * math.sqrt(kind.k) + C_OUT * narrow
        allowed += of_ref
        allowed += FLOOR
        return allowed
    rtol = C_REL * (narrow + unit_roundoff(kind.acc_dtype) * math.sqrt(kind.k))
    rms = _rms(ref.reshape(-1)) if rms is None else rms
    return rtol * (np.abs(ref) + rms) + FLOOR


@dataclass(frozen=True)
class _OutputCheck:
    bad: int
    score: float  # the worst element's |out - ref| / allowed (inf: non-finite or exact mismatch)
    worst: str


#: the largest finite value of each narrow float dtype
MAX_FINITE = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def _overflowed(out64: np.ndarray, ref64: np.ndarray, allowed: np.ndarray, kind: CheckKind) -> np.ndarray:
    """Infinities the function's own dtypes produce: where the exact value (within its bound)
    lies beyond the largest finite value of a narrow dtype it passes through (an fp16
    batch-norm epilogue of a random-weight model reaching -66578), an infinity of the same sign
    is what fp16 arithmetic gives; the float64 reference does not overflow."""
    limit = min((MAX_FINITE.get(d, math.inf) for d in (kind.narrow_dtype, kind.inner_dtype)), default=math.inf)
    return np.isinf(out64) & (np.sign(out64) == np.sign(ref64)) & (np.abs(ref64) + allowed >= limit)


def _check_one(out: np.ndarray, ref: np.ndarray, mag: np.ndarray | None, kind: CheckKind,
               out_dtype: str, own_err: np.ndarray | None = None) -> _OutputCheck:
    """Elements of one output out of bound, and the worst one."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        return _OutputCheck(max(out.size, 1), math.inf, f"shape {out.shape} != expected {ref.shape}")
    o_all, r_all = host.flat(out), host.flat(ref)
    m_all = host.flat(mag) if mag is not None else None
    e_all = host.flat(own_err) if own_err is not None else None
    floats = is_float(out_dtype)
    rms = _rms(r_all) if floats and not (kind.sum_of_products and mag is not None) else 0.0

    def allowed(r, m, e=None):
        if not floats:
            return np.zeros_like(r)
        bound = allowed_error(r, m, kind, out_dtype, rms)
        return bound if e is None else np.maximum(bound, C_OWN * np.nan_to_num(e, nan=0.0, posinf=0.0))

    def part(arr, s):
        return arr[s] if arr is not None else None

    def plain_failures(_, s):  # one chunk: the plain bound, finite references only
        o, r = np.asarray(o_all[s], dtype=np.float64), np.asarray(r_all[s], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.abs(o - r) <= allowed(r, part(m_all, s), part(e_all, s))
        ok &= np.isfinite(r)
        return np.flatnonzero(~ok) + s.start

    bad = np.concatenate(host.map_chunks(plain_failures, o_all.size))
    if not bad.size:
        return _OutputCheck(0, 0.0, "")
    # the rules for infinities and NaNs, on the elements that failed the plain bound (few)
    o = np.asarray(o_all[bad], dtype=np.float64)
    r = np.asarray(r_all[bad], dtype=np.float64)
    a = allowed(r, part(m_all, bad), part(e_all, bad))
    finite = np.isfinite(r)
    same_special = (o == r) | (np.isnan(r) & np.isnan(o))
    keep = ~np.where(finite, _overflowed(o, r, a, kind), same_special)
    bad, o, r, a, finite = bad[keep], o[keep], r[keep], a[keep], finite[keep]
    if not bad.size:
        return _OutputCheck(0, 0.0, "")
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.abs(o - r)
        score = np.where(finite & np.isfinite(d), d / np.maximum(a, 1e-300), np.inf)
    w = int(np.argmax(score))
    idx = tuple(int(i) for i in np.unravel_index(int(bad[w]), out.shape))
    return _OutputCheck(int(bad.size), float(score[w]),
                        f"worst at {idx}: got {o[w]:.6g}, expected {r[w]:.6g} (allowed ±{a[w]:.3g})")


def _rms(ref: np.ndarray) -> float:
    """The root mean square of the finite elements, summed chunk by chunk."""
    def part(_, s):
        r = np.asarray(ref[s], dtype=np.float64)
        r = r[np.isfinite(r)]
        return float(np.dot(r, r)), r.size

    parts = host.map_chunks(part, ref.size)
    count = sum(n for _, n in parts)
    return math.sqrt(sum(q for q, _ in parts) / count) if count else 0.0


def check_outputs(outputs: Sequence[np.ndarray], expected: Expected,
                  out_dtypes: Sequence[str] | None = None) -> Verdict:
    """Every element of every output within its bound, or a verdict saying how many were not
    and which was worst. ``out_dtypes`` defaults to ``expected.out_dtypes``."""
    dtypes = tuple(out_dtypes) if out_dtypes is not None else expected.out_dtypes
    if len(outputs) != len(expected.outputs):
        return Verdict.failed(f"{len(outputs)} outputs, the reference gave {len(expected.outputs)}",
                              expected.reference)
    total = sum(int(np.size(o)) for o in outputs)
    own = expected.own_errors or (None,) * len(outputs)
    checks = [_check_one(o, r, m, k, d, e) for o, r, m, k, d, e in
              zip(outputs, expected.outputs, expected.magnitudes, expected.kinds, dtypes, own)]
    bad = sum(c.bad for c in checks)
    if not bad:
        bounds = " / ".join(sorted({k.bound for k in expected.kinds}))
        return Verdict.passed(expected.reference, f"all {total} elements within the {bounds}", total)
    i = max(range(len(checks)), key=lambda j: checks[j].score)
    worst = checks[i].worst
    if len(checks) > 1:
        worst = f"output {expected.kinds[i].output or i}: {worst}"
    return Verdict.failed(f"{bad} of {total} elements out of bound; {worst}", expected.reference, bad, total, worst)


# -- references --------------------------------------------------------------------------------
def magnitude_inputs(host_inputs: Sequence[np.ndarray], func: tirx.PrimFunc | None = None) -> list[np.ndarray]:
    """The inputs a reference runs on to give S: |x| for floats (those :func:`absolute_inputs`
    names, where ``func`` is given); integers and bools unchanged (an index must stay an index;
    a signed integer cast to float keeps an output off the sum-of-products bound, see the
    module docstring)."""
    which = absolute_inputs(func, len(host_inputs)) if func is not None else (True,) * len(host_inputs)
    return [take_absolute(a, part) if is_float(np.asarray(a).dtype) else a for a, part in zip(host_inputs, which)]


def _as_list(out) -> list[np.ndarray]:
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def _expected(func: tirx.PrimFunc, outputs, magnitudes, source: Reference) -> Expected:
    params = param_buffers(func)
    outs = [params[i] for i in output_indices(func)]
    kinds = output_kinds(func)
    outputs = _as_list(outputs)
    if len(outputs) != len(outs):
        raise ValueError(f"the {source.name} gave {len(outputs)} outputs; the function writes {len(outs)}")
    for buf, arr in zip(outs, outputs):
        if tuple(arr.shape) != static_shape(buf):
            raise ValueError(f"the {source.name} gave shape {tuple(arr.shape)} for output {buf.name}, "
                             f"which has shape {static_shape(buf)}")
    mags = _as_list(magnitudes) if magnitudes is not None else [None] * len(outs)
    for buf, mag, kind in zip(outs, mags, kinds):
        if kind.sum_of_products and mag is None:
            raise ValueError(f"output {buf.name} is a sum of products: its bound needs the reference "
                             "run on |inputs| (magnitude_inputs)")
    return Expected(tuple(outputs), tuple(m if k.sum_of_products else None for m, k in zip(mags, kinds)),
                    kinds, tuple(str(b.dtype) for b in outs), source)


def expected_from_numpy(ref_fn: Callable, host_inputs: Sequence[np.ndarray], func: tirx.PrimFunc) -> Expected:
    """Run a float64 numpy reference (``Op.reference``) on the inputs and, when some output is
    a sum of products, on :func:`magnitude_inputs`."""
    as64 = [np.asarray(a, dtype=np.float64) if is_float(np.asarray(a).dtype) else a for a in host_inputs]
    outputs = [np.asarray(o, dtype=np.float64) for o in _as_list(ref_fn(*as64))]
    mags = None
    if any(k.sum_of_products for k in output_kinds(func)):
        mags = [np.asarray(o, dtype=np.float64) for o in _as_list(ref_fn(*magnitude_inputs(as64, func)))]
    return _expected(func, outputs, mags, NUMPY_REFERENCE)


def expected_from_outputs(outputs: Sequence[np.ndarray], abs_outputs: Sequence[np.ndarray] | None,
                          func: tirx.PrimFunc, name: str | Reference = NAIVE_REFERENCE,
                          own_outputs: Sequence[np.ndarray] | None = None) -> Expected:
    """Expected outputs from a reference already run (the naive float64 module, on the
    inputs and on :func:`magnitude_inputs`); ``func`` is the original function. ``own_outputs``:
    the same naive schedule run in the function's own dtypes (:func:`wants_own_dtype_run`)."""
    source = name if isinstance(name, Reference) else Reference(name, "naive")
    expected = _expected(func, outputs, abs_outputs, source)
    if own_outputs is None:
        return expected
    errors = tuple(None if k.sum_of_products or not is_float(d) else
                   np.abs(np.asarray(o, dtype=np.float64) - np.asarray(r, dtype=np.float64))
                   for o, r, k, d in zip(_as_list(own_outputs), expected.outputs, expected.kinds, expected.out_dtypes))
    return dataclasses.replace(expected, own_errors=errors)

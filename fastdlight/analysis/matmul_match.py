"""Which functions are matrix multiplications, seen as ``C[S, I, J] += A[S, I, K] * B[S, J, K]``
(S: fused batch axes): plain matmuls with the operands indexed by iterators
(:func:`match_matmul`), and implicit GEMMs such as NHWC convolutions, whose input is read at
``h * stride + r`` (Dlight's iterator traits). Shared by the mma.sync and wgmma policies."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import tvm_ffi
from tvm import ir, s_tir, sym, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.gpu.matmul import IterKind, detect_iter_traits


@dataclass(frozen=True)
class MatmulMatch:
    """What the template and the policy need to know about a matmul-like function."""

    block: str  # name of the reduction block
    in_dtype: str
    acc_dtype: str  # the reduction block's output dtype (= mma accumulator)
    out_dtype: str  # the function's final output dtype (after any epilogue)
    batch: int
    m: int
    n: int
    k: int
    a_k_inner: bool  # A stored [.., M, K] (layout letter N) rather than [.., K, M] (T)
    b_k_inner: bool  # B stored [.., N, K] (layout letter T) rather than [.., K, N] (N)
    num_epilogue: int  # spatial blocks after the matmul (bias, cast, relu, ...)
    #: G > 0: the epilogue combines accumulator columns in pairs (``c``, ``c + G``) of every
    #: ``2G``-column block into one output column (gate and up projections interleaved into one
    #: GEMM, see ``fastdlight.relax.gated``): the output has N / 2 columns
    pair_columns: int = 0

    @property
    def layout(self) -> str:
        return ("N" if self.a_k_inner else "T") + ("T" if self.b_k_inner else "N")


def load_of(expr):
    """The BufferLoad under optional casts, else None."""
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr if isinstance(expr, ir.TensorLoad) else None


class _Zero:
    """Marker for a constant-zero index (a unit dimension)."""


def _index_var(index, block_vars):
    """The block iter var an access index is, ``_Zero`` for a constant 0, else None."""
    if isinstance(index, tirx.Var):
        return next((v for v in block_vars if v.same_as(index)), None)
    if isinstance(index, tirx.IntImm) and index.value == 0:
        return _Zero
    return None


def has_node(var, seq) -> bool:
    # identity test: ``==`` on TIR vars builds an expression
    return any(var.same_as(x) for x in seq)


def match_matmul(func: tirx.PrimFunc) -> tuple[MatmulMatch | None, str]:
    """Detect ``C[s.., i, j] += cast(A[.., i/k, k/i]) * cast(B[.., k/j, j/k])`` (one reduction
    block, injective blocks around it). Returns ``(match, "")`` or ``(None, reason)``."""
    if not isinstance(func, tirx.PrimFunc):
        return None, "not a PrimFunc"
    sch = s_tir.Schedule(func)
    found = _the_reduction(sch)
    if isinstance(found, str):
        return None, found
    blocks, red = found
    block = sch.get(red.block_rv)
    product = _product(block)
    if isinstance(product, str):
        return None, product
    store, load_a, load_b = product
    iter_vars = list(block.iter_vars)
    if reason := _unsupported_iters(iter_vars):
        return None, reason
    block_vars = [iv.var for iv in iter_vars]
    a_vars, b_vars, c_vars = (_access_vars(x, block_vars) for x in (load_a, load_b, store))
    if a_vars is None or b_vars is None or c_vars is None:
        # an implicit GEMM (convolution: A read at h + r, w + s): Dlight's iterator traits
        return _match_implicit_gemm(func, block, blocks.index(red), len(blocks))
    roles = _roles(iter_vars, a_vars, b_vars, c_vars)
    if isinstance(roles, str):
        return None, roles
    k_inner = _k_inner(roles, a_vars, b_vars, c_vars)
    if isinstance(k_inner, str):
        return None, k_inner
    a_k_inner, b_k_inner = k_inner
    (ii,), (ij,), (ik,) = roles["I"], roles["J"], roles["K"]
    out_buf = func.params[-1] if func.params else store.buffer
    in_a, in_b = str(load_a.source.dtype), str(load_b.source.dtype)
    match = MatmulMatch(
        block=block.name_hint,
        in_dtype=in_a if in_a == in_b else f"{in_a}x{in_b}",
        acc_dtype=str(store.buffer.dtype),
        out_dtype=str(out_buf.dtype),
        batch=math.prod(int(x.dom.extent) for x in roles["S"]),
        m=int(ii.dom.extent),
        n=int(ij.dom.extent),
        k=int(ik.dom.extent),
        a_k_inner=a_k_inner,
        b_k_inner=b_k_inner,
        num_epilogue=len(blocks) - 1 - blocks.index(red),
        pair_columns=_pair_columns(sch, [b for b in blocks if b is not red], store.buffer),
    )
    return match, ""


def _the_reduction(sch: s_tir.Schedule):
    """``(normalized blocks, the reduction block)`` of a function with exactly one reduction
    block and injective blocks around it; or why the function is not one."""
    blocks = normalize_prim_func(sch)
    if not blocks:
        return "cannot be normalized"
    reductions = [b for b in blocks if b.is_reduction()]
    if len(reductions) != 1:
        return f"{len(reductions)} reduction blocks (need exactly 1)"
    red = reductions[0]
    if not all(b.is_injective() for b in blocks if b is not red):
        return "non-injective blocks besides the matmul"
    return blocks, red


def _unsupported_iters(iter_vars) -> str:
    """Why the block's iterators are not all spatial or reduction ones of static extent ("" when
    they are)."""
    for iv in iter_vars:
        if iv.iter_type not in (tirx.IterVar.DataPar, tirx.IterVar.CommReduce):
            return "unsupported iterator type"
        if not isinstance(iv.dom.extent, tirx.IntImm):
            return "symbolic extent (specialize the shape first)"
    return ""


def _k_inner(roles, a_vars, b_vars, c_vars) -> tuple[bool, bool] | str:
    """Whether A and B hold K innermost, where each access's two innermost axes are its matrix
    axes and the output is stored ``[.., M, N]``; else why not."""
    vi, vj, vk = (roles[r][0].var for r in "IJK")
    batch_vars = [x.var for x in roles["S"]]

    def innermost_two(vars_):
        return [v for v in vars_ if not has_node(v, batch_vars)][-2:]

    a2, b2, c2 = innermost_two(a_vars), innermost_two(b_vars), innermost_two(c_vars)
    # the matrix axes must be the two innermost (batch axes outside: row-major batches)
    if not (len(a2) == len(b2) == len(c2) == 2) or any(
        has_node(v, batch_vars) for v in (a_vars[-2:] + b_vars[-2:] + c_vars[-2:])
    ):
        return "matrix axes are not the two innermost dimensions"
    if not (c2[0].same_as(vi) and c2[1].same_as(vj)):
        return "output is not stored [.., M, N]"
    return a2[-1].same_as(vk), b2[-1].same_as(vk)


def _product(block):
    """``(store, load_a, load_b)`` of a block ``C[..] = C[..] + A[..] * B[..]`` (casts allowed),
    A being the block's first read region (what reindex and the templates call read 0); or why
    the block is not one."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or len(block.writes) != 1:
        return "reduction body is not a single store"
    value = store.value
    if not (isinstance(value, tirx.Add) and isinstance(value.b, tirx.Mul)):
        return "reduction is not a sum of products"
    acc = value.a
    if not (isinstance(acc, ir.TensorLoad) and acc.source.same_as(store.buffer)):
        return "reduction does not accumulate into its output"
    load_a, load_b = load_of(value.b.a), load_of(value.b.b)
    if load_a is None or load_b is None or load_a.source.same_as(load_b.source):
        return "product operands are not two distinct buffer loads"
    if len(block.reads) != 2:
        return "matmul block must read exactly two buffers"
    if load_b.source.same_as(block.reads[0].source):
        load_a, load_b = load_b, load_a
    return store, load_a, load_b


def _access_vars(access, block_vars) -> list | None:
    """The block variables ``access`` is indexed by, in order (constant-zero indices left out);
    None where an index is not a single variable (an implicit GEMM's ``h + r``)."""
    out = []
    for idx in access.indices:
        v = _index_var(idx, block_vars)
        if v is None:
            return None
        if v is not _Zero:
            out.append(v)
    return out


def _roles(iter_vars, a_vars, b_vars, c_vars) -> dict[str, list] | str:
    """Each non-unit iterator as batch (S), M (I), N (J) or K by which accesses it indexes;
    or why one is none of them, or why there is not exactly one M, N and K."""
    roles: dict[str, list] = {r: [] for r in "SIJK"}
    for iv in iter_vars:
        v = iv.var
        if int(iv.dom.extent) == 1:
            continue
        spatial = iv.iter_type == tirx.IterVar.DataPar
        in_a, in_b, in_c = has_node(v, a_vars), has_node(v, b_vars), has_node(v, c_vars)
        if not spatial and in_a and in_b and not in_c:
            roles["K"].append(iv)
        elif spatial and in_a and in_b and in_c:
            roles["S"].append(iv)
        elif spatial and in_a and in_c and not in_b:
            roles["I"].append(iv)
        elif spatial and in_b and in_c and not in_a:
            roles["J"].append(iv)
        else:
            return f"iterator {v.name} is not a batch/M/N/K axis"
    if any(len(roles[r]) != 1 for r in "IJK"):
        return "need exactly one M, one N and one K axis"
    return roles


#: pair widths :func:`_pair_columns` recognizes: 128 bytes of 16-bit or of 32-bit values
PAIR_WIDTHS = (64, 32)


def _pair_columns(sch, consumers, acc) -> int:
    """``G`` when every read of the accumulator ``acc`` after the matmul is at column
    ``c // G * 2G + c % G`` or that plus ``G`` (``c``: the reading block's output column, the
    other indices its own), both forms present; else 0."""
    reads = []
    for info in consumers:
        block = sch.get(info.block_rv)
        loads = []
        tvm_ffi.structural_walk(block.body, (ir.TensorLoad, lambda x: loads.append(x) if x.source.same_as(acc) else None),
                                order="pre")
        if loads and not isinstance(block.body, tirx.BufferStore):
            return 0
        reads += [(load, block.body.indices) for load in loads]
    if not reads:
        return 0
    for g in PAIR_WIDTHS:
        offsets = [pair_offset(load.indices, out, g) for load, out in reads]
        if set(offsets) == {0, g}:
            return g
    return 0


def pair_offset(indices, out, g: int) -> int | None:
    """0 or ``g`` when the accumulator read at ``indices`` is the first or second of the pair
    that makes the output element at ``out`` (see :func:`_pair_columns`), else None."""
    analyzer = sym.Analyzer()
    col = out[-1]
    offset = analyzer.simplify(indices[-1] - (tirx.floordiv(col, g) * (2 * g) + tirx.floormod(col, g)))
    same_rows = len(indices) == len(out) and all(
        isinstance(d := analyzer.simplify(a - b), tirx.IntImm) and d.value == 0 for a, b in zip(indices[:-1], out[:-1]))
    return offset.value if same_rows and isinstance(offset, tirx.IntImm) and offset.value in (0, g) else None


def _match_implicit_gemm(func, block, index: int, num_blocks: int) -> tuple[MatmulMatch | None, str]:
    """A reduction whose operands are indexed by sums of iterators (a convolution's input at
    ``h * stride + r``) seen through Dlight's iterator traits: I = the output's spatial axes it
    shares with A, J = those it shares with B, K = the reduction axes. The template reindexes
    A into that view while copying it to shared memory (no im2col buffer). The stored layout
    must keep K (A) and K or J (B) innermost and contiguous: NHWC data, OHWI weights."""
    raw = s_tir.Schedule(func)  # the template schedules the function as given, not normalized
    block = raw.get(raw.get_sblock(block.name_hint))
    traits = detect_iter_traits(block)
    if traits is None:
        return None, "non-trivial index expressions (not an implicit GEMM either)"
    if any(not isinstance(iv.dom.extent, tirx.IntImm) for iv in block.iter_vars):
        return None, "symbolic extent (specialize the shape first)"
    *_, block_traits = traits
    kinds = {iv.var: t.kind for iv, t in zip(block.iter_vars, block_traits)}
    extent = {k: math.prod(int(t.extent) for t in block_traits if t.kind == k) for k in IterKind}

    def innermost_kind(region):
        found = {kinds[v] for v in tirx.analysis.undefined_vars(region[-1].min) if v in kinds}
        found -= {IterKind.kIter_T}
        return found.pop() if len(found) == 1 else None

    a_inner, b_inner = innermost_kind(block.reads[0].region), innermost_kind(block.reads[1].region)
    if a_inner not in (IterKind.kIter_I, IterKind.kIter_K) or b_inner not in (IterKind.kIter_J, IterKind.kIter_K):
        return None, "implicit GEMM whose operands mix axes innermost (NCHW): no contiguous tile rows"
    if innermost_kind(block.writes[0].region) != IterKind.kIter_J:
        return None, "implicit GEMM whose output is not channels-last"
    out_buf = func.params[-1]
    in_a, in_b = str(block.reads[0].source.dtype), str(block.reads[1].source.dtype)
    return MatmulMatch(
        block=block.name_hint, in_dtype=in_a if in_a == in_b else f"{in_a}x{in_b}",
        acc_dtype=str(block.writes[0].source.dtype), out_dtype=str(out_buf.dtype),
        batch=extent[IterKind.kIter_S], m=extent[IterKind.kIter_I], n=extent[IterKind.kIter_J],
        k=extent[IterKind.kIter_K], a_k_inner=a_inner == IterKind.kIter_K, b_k_inner=b_inner == IterKind.kIter_K,
        num_epilogue=num_blocks - 1 - index,
    ), ""  # fmt: skip


def block_realize(func: tirx.PrimFunc, name: str) -> s_tir.SBlockRealize | None:
    """The realize of ``func``'s block called ``name`` (its iterator bindings), or None."""
    found = []
    tvm_ffi.structural_walk(
        func.body, (s_tir.SBlockRealize, lambda r: found.append(r) if str(r.block.name_hint) == name else None),
        order="post",
    )
    return found[0] if found else None


def split_axis(func: tirx.PrimFunc, block_name: str) -> tuple[str, int] | None:
    """(name, extent) of the reduction axis split-K slices: the block's last reduction iterator
    (K of a GEMM; the input channels of a convolution, innermost in NHWC)."""
    realize = block_realize(func, block_name)
    if realize is None:
        return None
    reduce = [iv for iv in realize.block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if not reduce or not isinstance(reduce[-1].dom.extent, tirx.IntImm):
        return None
    return str(reduce[-1].var.name), int(reduce[-1].dom.extent)


def anchor_key(func: tirx.PrimFunc) -> tuple | None:
    """What the matmul (or implicit GEMM) of ``func`` computes, without what follows it: the
    match's shapes, dtypes and layouts, and the shapes and dtypes of the tensors the reduction
    reads once their producers (a convolution's padding) are inlined. Functions with equal keys
    differ only in their epilogues. None: not a matmul, or symbolic."""
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers

    match, _reason = match_matmul(func)
    if match is None:
        return None
    try:
        sch = s_tir.Schedule(func)
        block = sch.get_sblock(match.block)
        auto_inline_producers(sch, block)
        reads = tuple((tuple(int(x) for x in r.source.shape), str(r.source.dtype)) for r in sch.get(block).reads)
    except Exception:  # noqa: BLE001 - symbolic shapes, or producers that do not inline: no key
        return None
    return dataclasses.replace(match, block="", out_dtype="", num_epilogue=0), reads

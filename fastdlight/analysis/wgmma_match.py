"""Which functions the Hopper TMA + wgmma template takes (``match_wgmma``).

The template (``fastdlight.schedules.wgmma.template``) reads A and B with TMA straight from the
function's parameters, so after inlining the elementwise producers of the matmul block both
operands must be parameters indexed by plain variables: ``[batch?, M|N, K]`` (K-major) or
``[batch?, K, M|N]`` (MN-major), or views of a larger tensor (:mod:`.wgmma_view`), or an NHWC
convolution's input boxes (:mod:`.wgmma_conv`). The output is the function's only written
parameter, ``[batch?, M, N]``, produced by the matmul and an elementwise tail.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers

from fastdlight.analysis.matmul_match import MatmulMatch, has_node, load_of, match_matmul
from fastdlight.analysis.dtypes import FP8_DTYPES, NBYTES
from fastdlight.analysis.wgmma_conv import ConvGeometry, gemm_shape, match_conv
from fastdlight.analysis.wgmma_view import OperandView, view_operand

#: input dtypes wgmma takes from shared memory with fp32 accumulation (the template's set);
#: FP8 ones only with both operands K-major (wgmma has no transpose for 8-bit types)
WGMMA_DTYPES = ("float16", "bfloat16") + FP8_DTYPES
#: output dtypes the TMA-store epilogue writes
OUT_DTYPES = ("float16", "bfloat16", "float32")
#: TMA: every row of a tensor (all strides) must be a multiple of 16 bytes
TMA_STRIDE_BYTES = 16
#: one 128-byte swizzled row of shared memory: a stage's K step, an epilogue chunk of output
SWIZZLE_BYTES = 128


@dataclass(frozen=True)
class WgmmaMatch:
    block: str
    in_dtype: str
    out_dtype: str
    batch: int
    m: int
    n: int
    k: int
    a_name: str
    b_name: str
    d_name: str
    a_k_major: bool
    b_k_major: bool
    a_batched: bool
    b_batched: bool
    conv: ConvGeometry | None = None  # an NHWC convolution's implicit GEMM (A: the input's boxes)
    #: G > 0: accumulator columns c and c + G of every 2G-column block make one output column
    #: (``MatmulMatch.pair_columns``); G is the epilogue's chunk, so each chunk pairs with the next
    pair: int = 0
    #: operands read through a view of a larger tensor (:mod:`.wgmma_view`), else None
    a_view: OperandView | None = None
    b_view: OperandView | None = None

    @property
    def in_bytes(self) -> int:
        return NBYTES[self.in_dtype]

    @property
    def bk(self) -> int:
        """A stage's K step: one 128-byte swizzled row (64 16-bit or 128 8-bit elements)."""
        return SWIZZLE_BYTES // self.in_bytes

    @property
    def out_n(self) -> int:
        """The output's columns: N, or N / 2 where the epilogue pairs columns."""
        return self.n // 2 if self.pair else self.n

    @property
    def bn_multiple(self) -> int:
        """A tile's N is a whole number of epilogue chunks (128 bytes of output), of pairs of
        them where the epilogue pairs columns."""
        return SWIZZLE_BYTES // self.out_bytes * (2 if self.pair else 1)

    @property
    def out_bytes(self) -> int:
        return NBYTES[self.out_dtype]

    def _shared(self, bm: int, bn: int, axis: str) -> tuple[bool, int]:
        """(K-major, rows) of the tile a cluster along ``axis`` shares: B's along M, A's along N."""
        return (self.b_k_major, bn) if axis == "m" else (self.a_k_major, bm)

    def splits_chunks(self, bm: int, bn: int, cluster: int, axis: str = "m") -> bool:
        """Whether the shared tile's (B's, ``bn`` wide, along M; A's, ``bm`` high, along N)
        64-column chunks, MN-major, do not divide among ``cluster`` CTAs, so that each loads a
        share of every chunk along K (``wgmma_tma.Operand.k_pieces``)."""
        k_major, rows = self._shared(bm, bn, axis)
        return not k_major and rows // (SWIZZLE_BYTES // self.in_bytes) % cluster != 0

    def cluster_fits(self, bm: int, bn: int, cluster: int, axis: str = "m") -> bool:
        """Whether ``cluster`` CTAs along ``axis`` can share a tile: B (``bn`` wide) along M, A
        (``bm`` high, not through a view) along N. K-major, one of its boxes a CTA; MN-major,
        whole 64-column chunks each, or shares of every chunk along K (:meth:`splits_chunks`);
        a share of a K step is whole 8-row swizzle atoms. Not for convolutions."""
        if cluster == 1:
            return True
        k_major, rows = self._shared(bm, bn, axis)
        return (self.conv is None and (axis == "m" or self.a_view is None) and self.bk % (8 * cluster) == 0
                and (not k_major or rows % (8 * cluster) == 0))

    def views_fit(self, bm: int, bn: int) -> bool:
        """Whether operands read through views take tiles of ``bm`` x ``bn`` (see
        :meth:`OperandView.fits`)."""
        return (self.a_view is None or self.a_view.fits(bm, self.m)) and (self.b_view is None or self.b_view.fits(bn, self.n))

    @property
    def tma_store(self) -> bool:
        """Whether TMA can store the output's rows (each a multiple of 16 bytes); else the
        template stores them element by element."""
        return self.out_n * self.out_bytes % TMA_STRIDE_BYTES == 0

    def m_tiles(self, bm: int):
        """Tiles of ``bm`` output rows: of M, or of the convolution's image patches."""
        return self.conv.m_tiles(bm) if self.conv is not None else (self.m + bm - 1) // bm


def distinct_param_names(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with parameters of distinct names. FuseTIR can give two parameters one name
    (ResNet's stem GEMM has two ``lv2``), and the wgmma template refers to buffers by name in
    its text; the TVMScript printer tells them apart (``lv2_1``), so a round trip renames them."""
    names = [str(p.name) for p in func.params]
    if len(set(names)) == len(names):
        return func
    return tvm.script.from_source(func.script())


def match_wgmma(func: tirx.PrimFunc) -> tuple[WgmmaMatch | None, str]:
    """``(match, "")`` when the wgmma template can compute ``func``, else ``(None, reason)``.
    Names in the match are those of :func:`distinct_param_names`."""
    func = distinct_param_names(func)
    base, reason = match_matmul(func)
    if base is None:
        found, view_reason = _match_views(func)
        return found, view_reason or ("" if found is not None else reason)
    block, reason = _inlined_matmul_block(func, base)
    if block is None:
        return None, reason
    if sum(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars) == 3:
        return _match_conv(func, base, block, {str(p.name): p for p in func.params})
    return _match_plain(func, base, block)


def _inlined_matmul_block(func, base: MatmulMatch):
    """``(block, "")``: the matmul block of ``func`` with its elementwise producers inlined, so
    that it loads the tensors the template reads; else ``(None, reason)``."""
    sch = s_tir.Schedule(func)
    try:
        block_rv = sch.get_sblock(base.block)
        auto_inline_producers(sch, block_rv)
    except Exception as e:  # noqa: BLE001
        return None, f"cannot inline the matmul's producers: {type(e).__name__}"
    return sch.get(block_rv), ""


def _match_plain(func, base: MatmulMatch, block) -> tuple[WgmmaMatch | None, str]:
    """A matmul whose operands are parameters indexed by plain variables, ``[batch?, rows, K]``
    or ``[batch?, K, rows]``; views of larger tensors where an index is more than a variable."""
    value = block.body.value
    load_x, load_y = load_of(value.b.a), load_of(value.b.b)
    if load_x is None or load_y is None:
        return None, "matmul operands are not loads"
    in_dtype, out, reason = _inputs_and_output(func, load_x, load_y)
    if out is None:
        return None, reason
    reduce_vars = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(reduce_vars) != 1:
        return None, "need one reduction axis"
    k_var = reduce_vars[0]
    x_vars, y_vars = _vars(load_x), _vars(load_y)
    c_vars = _vars(block.body)
    if x_vars is None or y_vars is None or c_vars is None:
        found, reason = _match_views(func)
        return found, reason or "operands not indexed by plain variables"
    if len(c_vars) not in (2, 3):
        return None, "more than one batch axis"
    i_var, j_var = c_vars[-2:]
    if has_node(i_var, y_vars):  # the load that holds the M axis is A
        load_x, load_y, x_vars, y_vars = load_y, load_x, y_vars, x_vars
    batch_var = c_vars[0] if len(c_vars) == 3 else None
    a_k, a_ok = _layout(x_vars, i_var, k_var, batch_var)
    b_k, b_ok = _layout(y_vars, j_var, k_var, batch_var)
    if not (a_ok and b_ok):
        return None, "operand axes are not [batch?, rows, K] or [batch?, K, rows]"
    if reason := _paired_output_refusal(base, out):
        return None, reason
    match = WgmmaMatch(
        block=base.block, in_dtype=in_dtype, out_dtype=str(out.dtype), batch=base.batch,
        m=base.m, n=base.n, k=base.k, a_name=str(load_x.source.name), b_name=str(load_y.source.name),
        d_name=str(out.name), a_k_major=a_k, b_k_major=b_k,
        a_batched=batch_var is not None and has_node(batch_var, x_vars),
        b_batched=batch_var is not None and has_node(batch_var, y_vars), pair=base.pair_columns,
    )  # fmt: skip
    if reason := _operand_rows_refusal(match):
        return None, reason
    return _stores_whole_tiles(match)


def _paired_output_refusal(base: MatmulMatch, out) -> str:
    """Why the output ``out`` is not the matmul's ``[batch?, M, N]`` (N / 2 where the epilogue
    pairs columns, whole 128-byte chunks apart); "" when it is."""
    pair = base.pair_columns
    if pair and pair != SWIZZLE_BYTES // NBYTES[str(out.dtype)]:
        return f"columns paired {pair} apart: the epilogue pairs whole 128-byte chunks"
    if _nonunit(out.shape) != ([base.batch] if base.batch > 1 else []) + [base.m, base.n // 2 if pair else base.n]:
        return "output is not [batch?, M, N]"
    return ""


def _operand_rows_refusal(match: WgmmaMatch) -> str:
    """Why wgmma and TMA cannot read the plain operands of ``match`` ("" when they can): 8-bit
    ones MN-major, or rows that are no multiple of 16 bytes."""
    if match.in_dtype in FP8_DTYPES and not (match.a_k_major and match.b_k_major):
        return f"{match.in_dtype}: wgmma reads 8-bit operands K-major only (A as [M, K], B as [N, K])"
    inner = {"A": match.k if match.a_k_major else match.m, "B": match.k if match.b_k_major else match.n}
    for name, extent in inner.items():
        if extent * match.in_bytes % TMA_STRIDE_BYTES:
            return f"{name}'s rows are {extent * match.in_bytes} bytes: TMA needs multiples of 16"
    return ""


def _match_conv(func, base, block, params) -> tuple[WgmmaMatch | None, str]:
    """An NHWC convolution as the template's implicit GEMM (see :mod:`.wgmma_conv`)."""
    if base.in_dtype not in WGMMA_DTYPES or base.in_dtype in FP8_DTYPES:
        return None, f"input dtype {base.in_dtype}: the convolution template takes fp16 or bf16"
    out, reason = _the_output(func)
    if out is None:
        return None, reason
    found, reason = match_conv(block, params, out)
    if found is None:
        return None, reason
    x_name, w_name, geo = found
    m, n, k = gemm_shape(geo, int(out.shape[-1]))
    match = WgmmaMatch(block=base.block, in_dtype=base.in_dtype, out_dtype=str(out.dtype), batch=1, m=m, n=n, k=k,
                       a_name=x_name, b_name=w_name, d_name=str(out.name), a_k_major=True, b_k_major=True,
                       a_batched=False, b_batched=False, conv=geo)
    if reason := _output_rows_misaligned(match):
        return None, reason
    return match, ""


def _match_views(func) -> tuple[WgmmaMatch | None, str | None]:
    """A matmul whose operands are views of larger tensors (see :mod:`.wgmma_view`); reason
    None where the function is no such sum of products at all."""
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in _child_blocks(sch)]
    reductions = [b for b in blocks if any(iv.iter_type == tirx.IterVar.CommReduce for iv in b.iter_vars)]
    if len(reductions) != 1:
        return None, None
    block_rv = sch.get_sblock(reductions[0].name_hint)
    try:
        auto_inline_producers(sch, block_rv)
    except Exception:  # noqa: BLE001
        return None, None
    block = sch.get(block_rv)
    store = block.body
    value = getattr(store, "value", None)
    if not (isinstance(store, tirx.BufferStore) and isinstance(value, tirx.Add) and isinstance(value.b, tirx.Mul)):
        return None, None
    load_x, load_y = load_of(value.b.a), load_of(value.b.b)
    reduce_vars = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    c_vars = _vars(store)
    if load_x is None or load_y is None or len(reduce_vars) != 1 or c_vars is None or len(c_vars) not in (2, 3):
        return None, None
    in_dtype, out, reason = _inputs_and_output(func, load_x, load_y)
    if out is None:
        return None, reason
    if in_dtype in FP8_DTYPES:
        return None, f"{in_dtype} operands read through views: not taken (plain [M, K] and [N, K] only)"
    if not all(isinstance(iv.dom.extent, tirx.IntImm) for iv in block.iter_vars):
        return None, "symbolic extent (specialize the shape first)"
    extent = {iv.var: int(iv.dom.extent) for iv in block.iter_vars}
    ext = lambda v: next(e for var, e in extent.items() if var.same_as(v))  # noqa: E731
    k_var, (i_var, j_var) = reduce_vars[0].var, c_vars[-2:]
    batch_var = c_vars[0] if len(c_vars) == 3 else None
    if _uses(load_x, j_var) or not _uses(load_x, i_var):
        load_x, load_y = load_y, load_x
    views = []
    for load, row in ((load_x, i_var), (load_y, j_var)):
        batch = batch_var if batch_var is not None and _uses(load, batch_var) else None
        view, reason = view_operand(load.source, load.indices, row, k_var, batch, list(extent.items()), NBYTES[in_dtype])
        if view is None:
            return None, reason
        views.append(view)
    batch, m, n = (ext(batch_var) if batch_var is not None else 1), ext(i_var), ext(j_var)
    if _nonunit(out.shape) != ([batch] if batch > 1 else []) + [m, n]:
        return None, "output is not [batch?, M, N]"
    a, b = views
    match = WgmmaMatch(
        block=block.name_hint, in_dtype=in_dtype, out_dtype=str(out.dtype), batch=batch, m=m, n=n, k=ext(k_var),
        a_name=str(load_x.source.name), b_name=str(load_y.source.name), d_name=str(out.name),
        a_k_major=a.k_major, b_k_major=b.k_major, a_batched=a.batch is not None, b_batched=b.batch is not None,
        a_view=a, b_view=b,
    )  # fmt: skip
    return _stores_whole_tiles(match)


def _stores_whole_tiles(match: WgmmaMatch) -> tuple[WgmmaMatch | None, str]:
    """``(match, "")`` where the matmul fills a wgmma tile (M ≥ 64, N ≥ 16); else ``(None,
    reason)``. Output rows TMA cannot address are stored by the threads (``tma_store``)."""
    if match.m < 64 or match.n < 16:
        return None, f"M={match.m}, N={match.n}: below one wgmma tile (the GEMV path takes these)"
    return match, ""


def _child_blocks(sch):
    return sch.get_child_blocks(get_root_block(sch))


def _uses(load, var) -> bool:
    found = []
    for idx in load.indices:
        tvm_ffi.structural_walk(idx, (tirx.Var, found.append), order="pre")
    return any(v.same_as(var) for v in found)


def _inputs_and_output(func, load_x, load_y):
    """``(in_dtype, out, "")`` where both operand loads read parameters (TMA's sources) of one
    wgmma input dtype and the function has one output the epilogue writes; else
    ``(None, None, reason)``."""
    params = {str(p.name) for p in func.params}
    if str(load_x.source.name) not in params or str(load_y.source.name) not in params:
        return None, None, "a matmul operand is computed in the function (TMA reads parameters only)"
    in_dtype = str(load_x.source.dtype)
    if in_dtype != str(load_y.source.dtype) or in_dtype not in WGMMA_DTYPES:
        return None, None, f"input dtype {in_dtype}/{load_y.source.dtype}: wgmma here takes fp16, bf16 or fp8"
    out, reason = _the_output(func)
    return (in_dtype, out, "") if out is not None else (None, None, reason)


def _the_output(func):
    """``(out, "")``: the one parameter the function writes, in a dtype the TMA-store epilogue
    writes; else ``(None, reason)``."""
    stored = _stored_names(func)
    written = [p for p in func.params if str(p.name) in stored]
    if len(written) != 1:
        return None, f"{len(written)} outputs (need one)"
    if str(written[0].dtype) not in OUT_DTYPES:
        return None, f"output dtype {written[0].dtype}"
    return written[0], ""


def _output_rows_misaligned(match: WgmmaMatch) -> str:
    """Why TMA cannot store the output's rows ("" when it can)."""
    row = match.out_n * match.out_bytes
    return f"output rows are {row} bytes: TMA needs multiples of 16" if row % TMA_STRIDE_BYTES else ""


def _stored_names(func) -> set[str]:
    """Names of the buffers the function stores to (one walk of its body)."""
    stores = []
    tvm_ffi.structural_walk(func.body, (tirx.BufferStore, stores.append), order="pre")
    return {str(st.buffer.name) for st in stores}


def _vars(access) -> list | None:
    out = []
    for idx in access.indices:
        if isinstance(idx, tirx.Var):
            out.append(idx)
        elif not (isinstance(idx, tirx.IntImm) and idx.value == 0):
            return None
    return out


def _layout(vars_, row_var, k_var, batch_var) -> tuple[bool, bool]:
    """(k_major, ok) of an operand indexed ``[batch?, row, k]`` or ``[batch?, k, row]``."""
    core = [v for v in vars_ if batch_var is None or not v.same_as(batch_var)]
    if len(core) != 2 or (batch_var is not None and len(vars_) == 3 and not vars_[0].same_as(batch_var)):
        return False, False
    if core[0].same_as(row_var) and core[1].same_as(k_var):
        return True, True
    if core[0].same_as(k_var) and core[1].same_as(row_var):
        return False, True
    return False, False


def _nonunit(shape) -> list[int]:
    return [int(x) for x in shape if int(x) != 1]

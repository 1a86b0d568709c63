"""The fused epilogue of the Hopper matmul template (``matmul_wgmma``).

The elementwise blocks that follow the matmul in a function (cast, bias, activation, multiply by
another tensor...) are inlined into one expression over the accumulator, ``K_ACC``, and pasted
into the kernel's staging stores: each consumer thread evaluates it for its two adjacent output
columns at a time, at its fragment positions.

Reads of other inputs there would cost a global-memory round trip per chunk of the tile after
the main loop, while the tensor cores wait: an activation gate read that way made a GEMM 15-80%
slower than the plain one. So those reads are *prefetched*: at the start of each tile, before the
main loop, the thread loads its pairs of 16-bit values with one 4-byte load each into registers
(``k_x<n>``); their latency hides behind the main loop and the epilogue reads registers. A read
whose index does not involve the output row (a bias) takes one register per column pair of the
tile, one that does (a gate) one per pair of accumulators. When the registers would not fit
beside the accumulators, or a read is not a pair of adjacent 16-bit elements, it stays a direct
load in the epilogue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers

from fastdlight.analysis.matmul_match import pair_offset
from fastdlight.analysis.wgmma_match import WgmmaMatch
from fastdlight.schedules.base import root_block
from fastdlight.schedules.wgmma.plan import Plan


#: identifiers the kernel text defines; an epilogue that uses one of them cannot be pasted in
RESERVED = re.compile(r"\b(k_\w+|K_\w+|A_map|B_map|D_map|i|s|kk)\b")

#: the 16-bit pack helpers TVM's CUDA codegen defines
PACK = {"float16": "__pack_half2", "bfloat16": "__pack_nv_bfloat162"}

#: CUDA intrinsics that read a 16-bit pattern as the value it encodes
FROM_BITS = {"float16": "__ushort_as_half", "bfloat16": "__ushort_as_bfloat16"}

#: accumulator + prefetch registers a consumer thread may hold; addresses, descriptors and the
#: epilogue's temporaries need the rest of its setmaxnreg share (232 with two consumer
#: warpgroups). Measured without spills on the tiles of 128 accumulators or fewer (128x192 with
#: a gate tensor, 96 + 48). Tiles of 192 (256x192) get no prefetch; with a bias and a gate
#: read directly ptxas spills 24-32 bytes there, and 192 + 16 of a gate chunk spill as much
MAX_LIVE_REGS = 144


@dataclass(frozen=True)
class Read:
    """One read of another input in the epilogue text, e.g. ``lv5[v_ax0, v_ax1]``."""

    text: str
    buffer: str
    indices: tuple[str, ...]
    dtype: str
    per_row: bool  # the index involves the output row: one value per accumulator
    #: every index a constant inside the tensor (a per-tensor scale): one value for the kernel
    scalar: bool = False
    #: indexed by the output row and not the column (a per-row scale): the same value across a
    #: thread's columns, two rows a 64-row slice
    row_only: bool = False

    @property
    def words(self) -> int:
        """Registers per pair: 16-bit pairs are packed in one, 32-bit pairs take two."""
        return 1 if self.dtype in FROM_BITS else 2

    def element(self, reg: str, slot: str, e: int) -> str:
        """Element ``e`` of the pair held at ``slot`` of the registers ``reg``."""
        if self.words == 2:
            return f"{reg}[{slot} * 2 + {e}]"
        word = f"{reg}[{slot}]" if e == 0 else f"T.shift_right({reg}[{slot}], T.uint32(16))"
        return f'T.call_pure_extern("{self.dtype}", "{FROM_BITS[self.dtype]}", T.Cast("uint16", {word}))'

    def load(self, reg: str, slot: str, guard: str) -> str:
        """The statement that loads a pair into ``slot`` of ``reg`` (zeros where not ``guard``)."""
        vector = f'{self.buffer}.vload([{", ".join(self.indices)}], "{self.dtype}x2")'
        if self.words == 2:
            zeros = f'T.Broadcast(T.Cast("{self.dtype}", 0), 2)'
            return f"{reg}.vstore([{slot} * 2], T.if_then_else({guard}, {vector}, {zeros}))"
        return f'{reg}[{slot}] = T.if_then_else({guard}, T.reinterpret("uint32", {vector}), T.uint32(0))'


@dataclass(frozen=True)
class Prefetch:
    """How read ``index`` is held in registers ``k_x<index>``. A column-only read holds the
    pairs of every chunk column of the tile, loaded at the tile's start. A per-row read holds
    ``depth`` chunks of pairs (the thread's ``2 * chunk_cols / 8`` pairs of a 64-row x
    ``chunk_cols`` chunk each) in a ring: the first ``depth`` are loaded at the tile's start,
    and chunk ``q + depth`` right after chunk ``q`` is stored, into the registers ``q`` freed."""

    index: int
    read: Read
    depth: int

    @property
    def reg(self) -> str:
        return f"k_x{self.index}"

    def registers(self, plan: Plan) -> int:
        if self.read.scalar:
            return 1
        if self.read.row_only:
            return plan.m_per_wg * 2
        pairs = self.depth * plan.chunk_cols // 4 if self.read.per_row else plan.out_bn // 8
        return pairs * self.read.words

    @property
    def reg_dtype(self) -> str:
        """Scalars and rows are held as values; pairs of 16-bit values packed in a word."""
        return self.read.dtype if self.read.scalar or self.read.row_only or self.read.words == 2 else "uint32"

    def element(self, plan: Plan, q: str, e: int) -> str:
        """The register text of the read's element ``k_col + e`` in chunk ``q`` (linear)."""
        if self.read.scalar:
            return f"{self.reg}[0]"
        if self.read.row_only:
            return f"{self.reg}[k_mi * 2 + k_h]"
        return self.read.element(self.reg, self.slot(plan, q), e)

    def slot(self, plan: Plan, q: str) -> str:
        """The register slot of the pair ``k_j, k_h`` of chunk ``q`` (``k_c`` for column-only)."""
        j = plan.chunk_cols // 8
        if not self.read.per_row:
            return f"(k_c * {j} + k_j)"
        return f"(((({q}) % {self.depth}) * {j} + k_j) * 2 + k_h)"


@dataclass(frozen=True)
class Epilogue:
    """The elementwise tail of the function as TVMScript text over its own block variables,
    with the matmul's accumulator read as ``K_ACC``."""

    text: str
    index_vars: tuple[str | None, ...]  # the output's indices: block var names (None: a constant)
    reads: tuple[Read, ...] = ()  # reads of other inputs
    pairable: tuple[bool, ...] = ()  # per read: a pair of adjacent elements, aligned, in bounds

    @property
    def guarded(self) -> bool:
        """Reads other inputs: masked past the edges."""
        return bool(self.reads)

    def prefetches(self, plan: Plan) -> tuple[Prefetch, ...]:
        """The reads held in registers, as many as fit beside the accumulators. Per-row reads
        first: each of their values comes from DRAM once, where a column-only read (a bias) is
        shared by every row and mostly hits the L1 cache."""
        chosen, live = [], plan.acc_regs
        chunks = plan.m_per_wg * plan.out_chunks
        for i, read in enumerate(self.reads):
            # a scalar's register costs less than its direct loads' addresses and guards: held
            # even past the budget; a row's two values a slice where they fit
            held = Prefetch(i, read, 1)
            if read.scalar or read.row_only and live + held.registers(plan) <= MAX_LIVE_REGS:
                chosen.append(held)
                live += held.registers(plan)
        order = sorted(range(len(self.reads)), key=lambda i: not self.reads[i].per_row)
        for i in (i for i in order if self.pairable[i] and not self.reads[i].row_only):
            read = self.reads[i]
            depth = chunks
            if read.per_row:  # as many chunks as fit, up to the whole tile
                depth = min(chunks, (MAX_LIVE_REGS - live) // Prefetch(i, read, 1).registers(plan))
            held = Prefetch(i, read, depth)
            if depth >= 1 and live + held.registers(plan) <= MAX_LIVE_REGS:
                chosen.append(held)
                live += held.registers(plan)
        return tuple(sorted(chosen, key=lambda p: p.index))

    def coords(self, plan: Plan, e: int, mi: str = "k_mi", c: str = "k_c") -> list[str]:
        """The output indices of the thread's element ``k_col + e`` of row ``k_row`` in slice
        ``mi`` and chunk ``c`` (text)."""
        return plan.out_coords(f"{plan.row0_text()} + {mi} * 64 + k_row",
                               f"(k_n * {plan.out_bn} + {c} * {plan.chunk_cols} + k_col + {e})")

    def substitute(self, text: str, plan: Plan, e: int, mi: str = "k_mi", c: str = "k_c") -> str:
        """``text`` with the block vars replaced by element ``k_col + e``'s coordinates."""
        for name, coord in zip(reversed(self.index_vars), reversed(self.coords(plan, e, mi, c))):
            if name is not None:
                text = re.sub(rf"\b{re.escape(name)}\b", coord, text)
        return text

    def in_bounds(self, plan: Plan, e: int, rows: bool = True, mi: str = "k_mi", c: str = "k_c") -> str:
        return plan.in_bounds(self.coords(plan, e, mi, c), rows)

    def value(self, plan: Plan, e: int, wrap=lambda text: text, zero: str | None = None) -> str:
        """The output element at column ``k_col + e`` of the thread's row, as an expression over
        the kernel's own names, passed through ``wrap``. Where a direct read could fall outside
        its tensor the element is guarded, with ``zero`` (default: 0 of the output dtype) outside."""
        text = self.text.replace("K_UP", f"k_acc[k_reg + {plan.pair_regs + e}]").replace("K_ACC", f"k_acc[k_reg + {e}]")
        prefetches = self.prefetches(plan)
        for p in prefetches:
            text = text.replace(p.read.text, p.element(plan, self.chunk(plan), e))
        text = wrap(self.substitute(text, plan, e))
        if len(prefetches) < len(self.reads):
            zero = zero or f'T.Cast("{plan.match.out_dtype}", 0)'
            text = f"T.if_then_else({self.in_bounds(plan, e)}, {text}, {zero})"
        return text

    @staticmethod
    def chunk(plan: Plan, ahead: int = 0) -> str:
        """The linear index of the store loop's current chunk (plus ``ahead``)."""
        return f"(k_mi * {plan.out_chunks} + k_c + {ahead})"

    def stores(self, plan: Plan, indent: str) -> str:
        """The staging stores of the thread's two adjacent outputs (``k_at``: their word)."""
        dst = "k_Cs[k_cw, k_buf, k_at{}]"
        if plan.match.out_bytes == 2:
            pack = PACK[plan.match.out_dtype]
            return f'{dst.format("")} = T.call_pure_extern("uint32", "{pack}", {self.value(plan, 0)}, {self.value(plan, 1)})'
        # the guard goes outside the reinterpret: where it folds to false, TVM prints the
        # reinterpret of a constant as the address of a literal, which nvcc rejects
        as_word = lambda text: f'T.reinterpret("uint32", {text})'  # noqa: E731
        return ("\n" + indent).join(
            f'{dst.format(f" + {e}")} = {self.value(plan, e, as_word, "T.uint32(0)")}' for e in (0, 1))

    def registers(self, plan: Plan, indent: str) -> str:
        """Allocations of the prefetch registers (one statement per line, or a no-op)."""
        lines = [f'{p.reg} = T.alloc_buffer(({p.registers(plan)},), "{p.reg_dtype}", scope="local")'
                 for p in self.prefetches(plan)]
        return ("\n" + indent).join(lines) or "T.evaluate(0)"

    def _loads(self, p: Prefetch, plan: Plan, q: str, slot_q: str) -> list[str]:
        """A loop nest loading the thread's pairs of chunk ``q`` (linear) into ``slot_q``'s slots."""
        mi, c = f"(({q}) // {plan.out_chunks})", f"(({q}) % {plan.out_chunks})"
        if not p.read.per_row:
            mi, c = "0", "k_c"
        load = p.read.load(p.reg, p.slot(plan, slot_q), self.in_bounds(plan, 0, p.read.per_row, mi, c))
        nest = ["for k_j in T.unroll(K_PLAN.chunk_cols // 8):"]
        if p.read.per_row:
            nest += ["for k_h in T.unroll(2):"]
        body = ["k_row = T.meta_var(k_r0 + 8 * k_h)"] if p.read.per_row else []
        body += ["k_col = T.meta_var(k_j * 8 + (k_lane % 4) * 2)", self.substitute(load, plan, 0, mi, c)]
        return [" " * 4 * d + line for d, line in enumerate(nest)] + [" " * 4 * len(nest) + b for b in body]

    def _row_loads(self, p: Prefetch, plan: Plan) -> list[str]:
        """A loop nest loading the thread's two rows of each slice into ``p``'s registers
        (zeros past the last row)."""
        value = self.substitute(f"T.if_then_else({self.in_bounds(plan, 0, True, 'k_mi', '0')}, {p.read.text}, "
                                f'T.Cast("{p.read.dtype}", 0))', plan, 0, "k_mi", "0")
        return ["for k_mi in T.unroll(K_PLAN.m_per_wg):", "    for k_h in T.unroll(2):",
                "        k_row = T.meta_var(k_r0 + 8 * k_h)", "        k_col = T.meta_var(0)",
                f"        {p.reg}[k_mi * 2 + k_h] = {value}"]

    def prefetch(self, plan: Plan, indent: str) -> str:
        """At a tile's start: load the first chunks of every prefetched read."""
        out = []
        for p in self.prefetches(plan):
            if p.read.scalar:
                out.append(f"{p.reg}[0] = {p.read.text}")
                continue
            if p.read.row_only:
                out += self._row_loads(p, plan)
                continue
            out.append(f"for {'k_q' if p.read.per_row else 'k_c'} in T.unroll({p.depth if p.read.per_row else plan.out_chunks}):")
            out += ["    " + line for line in self._loads(p, plan, "k_q", "k_q")]
        return ("\n" + indent).join(out) or "T.evaluate(0)"

    def prefetch_next(self, plan: Plan, indent: str) -> str:
        """After the store loop's chunk ``q``: load chunk ``q + depth`` of every ring."""
        out, total = [], plan.m_per_wg * plan.out_chunks
        for p in self.prefetches(plan):
            if p.read.per_row and not p.read.row_only and p.depth < total:
                out.append(f"if {self.chunk(plan, p.depth)} < {total}:")
                out += ["    " + line for line in self._loads(p, plan, self.chunk(plan, p.depth), self.chunk(plan))]
        return ("\n" + indent).join(out) or "T.evaluate(0)"


def extract_epilogue(func: tirx.PrimFunc, match: WgmmaMatch) -> Epilogue:
    """Inline every elementwise block after the matmul into the last one and read its value."""
    sch = s_tir.Schedule(func)
    mm = sch.get_sblock(match.block)
    auto_inline_producers(sch, mm)
    params = {str(p.name): p for p in func.params}
    root = root_block(sch)
    if root is None:
        raise ValueError("the function is not in block form")
    _inline_intermediates(sch, root, match.block, params)
    acc_buf = sch.get(mm).writes[0].source
    tail = [sch.get(b) for b in sch.get_child_blocks(root)]
    tail = [b for b in tail if b.name_hint != match.block]
    acc_dtype = str(acc_buf.dtype)
    acc = "K_ACC" if acc_dtype == "float32" else f'T.Cast("{acc_dtype}", K_ACC)'
    if not tail:  # the matmul writes the output itself
        out = match.out_dtype
        text = acc if out == acc_dtype == "float32" else f'T.Cast("{out}", {acc})'
        return Epilogue(text, ())
    if len(tail) != 1:
        raise ValueError(f"{len(tail)} blocks remain after inlining the epilogue")
    store = tail[0].body
    names = _output_index_names(store)
    text = store.value.script()
    acc_name = str(acc_buf.name)
    if match.pair:
        text = _paired(text, store, acc_buf, match.pair, acc)
    index_text = ", ".join(n if n is not None else "0" for n in names)
    for found in re.findall(rf"\b{re.escape(acc_name)}\[([^\]]*)\]", text):
        if found.replace("T.int64(0)", "0") != index_text:
            raise ValueError("the epilogue reads the accumulator at another element")
    text = re.sub(rf"\b{re.escape(acc_name)}\[[^\]]*\]", acc, text)
    others = {m for m in re.findall(r"\b(\w+)\[", text)} - {"T"}
    if others - params.keys():
        raise ValueError(f"the epilogue reads intermediates {sorted(others - params.keys())}")
    if RESERVED.search(re.sub(r"\bT\.\w+|K_ACC|K_UP|\"[^\"]*\"", "", text)):
        raise ValueError("an epilogue name collides with the kernel's own")
    reads = [_read(m.group(0), params[m.group(1)], m.group(2), tuple(names))
             for m in re.finditer(r"\b(\w+)\[([^\]]*)\]", text) if m.group(1) != "T"]
    reads = list({r.text: r for r in reads}.values())
    pairable = tuple(_pairable(r, params[r.buffer], tuple(names), match) for r in reads)
    return Epilogue(text, tuple(names), tuple(reads), pairable)


def _inline_intermediates(sch: s_tir.Schedule, root, matmul: str, params: dict) -> None:
    """Inline every block but the matmul (named ``matmul``) and those writing a parameter, until
    TVM can inline none of the rest; one it cannot stays, and ``extract_epilogue`` then rejects
    the function. Starts over after each inlining: it changes the list of child blocks."""
    progress = True
    while progress:
        progress = False
        for block in sch.get_child_blocks(root):
            stmt = sch.get(block)
            if stmt.name_hint == matmul or str(stmt.writes[0].source.name) in params:
                continue
            try:
                sch.compute_inline(block)
                progress = True
                break
            except Exception:  # noqa: BLE001 - not inlinable: extract_epilogue rejects the function
                continue


def _output_index_names(store: tirx.BufferStore) -> list[str | None]:
    """The name of each index variable of the output store, None for a constant 0 index (a
    unit dimension); ValueError for any other index expression."""
    names = []
    for idx in store.indices:
        if isinstance(idx, tirx.Var):
            names.append(str(idx.name))
        elif isinstance(idx, tirx.IntImm) and idx.value == 0:
            names.append(None)
        else:
            raise ValueError("the output is not indexed by plain variables")
    return names


def _paired(text: str, store, acc_buf, g: int, acc: str) -> str:
    """``text`` with the accumulator's reads that pair into the output element (see
    ``MatmulMatch.pair_columns``) as ``K_ACC`` (the first) and ``K_UP`` (the second, ``g``
    columns on: the next chunk's accumulator)."""
    loads = []
    tvm_ffi.structural_walk(store.value, (ir.TensorLoad, lambda x: loads.append(x) if x.source.same_as(acc_buf) else None),
                            order="pre")
    for load in loads:
        offset = pair_offset(load.indices, store.indices, g)
        if offset is None:
            raise ValueError("the epilogue reads the accumulator outside the column pairs")
        text = text.replace(load.script(), acc if offset == 0 else acc.replace("K_ACC", "K_UP"))
    return text


def _read(text: str, param: tirx.Var, index_text: str, names: tuple[str | None, ...]) -> Read:
    """A read of ``param``; per row when it is indexed by an output index that changes within
    a tile: not the column, nor the first of three or more (a batch or a convolution's image:
    one per tile)."""
    indices = tuple(i.strip() for i in index_text.split(","))
    rows = names[1:-1] if len(names) >= 3 else names[:-1]
    per_row = any(r is not None and r in indices for r in rows)
    col = names[-1] if names else None
    words = set(re.findall(r"\b\w+\b", index_text))
    return Read(text, str(param.name), indices, str(param.dtype), per_row,
                scalar=_constant_inside(indices, param), row_only=per_row and col not in words)


def _constant_inside(indices: tuple[str, ...], param) -> bool:
    """Every index an integer literal inside the tensor's static shape."""
    shape = list(getattr(param, "shape", ()))
    if len(shape) != len(indices):
        return False
    for idx, dim in zip(indices, shape):
        found = re.fullmatch(r"(?:T\.int(?:32|64)\()?(\d+)\)?", idx)
        if found is None or not isinstance(dim, tirx.IntImm) or int(found.group(1)) >= dim.value:
            return False
    return True


def _pairable(read: Read, param, names: tuple[str | None, ...], match: WgmmaMatch) -> bool:
    """Elements ``col`` and ``col + 1`` of the read are adjacent 16-bit values, the pair 4-byte
    aligned and inside the tensor whenever ``col < N`` (``col`` even)."""
    col = names[-1] if names else None
    plain = {n for n in names if n is not None} | {"0", "T.int64(0)"}
    last = param.shape[-1] if len(param.shape) else None
    return (
        read.dtype in (*FROM_BITS, "float32") and col is not None and read.indices[-1] == col
        and all(i in plain for i in read.indices) and read.indices.count(col) == 1
        and isinstance(last, tirx.IntImm) and last.value % 2 == 0 and isinstance(match.n, int) and match.n % 2 == 0
    )  # fmt: skip

"""The TMA side of the Hopper matmul template (``matmul_wgmma``): how each operand's tiles are
loaded into 128-byte-swizzled shared memory (tensor-map dims, strides, box, coordinates,
multicast within a cluster, L2 promotion) and described to wgmma (LBO/SBO), and how the output
is stored in 64-row x 128-byte chunks. NHWC convolutions load their input as 4-D boxes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx

from fastdlight.analysis.wgmma_match import SWIZZLE_BYTES, WgmmaMatch
from fastdlight.analysis.wgmma_conv import PATCH_W, ConvGeometry
from fastdlight.analysis.wgmma_view import OperandView

SWIZZLE_128B = 3  # CUtensorMapSwizzle and the wgmma descriptor helper use the same code
L2_PROMO_128B, L2_PROMO_256B = 2, 3  # CUtensorMapL2promotion
ATOM_ROWS = 8  # a 128B swizzle atom is 8 rows x 128 bytes (1024 bytes)


@dataclass(frozen=True)
class Operand:
    """How one input is loaded (TMA box, coordinates) and described to wgmma (LBO/SBO)."""

    k_major: bool
    rows: int  # the tile's extent along M (A) or N (B)
    bk: int
    dims: tuple[int, ...]  # the global tensor, innermost first (TMA order)
    elem_bytes: int
    #: CTAs of a cluster sharing the tile: each loads its share of the pieces (``mine``) and
    #: multicasts them to all (B of a 2-CTA cluster along M, A of one along N); 1: loaded whole, unicast
    split: int = 1
    #: read through a view of a larger tensor (the box spans its row and K axes), or None
    view: OperandView | None = None

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(math.prod(self.dims[: i + 1]) * self.elem_bytes for i in range(self.rank - 1))

    @property
    def chunks(self) -> int:
        """64-column chunks of an MN-major tile (K-major: 1)."""
        return 1 if self.k_major else self.rows // (SWIZZLE_BYTES // self.elem_bytes)

    @property
    def k_pieces(self) -> int:
        """Pieces along K of each MN-major chunk: 1, or ``split`` where the chunks do not split
        evenly among a cluster's CTAs (192 columns: 3 chunks for 2 CTAs). Each piece is then
        ``bk / split`` rows, whole 8-row swizzle atoms, so the swizzle is the same."""
        return self.split if not self.k_major and self.chunks % self.split else 1

    @property
    def box(self) -> tuple[int, ...]:
        inner = ((self.bk, self.rows // self.split) if self.k_major
                 else (SWIZZLE_BYTES // self.elem_bytes, self.bk // self.k_pieces))
        if self.view is None:
            return inner + (1,) * (self.rank - 2)
        box = [1] * self.rank
        k_axis, row_axis = self.view.k_axis, self.view.row_axis
        box[k_axis if self.k_major else row_axis], box[row_axis if self.k_major else k_axis] = inner
        return tuple(box)

    @property
    def elem_strides(self) -> tuple[int, ...]:
        return (1,) * self.rank

    @property
    def loads(self) -> int:
        """TMA loads per stage: one box (one per CTA sharing it), or one per 64-wide column
        chunk (and K piece) when MN-major."""
        return self.split if self.k_major else self.chunks * self.k_pieces

    @property
    def chunk_elems(self) -> int:
        """Shared-memory elements from one load's destination to the next."""
        if self.k_major:
            return self.rows // self.split * self.bk
        return self.bk // self.k_pieces * SWIZZLE_BYTES // self.elem_bytes

    def mine(self, c, rank):
        """Whether the CTA of cluster rank ``rank`` issues load ``c`` (each piece once)."""
        return True if self.split == 1 else c % self.split == rank

    def load_args(self, mbar):
        """The TMA load's arguments after the coordinates: the stage's barrier (and, shared
        by a cluster, the mask of the CTAs the piece is multicast to)."""
        return [mbar] if self.split == 1 else [mbar, tirx.const((1 << self.split) - 1, "uint16")]

    @property
    def lbo(self) -> int:
        """Leading byte offset >> 4: unused for swizzled K-major; the column-chunk stride else."""
        return 1 if self.k_major else self.bk * SWIZZLE_BYTES // 16

    @property
    def sbo(self) -> int:
        """Stride byte offset >> 4: from one 8-row swizzle atom to the next."""
        return ATOM_ROWS * SWIZZLE_BYTES // 16

    @property
    def k_step(self) -> int:
        """Descriptor address step (16-byte units) between the K slices of a stage one wgmma
        reads each: 32 bytes along a K-major row (k16 of 16-bit, k32 of 8-bit elements); 16
        swizzled rows of an MN-major tile (16-bit only)."""
        return 32 // 16 if self.k_major else 16 * SWIZZLE_BYTES // 16

    @property
    def desc_high(self) -> int:
        """The wgmma descriptor's constant high word, in place: the stride byte offset (bits
        32-45) and the layout (bits 62-63, 1 = 128B swizzle); base offset 0."""
        return (self.sbo | 1 << 30) << 32

    def desc_low(self, smem_addr):
        """The descriptor's low word at shared address ``smem_addr`` (uint32): the start address
        >> 4 (14 bits: shared memory is under 256 KB) and the leading byte offset (bits 16-29).
        A stage or k16 slice further moves only the start address, by a 32-bit add to this word."""
        return tirx.bitwise_or(tirx.bitwise_and(tirx.shift_right(smem_addr, tirx.const(4, "uint32")),
                                                tirx.const(0x3FFF, "uint32")),
                               tirx.const(self.lbo << 16, "uint32"))

    def descriptor(self, low, step):
        """The 64-bit descriptor of low word ``low`` moved ``step`` 16-byte units."""
        moved = low + (tirx.const(step, "uint32") if isinstance(step, int) else tirx.Cast("uint32", step))
        return tirx.bitwise_or(tirx.const(self.desc_high, "uint64"), tirx.Cast("uint64", moved))

    @property
    def transposed(self) -> int:
        return 0 if self.k_major else 1

    @property
    def l2_promotion(self) -> int:
        """256-byte L2 promotion, or 128-byte where the rows are not 128-byte aligned (fp16 K = 1000):
        each box row then straddles two lines, and 256-byte fetches around both cost more than
        they bring (3000x5120x1000 NT on an H100: 0.084 ms with 256, 0.073 with 128 or none;
        aligned shapes the same either way, within noise)."""
        row = self.dims[0]
        row = row.value if isinstance(row, tirx.IntImm) else row
        if isinstance(row, int) and row * self.elem_bytes % SWIZZLE_BYTES:
            return L2_PROMO_128B
        return L2_PROMO_256B

    @property
    def load_op(self) -> str:
        multicast = ".multicast::cluster" if self.split > 1 else ""
        return f"cp.async.bulk.tensor.{self.rank}d.shared::cluster.global.mbarrier::complete_tx::bytes{multicast}"

    def coords(self, b, blk, k, c):
        """Load ``c``'s box at K step ``k``: piece ``c`` of a K-major tile, or K piece
        ``c % k_pieces`` of column chunk ``c // k_pieces`` of an MN-major one."""
        if self.k_major:
            row0, k0 = blk * self.rows + c * (self.rows // self.split), k * self.bk
        else:
            chunk, piece = c // self.k_pieces, c % self.k_pieces
            row0 = blk * self.rows + chunk * (SWIZZLE_BYTES // self.elem_bytes)
            k0 = k * self.bk + piece * (self.bk // self.k_pieces)
        if self.view is not None:
            return self.view.coords(b, row0, k0)
        batch = [b] if self.rank == 3 else []
        return ([k0, row0] if self.k_major else [row0, k0]) + batch


@dataclass(frozen=True)
class Output:
    """The output's TMA store: 64-row x 128-byte chunks, one consumer warpgroup's rows each.
    Where TMA cannot address its rows (``tma`` false: a row is not a multiple of 16 bytes) the
    warpgroup's threads store each chunk from shared memory themselves, one element a store,
    consecutive threads on consecutive columns."""

    dims: tuple[int, ...]
    elem_bytes: int
    bm: int
    tma: bool = True

    def host(self, d_name: str) -> list[str]:
        """The kernel's host statements for the output: its tensor map (TMA), or none."""
        if not self.tma:
            return ["T.evaluate(0)"]
        return ['D_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)',
                f'T.call_packed("runtime.cuTensorMapEncodeTiled", D_map, K_OUT_DTYPE, len(K_D.dims), {d_name}.data, '
                "*K_D.dims, *K_D.strides, *K_D.box, *K_D.elem_strides, 0, K_SWIZZLE_128B, 0, 0)"]

    def prefetch(self) -> list[str]:
        return ['T.ptx["prefetch.tensormap"](T.address_of(D_map))'] if self.tma else ["T.evaluate(0)"]

    def store_chunk(self, d_name: str, d_shape: tuple[int, ...], m, n, out_dtype: str) -> list[str]:
        """Statements storing the warpgroup's staged chunk (``k_Cs[k_cw, k_buf]``, rows from
        ``K_PLAN.row0(k_cw) + k_mi * 64`` of tile ``k_m``, columns from chunk ``k_c`` of tile
        ``k_n``) to the output ``d_name`` of shape ``d_shape`` (``[batch?, m, n]`` and unit axes)."""
        col0 = "k_n * K_PLAN.out_bn + k_c * K_PLAN.chunk_cols"
        if self.tma:
            return ["if k_ltid == 0:",
                    f"    T.ptx[K_D.store_op](T.address_of(D_map), *K_D.store_coords(k_b, {col0}, k_m, "
                    "K_PLAN.row0(k_cw) + k_mi * 64), k_Cs.ptr_to([k_cw, k_buf, 0]))",
                    "    T.ptx.cp.async_.bulk.commit_group()"]
        row = "(k_m * K_PLAN.bm + K_PLAN.row0(k_cw) + k_mi * 64 + k_r)"
        col = f"({col0} + k_q)"
        if self.elem_bytes == 2:
            half = "T.Cast(\"uint16\", k_word >> T.Cast(\"uint32\", 16 * (k_q % 2)))"
            value = f'T.reinterpret("{out_dtype}", {half})'
        else:
            value = f'T.reinterpret("{out_dtype}", k_word)'
        axes = [i for i, extent in enumerate(d_shape) if extent != 1]
        roles = dict(zip(axes[::-1], (col, row, "k_b")))  # the innermost axes that are not 1
        index = ", ".join(roles.get(i, "0") for i in range(len(d_shape)))
        return ["for k_e in T.unroll(64 * K_PLAN.chunk_cols // 128):",
                "    k_r = T.meta_var((k_e * 128 + k_ltid) // K_PLAN.chunk_cols)",
                "    k_q = T.meta_var((k_e * 128 + k_ltid) % K_PLAN.chunk_cols)",
                "    k_word = T.meta_var(k_Cs[k_cw, k_buf, k_r * 32 + K_PLAN.swizzled_word(k_r, k_q)])",
                f"    if {row} < {m} and {col} < {n}:",
                f"        {d_name}[{index}] = {value}"]

    @property
    def chunk_cols(self) -> int:
        return SWIZZLE_BYTES // self.elem_bytes

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(math.prod(self.dims[: i + 1]) * self.elem_bytes for i in range(len(self.dims) - 1))

    @property
    def box(self) -> tuple[int, ...]:
        return (self.chunk_cols, 64) + (1,) * (len(self.dims) - 2)

    @property
    def elem_strides(self) -> tuple[int, ...]:
        return (1,) * len(self.dims)

    @property
    def store_op(self) -> str:
        return f"cp.async.bulk.tensor.{len(self.dims)}d.global.shared::cta.tile.bulk_group"

    def store_coords(self, b, col, m_tile, row):
        """Coordinates of the chunk at ``row`` of M tile ``m_tile``, columns from ``col``."""
        return [col, m_tile * self.bm + row] + ([b] if len(self.dims) == 3 else [])


@dataclass(frozen=True)
class ConvInput(Operand):
    """The A tile of an NHWC convolution's K step: a 4-D box of the input (channels, a patch of
    ``PATCH_W`` x ``bm / PATCH_W`` pixels at the convolution's element stride), see
    :mod:`fastdlight.analysis.wgmma_conv`."""

    geo: ConvGeometry | None = None

    @property
    def box(self) -> tuple[int, ...]:
        sh, sw = self.geo.stride
        return (self.bk, PATCH_W * sw, self.geo.patch_rows(self.rows) * sh, 1)

    @property
    def elem_strides(self) -> tuple[int, ...]:
        return (1, self.geo.stride[1], self.geo.stride[0], 1)

    def coords(self, b, blk, k, c):
        img, p0, q0 = self.geo.patch(blk, self.rows)
        r, s, c0 = self.geo.tap(k)
        (sh, sw), (ph, pw) = self.geo.stride, self.geo.pad
        return [c0, q0 * sw + s - pw, p0 * sh + r - ph, img]


@dataclass(frozen=True)
class ConvOutput(Output):
    """The output ``[N, P, Q, K]`` stored as boxes of a tile's patch: 64 rows (``64 / PATCH_W``
    image rows) by 128 bytes of channels; TMA clips what falls past the image."""

    geo: ConvGeometry | None = None

    @property
    def box(self) -> tuple[int, ...]:
        return (self.chunk_cols, PATCH_W, 64 // PATCH_W, 1)

    def store_coords(self, b, col, m_tile, row):
        img, p0, q0 = self.geo.patch(m_tile, self.bm)
        return [col, q0, p0 + row // PATCH_W, img]


def operands(match: WgmmaMatch, bm: int, bn: int, bk: int, cluster: int = 1,
             cluster_axis: str = "m") -> tuple[Operand, Operand, Output]:
    """A's, B's and the output's TMA plans; a cluster along M shares B, one along N shares A."""
    def dims(inner, outer, batched):
        return (inner, outer) + ((match.batch,) if batched and match.batch > 1 else ())

    eb = match.in_bytes
    a_split, b_split = (1, cluster) if cluster_axis == "m" else (cluster, 1)
    if match.b_view is not None:
        b = Operand(match.b_k_major, bn, bk, match.b_view.dims, eb, b_split, match.b_view)
    else:
        b = Operand(match.b_k_major, bn, bk, dims(match.k, match.n, match.b_batched) if match.b_k_major
                    else dims(match.n, match.k, match.b_batched), eb, b_split)
    geo = match.conv
    if geo is not None:  # the input's 4-D boxes; the weights [K, R*S*C] are B as they are
        a = ConvInput(True, bm, bk, (geo.c, geo.w, geo.h, geo.n), eb, geo=geo)
        return a, b, ConvOutput((match.n, geo.q, geo.p, geo.n), match.out_bytes, bm, geo=geo)
    if match.a_view is not None:
        a = Operand(match.a_k_major, bm, bk, match.a_view.dims, eb, a_split, view=match.a_view)
    else:
        a = Operand(match.a_k_major, bm, bk, dims(match.k, match.m, match.a_batched) if match.a_k_major
                    else dims(match.m, match.k, match.a_batched), eb, a_split)
    d = Output(dims(match.out_n, match.m, True), match.out_bytes, bm, match.tma_store)
    return a, b, d

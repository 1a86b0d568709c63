"""The mma.sync attention kernel's compile-time numbers for one (shape, config): warps and
tiles, the shared-memory layout (XOR-swizzled 16-byte chunks), where each operand's rows are,
the fragments' register counts and the order the CTAs take the query tiles in."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from fastdlight.analysis.attention import fused_head_dim, mma_padded_dim, operand_indices, q_in_registers
from fastdlight.schedules.attention.plan import AttentionTiles

#: elements in a 16-byte chunk: one cp.async, one row of an ldmatrix 8x8 matrix
CHUNK = 8
MMA_NAME = {"float16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            "bfloat16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}


@dataclass(frozen=True)
class MmaAttentionPlan(AttentionTiles):
    """A CTA computes ``bm`` query rows of one (batch, head): a warp each ``wm`` of them (16: one
    m16 tile, Q's fragments held in registers up to head dim 192; 32: two, sharing each K and V
    fragment; elsewhere Q's fragments are re-read from shared memory at each step). The
    ``bn``-key tiles of K and V stream through a ``stages``-deep ring of ``cp.async`` copies."""

    wm: int = 16
    #: the GPU's SMs (how many tiles run at once: the tiles of ``head_block`` heads come together
    #: so that the K/V they stream stays in L2)
    sms: int = 132

    @property
    def max_ctas(self) -> None:
        """A CTA a query tile (no persistent grid)."""
        return None

    def __post_init__(self):
        d = self.shape.head_dim
        if (self.wm not in (16, 32) or self.bm % self.wm or self.bm > 128 or self.bn % 16 or self.bn > 128
                or not fused_head_dim(d)):
            raise ValueError(f"no mma.sync attention tile {self.bm}x{self.bn} (warps of {self.wm}) at head dim {d}")
        if self.stages < 2 or self.shape.dtype not in MMA_NAME:
            raise ValueError("the mma.sync attention kernel needs two stages or more, fp16 or bf16")
        if self.bn * self.chunks % self.threads:
            raise ValueError(f"{self.bn} keys of {self.chunks} chunks do not split evenly over {self.threads} threads")

    # --- the grid ---------------------------------------------------------------------------

    @property
    def warps(self) -> int:
        return self.bm // self.wm

    @property
    def mt(self) -> int:
        """m16 tiles a warp: its rows over 16."""
        return self.wm // 16

    @property
    def q_in_regs(self) -> bool:
        return q_in_registers(self.shape.head_dim, self.wm)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def ctas(self) -> int:
        return self.q_tiles * self.bh

    @property
    def mma(self) -> str:
        return MMA_NAME[self.shape.dtype]

    # --- registers ----------------------------------------------------------------------------

    @property
    def padded_dim(self) -> int:
        """The head dim computed over: D rounded up to whole 16-column steps (zeros past D)."""
        return mma_padded_dim(self.shape.head_dim)

    @property
    def d_steps(self) -> int:
        return self.padded_dim // 16

    @property
    def q_regs(self) -> int:
        """Q's A fragments: held for the whole tile (four words a 16-column step of D), or those
        of one step for each m16 tile."""
        return self.padded_dim // 4 if self.q_in_regs else 4 * self.mt

    def q_at(self, mt, kk):
        """Where the A fragment of m16 tile ``mt`` at D step ``kk`` is in the Q registers."""
        return kk * 4 if self.q_in_regs else mt * 4

    # --- shared memory ------------------------------------------------------------------------

    @property
    def chunks(self) -> int:
        """16-byte chunks copied a row: those of the padded head dim (past D, zeros)."""
        return self.padded_dim // CHUNK

    @property
    def row_elems(self) -> int:
        """A tile row's elements in shared memory: D rounded up to 64 (a whole number of 8-chunk
        swizzle groups: head dims such as 80 and 96 pad their rows)."""
        return -(-self.padded_dim // 64) * 64

    @property
    def q_elems(self) -> int:
        return self.bm * self.row_elems

    @property
    def kv_elems(self) -> int:
        return self.bn * self.row_elems

    def smem_bytes(self) -> int:
        return 2 * (self.q_elems + 2 * self.stages * self.kv_elems)

    def at(self, row, chunk):
        """Element offset of chunk ``chunk`` of tile row ``row``: the chunk's bits XOR the
        row's low three, so the 8 rows an ldmatrix matrix reads fall in 8 different banks."""
        return row * self.row_elems + tirx.bitwise_xor(chunk, row % 8) * CHUNK

    # --- the operands in global memory --------------------------------------------------------

    def index(self, which: int, bh, token, chunk) -> list:
        """Indices of the first element of chunk ``chunk`` of row ``token`` of operand ``which``
        (0 Q, 1 K, 2 V) for the query (batch, head) ``bh``: K and V read head ``h // group``."""
        s = self.shape
        h = bh % s.heads
        return operand_indices(s, which, bh // s.heads, h if which == 0 else h // s.group, token, chunk * CHUNK)

    def seq(self, which: int) -> int:
        return self.shape.seq_q if which == 0 else self.shape.seq_kv

    # --- copies -------------------------------------------------------------------------------

    def copy_steps(self, buf, stage, which: int, first, rows: int) -> int:
        """cp.async steps of the CTA's threads to copy ``rows`` rows (16 bytes a thread a step)."""
        return rows * self.chunks // self.threads

    def copy_args(self, operands, buf, stage, which: int, first, rows: int, bh, slot) -> list:
        """Operands of the ``cp.async`` of chunk ``slot`` (of ``rows * chunks``) into ``buf``
        (at ``stage`` of its ring, or ``None``): destination, source, 16 bytes, and the bytes
        to read (0 past the operand's end or D: zeros; the address clamped inside it)."""
        row, chunk = slot // self.chunks, slot % self.chunks
        token = first + row
        last, last_chunk = self.seq(which) - 1, self.shape.head_dim // CHUNK - 1
        at = self.at(row, chunk)
        dst = buf.ptr_to([at] if stage is None else [stage, at])
        src = operands[which].ptr_to(self.index(which, bh, tirx.min(token, last), tirx.min(chunk, last_chunk)))
        padded = self.padded_dim > self.shape.head_dim
        inside = tirx.all(token <= last, chunk <= last_chunk) if padded else token <= last
        return [dst, src, 16, tirx.Select(inside, tirx.const(16, "uint32"), tirx.const(0, "uint32"))]

    def q_frag_at(self, warp, lane, mt, kk):
        """Where lane ``lane`` of ``warp`` points its ldmatrix of Q's m16 tile ``mt`` at D step
        ``kk``: row ``lane % 16`` of the tile, the step's first or second 8 columns."""
        return self.at(warp * self.wm + mt * 16 + lane % 16, kk * 2 + lane // 16)

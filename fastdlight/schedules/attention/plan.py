"""The fused attention kernel's compile-time numbers for one (shape, config): tiles, warpgroups,
stage ring, registers, the wgmma instructions and operand descriptors, the launch order."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import tirx

from fastdlight.analysis.attention import AttentionShape, wgmma_padded_dim
from fastdlight.policies.attention import PRODUCER_REGS, consumer_regs
from fastdlight.schedules.wgmma.tma import SWIZZLE_BYTES, Operand

ABBR = {"float16": "f16", "bfloat16": "bf16"}
LOG2E = 1.4426950408889634


def _strides(dims: tuple[int, ...], elem_bytes: int) -> tuple[int, ...]:
    """Byte strides of a dense tensor's outer dims (``dims`` innermost first)."""
    return tuple(math.prod(dims[: i + 1]) * elem_bytes for i in range(len(dims) - 1))


@dataclass(frozen=True)
class AttentionTiles:
    """What both fused attention kernels share of a tiling: ``bm`` query rows of one (batch,
    head) a CTA, ``bn``-key tiles of K and V through a ``stages``-deep ring; the order the tiles
    are dealt in, which tiles a query tile reads and masks, and the fragments' register counts
    (the m16/m64 accumulator layouts give a thread the same share of each tile's columns)."""

    shape: AttentionShape
    bm: int
    bn: int
    stages: int

    @property
    def bh(self) -> int:
        return self.shape.batch * self.shape.heads

    @property
    def q_tiles(self) -> int:
        return -(-self.shape.seq_q // self.bm)

    # the order the tiles are dealt in (a subclass has ``sms``, the GPU's SMs, and ``max_ctas``,
    # a persistent grid's size or None)

    @property
    def head_block(self) -> int:
        """Heads whose query tiles come together (:meth:`query_tile`), so that the CTAs running
        at once stream the K/V of these heads, which stay in L2, not of every head (at B1 H32
        on 132 SMs: four CTAs to a head). Without a causal mask, one (the tiles weigh the same).
        Causal on a CTA-a-tile grid, enough heads for the SMs (the hardware hands each free SM
        the next tile, heaviest first within the block, which evens the work out); causal on
        a persistent grid, every head (the snake's rounds even the work out only when each
        round's tiles weigh the same)."""
        if not self.shape.causal:
            return 1
        if self.max_ctas is not None:
            return self.bh
        # a whole number of blocks: a smaller last block's heavy tiles would come last, when
        # the other SMs run out of work (B1 H32 T4096 in blocks of 5: the busiest SM 16% over)
        least = -(-self.sms // self.q_tiles)
        return next(g for g in range(min(least, self.bh), self.bh + 1) if self.bh % g == 0)

    def _block_position(self, tile):
        """``(head, position)`` of ``tile`` within its block of :attr:`head_block` heads: the
        block's heads take turns, ``position`` counting the query tiles from the heaviest."""
        g = self.head_block
        if g == 1:
            return tile // self.q_tiles, tile % self.q_tiles
        block, i = tile // (g * self.q_tiles), tile % (g * self.q_tiles)
        return block * g + i % g, i // g

    def query_tile(self, tile):
        """The query tile (block of rows) of tile ``tile``: the last first (causal: the heaviest)."""
        return self.q_tiles - 1 - self._block_position(tile)[1]

    def head_of(self, tile):
        """The (batch * heads) row of tile ``tile``."""
        return self._block_position(tile)[0]

    def kv_tiles(self, qt):
        """K/V tiles query tile ``qt`` reads: all, or (causal) up to its last row's diagonal."""
        s = self.shape
        total = -(-s.seq_kv // self.bn)
        if not s.causal:
            return total
        last_key = (qt + 1) * self.bm + s.offset  # one past the last key the tile's last row sees
        return tirx.min((last_key + self.bn - 1) // self.bn, total)

    def visible(self, row, col):
        """Whether query ``row`` sees key ``col`` (a key past the end: no)."""
        s = self.shape
        seen = col < s.seq_kv
        return tirx.all(seen, col <= row + s.offset) if s.causal else seen

    def needs_mask(self, j, qt):
        """Whether key tile ``j`` holds keys some row of query tile ``qt`` must not see: past
        the end, or (causal) past the diagonal of the tile's first row."""
        s = self.shape
        last = (j + 1) * self.bn  # one past the tile's last key
        past_end = last > s.seq_kv
        return tirx.any(past_end, last - 1 > qt * self.bm + s.offset) if s.causal else past_end

    @property
    def scale_log2(self) -> float:
        return self.shape.scale * LOG2E

    @property
    def s_regs(self) -> int:
        """fp32 accumulator registers of a thread's share of its rows' scores (bn keys)."""
        return self.bn // 2

    @property
    def padded_dim(self) -> int:
        """The head dim O is computed over (each template pads D to its own steps)."""
        return self.shape.head_dim

    @property
    def o_regs(self) -> int:
        """fp32 accumulator registers of a thread's share of its rows of O (the padded dim)."""
        return self.padded_dim // 2

    @property
    def p_regs(self) -> int:
        """P as A fragments: 16-bit pairs, four words a 16-key step."""
        return self.bn // 4


@dataclass(frozen=True)
class AttentionPlan(AttentionTiles):
    """A CTA computes ``bm`` query rows of one (batch, head) at a time: ``bm / 64`` consumer
    warpgroups of 64 rows each, and a producer warpgroup streaming ``bn``-key tiles of K and V
    through a ``stages``-deep ring. ``max_ctas``: the grid's size at most (a persistent grid, a
    CTA per SM, walks the tiles; None: a CTA per tile)."""

    max_ctas: int | None = None
    pingpong: bool = False
    #: the GPU's SMs (how many tiles run at once: :attr:`head_block`)
    sms: int = 132
    #: O leaves through shared memory and TMA stores (where the SM's shared memory holds a tile
    #: of it beside the ring), else by 32-bit stores from registers
    stage_o: bool = False

    # --- the grid ---------------------------------------------------------------------------

    @property
    def consumers(self) -> int:
        return self.bm // 64

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def producer_regs(self) -> int:
        return PRODUCER_REGS

    @property
    def consumer_regs(self) -> int:
        """What the SM's 64K registers leave each consumer thread (a multiple of 8, at most 240)."""
        return consumer_regs(self.consumers)

    @property
    def heads(self) -> int:
        return self.shape.heads

    @property
    def seq_q(self) -> int:
        return self.shape.seq_q

    @property
    def tiles(self) -> int:
        """Query tiles of the whole problem: one per (batch, head, block of ``bm`` rows)."""
        return self.q_tiles * self.bh

    @property
    def ctas(self) -> int:
        """A CTA per tile, or a persistent grid of ``max_ctas`` (a CTA per SM: one fits, the
        ring takes most of its shared memory) where there are more tiles."""
        return min(self.tiles, self.max_ctas or self.tiles)

    @property
    def tiles_per_cta(self) -> int:
        return -(-self.tiles // self.ctas)

    def tile_of(self, cta, it):
        """The tile CTA ``cta`` takes in its round ``it``: rounds of ``ctas`` tiles, the odd ones
        dealt in reverse (a snake). Tiles come heaviest first, so each CTA's heavy tile of one
        round pairs with a light one of the next. Causal tiles of 128 rows on 132 CTAs, dealt in
        order, gave the busiest CTA 12.5% more key tiles to read than the mean at B1 H32 T4096
        and 14.6% at B8 H12 T1024; snaked, 0% and 3.1%."""
        return it * self.ctas + cta + it % 2 * (self.ctas - 1 - 2 * cta)

    def kv_head(self, bh):
        """The K/V head (row of the [B*G] axis) query head ``bh`` (of [B*H]) reads."""
        s = self.shape
        return bh // s.heads * s.kv_heads + bh % s.heads // s.group

    # --- shared memory ----------------------------------------------------------------------

    @property
    def elem_bytes(self) -> int:
        return 2

    @property
    def padded_dim(self) -> int:
        """The head dim O is computed over: whole 64-column chunks (:func:`wgmma_padded_dim`)."""
        return wgmma_padded_dim(self.shape.head_dim)

    @property
    def padded(self) -> bool:
        """Whether D is short of whole chunks: O's columns past it are not stored."""
        return self.padded_dim != self.shape.head_dim

    @property
    def d_chunks(self) -> int:
        """128-byte (64-column) chunks of a head's D columns (the last zero-filled past D)."""
        return self.padded_dim * self.elem_bytes // SWIZZLE_BYTES

    @property
    def q_elems(self) -> int:
        return self.bm * self.padded_dim

    @property
    def kv_elems(self) -> int:
        return self.bn * self.padded_dim

    @property
    def q_bytes(self) -> int:
        return self.q_elems * self.elem_bytes

    @property
    def kv_bytes(self) -> int:
        return self.kv_elems * self.elem_bytes

    # --- tensor maps, one per input (0: Q, 1: K, 2: V): [B*heads, T, D] (bhtd) or [B, T, heads, D]
    # (bthd, packed), innermost first

    def rank(self, which: int) -> int:
        return 3 if self.shape.operand_layouts[which] == "bhtd" else 4

    def dims(self, which: int) -> tuple[int, ...]:
        s = self.shape
        heads, tokens = (s.heads, s.seq_q) if which == 0 else (s.kv_heads, s.seq_kv)
        layout = s.operand_layouts[which]
        if layout == "bhtd":
            return (s.head_dim, tokens, s.batch * heads)
        if layout == "packed":
            heads = s.heads + 2 * s.kv_heads
        return (s.head_dim, heads, tokens, s.batch)

    def strides(self, which: int) -> tuple[int, ...]:
        return _strides(self.dims(which), self.elem_bytes)

    def box(self, which: int) -> tuple[int, ...]:
        """A load's box: 64 columns of a tile's tokens (``bm`` of Q, ``bn`` of K, V) of one head."""
        rows = self.bm if which == 0 else self.bn
        return (64, rows, 1) if self.rank(which) == 3 else (64, 1, rows, 1)

    def elem_strides(self, which: int) -> tuple[int, ...]:
        return (1,) * self.rank(which)

    def load_op(self, which: int) -> str:
        return f"cp.async.bulk.tensor.{self.rank(which)}d.shared::cluster.global.mbarrier::complete_tx::bytes"

    def coords(self, which: int, c, row0, bh):
        """Chunk ``c`` of the tile of input ``which`` from token ``row0``, for query head row
        ``bh`` (of [B*H]); K and V are read from its K/V head."""
        s = self.shape
        layout = s.operand_layouts[which]
        if layout == "bhtd":
            return [c * 64, row0, bh if which == 0 else self.kv_head(bh)]
        head = bh % s.heads if which == 0 else bh % s.heads // s.group
        if layout == "packed" and which > 0:  # Q's heads, then K's, then V's
            head = head + s.heads + (which - 1) * s.kv_heads
        return [c * 64, head, row0, bh // s.heads]

    # --- the output, staged (``stage_o``) -------------------------------------------------------

    @property
    def out_dims(self) -> tuple[int, ...]:
        """O as [B*H, TQ, D], innermost first."""
        s = self.shape
        return (s.head_dim, s.seq_q, s.batch * s.heads)

    @property
    def out_strides(self) -> tuple[int, ...]:
        return _strides(self.out_dims, self.elem_bytes)

    @property
    def o_stage_words(self) -> int:
        """32-bit words of O's staging rows (one word where O is not staged: the pool's minimum)."""
        return self.bm * self.padded_dim // 2 if self.stage_o else 1

    def staged_word(self, cw, row, col):
        """The word of O's 16-bit pair at (``row``, ``col`` even) of consumer ``cw``'s staging
        rows: chunk ``col // 64`` of [64 rows, 64 columns], 128-byte rows swizzled as TMA reads them."""
        chunk, byte = col // 64, (col % 64) * self.elem_bytes
        return (cw * self.d_chunks + chunk) * 64 * 32 + row * 32 + ((byte // 16) ^ (row % 8)) * 4 + byte % 16 // 4

    def stored(self, row, col):
        """Whether O's element (``row``, ``col``) is stored from registers: rows past the end
        are not, nor (a padded head dim) the zero columns past D."""
        inside = row < self.seq_q
        return tirx.all(inside, col < self.shape.head_dim) if self.padded else inside

    def store_barrier(self, cw: int) -> int:
        """The named barrier of consumer ``cw``'s staging (after 0, the CTA's, and the turns')."""
        return 1 + self.consumers + cw

    def smem_bytes(self) -> int:
        """Shared memory the kernel asks for: Q, the K/V ring, O's staging rows, barriers."""
        d, eb = self.padded_dim, self.elem_bytes
        return eb * d * (self.bm + 2 * self.stages * self.bn) + 4 * self.o_stage_words + 1024 + 64

    # --- wgmma ------------------------------------------------------------------------------

    @property
    def d_steps(self) -> int:
        """k16 steps of the scores: over D (its last step's columns past D are zeros)."""
        return -(-self.shape.head_dim // 16)

    @property
    def kv_steps(self) -> int:
        return self.bn // 16

    @property
    def s_mma(self) -> str:
        t = ABBR[self.shape.dtype]
        return f"wgmma.mma_async.sync.aligned.m64n{self.bn}k16.f32.{t}.{t}"

    @property
    def o_mma(self) -> str:
        t = ABBR[self.shape.dtype]
        return f"wgmma.mma_async.sync.aligned.m64n{self.padded_dim}k16.f32.{t}.{t}"

    def operands(self) -> tuple[Operand, Operand, Operand]:
        """Descriptors of Q (A, K-major, 64-column chunks of ``bm`` rows), K (B, K-major,
        chunks of ``bn`` rows) and V (B, MN-major: ``bn`` rows of K by D columns)."""
        s, eb = self.shape, self.elem_bytes
        q = Operand(True, self.bm, 64, self.dims(0), eb)
        k = Operand(True, self.bn, 64, self.dims(1), eb)
        v = Operand(False, self.padded_dim, self.bn, self.dims(2), eb)
        return q, k, v

    @property
    def q_chunk_units(self) -> int:
        """Descriptor units (16 bytes) from one 64-column chunk of Q to the next."""
        return self.bm * SWIZZLE_BYTES // 16

    @property
    def kv_chunk_units(self) -> int:
        return self.bn * SWIZZLE_BYTES // 16

    @property
    def kv_stage_units(self) -> int:
        return self.kv_bytes // 16

    def __post_init__(self):
        if self.bm % 64 or not 1 <= self.bm // 64 <= 3:
            raise ValueError(f"attention tile of {self.bm} rows: 64, 128 or 192")
        if self.pingpong and self.consumers < 2:
            raise ValueError("pingpong takes turns between two or more consumer warpgroups")
        if self.bn % 16 or not 16 <= self.bn <= 256:
            raise ValueError(f"attention key tile of {self.bn}: a multiple of 16 up to 256")
        if self.shape.head_dim % 8 or self.padded_dim > 256:
            raise ValueError(f"head dim {self.shape.head_dim}: whole 16-byte rows, at most 256")

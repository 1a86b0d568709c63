"""The wgmma kernel's compile-time numbers for one (function, config): tile, warpgroups, stages,
cluster, the launch order and the shared-memory layout (read by the template and its epilogue)."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from fastdlight.analysis.wgmma_conv import PATCH_W
from fastdlight.analysis.wgmma_match import WgmmaMatch
from fastdlight.policies.wgmma import (
    PRODUCER_REGS,
    SM90_SMEM_OPTIN,
    consumer_regs,
    consumer_warpgroups,
    staging_buffers,
    staging_bytes,
)
from fastdlight.schedules.wgmma.tma import ATOM_ROWS, SWIZZLE_BYTES

#: reuse of L2 between a worker's consecutive tiles (one wave of the grid after another): odd
#: tiles walk K backwards, so a wave starts on the K slices the wave before it loaded last,
#: still in L2; odd groups of ``group_m`` rows walk their columns right to left, so a group's
#: first wave meets the B columns the group before it loaded last. On an H100 (ncu, fp16 NN,
#: 128x256 tiles, group 16) DRAM reads fell from 148 to 122 MB on 4096^3 and from 1298 to
#: 1123 MB on 8192^3 (cuBLAS: 150 and 1347), and the 4096^3 kernels spent 1-2% less energy a
#: GEMM at the power limit, at the same speed. DRAM traffic costs energy there: the same
#: kernel loading one tile everywhere (145 MB less) spent 5% less and ran 6.5% faster
SNAKE_ORDER = True
ABBR = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
#: bytes of K one wgmma consumes: k16 of 16-bit inputs, k32 of 8-bit ones
WGMMA_K_BYTES = 32


@dataclass(frozen=True)
class Plan:
    """The kernel's compile-time numbers for one (function, config). Consumer warpgroups, each
    computing ``wg_m`` rows (one or two wgmma m64 slices) by ``bn`` columns: cooperative when
    the tile is ``2 * wg_m`` or ``3 * wg_m`` rows (two or three of them split it), ping-pong when
    it is ``wg_m`` rows (two take alternate tiles)."""

    match: WgmmaMatch
    bm: int
    bn: int
    bk: int
    stages: int
    group_m: int
    num_sms: int
    wg_m: int = 64
    cluster: int = 1  # CTAs of a cluster, sharing B (along M) or A (along N; see ``Operand.split``)
    cluster_axis: str = "m"
    smem: int = SM90_SMEM_OPTIN  # the shared memory a block may opt in to
    #: the epilogue's stores deferred into the next tile's first K steps (see ``held_chunks``)
    deferred: bool = False

    producer_regs = PRODUCER_REGS

    @property
    def consumers(self) -> int:
        return consumer_warpgroups(self.bm, self.wg_m)

    @property
    def consumer_regs(self) -> int:
        return consumer_regs(self.consumers)

    @property
    def pingpong(self) -> bool:
        return self.bm == self.wg_m

    @property
    def m_per_wg(self) -> int:
        return self.wg_m // 64

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def tile_step(self) -> int:
        return 2 if self.pingpong else 1

    def first_tile(self, cw):
        return cw if self.pingpong else 0

    @property
    def consumer_iters(self) -> int:
        return (self.tiles_per_worker + self.tile_step - 1) // self.tile_step

    @property
    def empty_arrivals(self) -> int:
        """Consumers that release each stage: the one whose tile it is, or both; in every CTA
        of the cluster (each one's producer also writes the others' stages)."""
        return (1 if self.pingpong else self.consumers) * self.cluster

    def row0(self, cw):
        """First tile row of consumer ``cw``."""
        return 0 if self.pingpong else cw * self.wg_m

    def row0_text(self) -> str:
        return "0" if self.pingpong else f"k_cw * {self.wg_m}"

    def a_offset(self, cw):
        """Element offset of consumer ``cw``'s first 64-row slice in an A stage (K-major rows of
        ``bk``, or MN-major 64-column chunks of ``bk`` rows: the same number); its further
        slices follow ``a_slice_units`` apart."""
        return self.row0(cw) * self.bk

    # M may be an expression (a symbolic row count, see symbolic_kernel): the tile counts then
    # are too, and the grid is one CTA per SM

    @property
    def grid_m(self) -> int:
        return self.match.m_tiles(self.bm)

    def out_coords(self, row: str, col: str) -> list[str]:
        """The output's indices of tile row ``row`` (text, within the tile) and column ``col``
        of the current tile (``k_b, k_m`` in scope), as TVMScript text."""
        geo = self.match.conv
        if geo is None:
            return ["k_b", f"(k_m * {self.bm} + {row})", col]
        per_image, tiles_q = geo.tiles_p(self.bm) * geo.tiles_q, geo.tiles_q
        return [f"(k_m // {per_image})",
                f"((k_m // {tiles_q}) % {geo.tiles_p(self.bm)} * {geo.patch_rows(self.bm)} + ({row}) // {PATCH_W})",
                f"(k_m % {tiles_q} * {PATCH_W} + ({row}) % {PATCH_W})", col]

    def in_bounds(self, coords: list[str], rows: bool = True) -> str:
        """Text of "the element at ``coords`` (from :meth:`out_coords`) is in the output"."""
        col = f"{coords[-1]} < {self.match.out_n}"
        if not rows:
            return col
        geo = self.match.conv
        if geo is None:
            return f"{coords[-2]} < {self.match.m} and {col}"
        return f"{coords[1]} < {geo.p} and {coords[2]} < {geo.q} and {col}"

    @property
    def grid_n(self) -> int:
        return -(-self.match.n // self.bn)

    def _along(self, axis: str) -> int:
        return self.cluster if self.cluster_axis == axis else 1

    @property
    def cluster_grid_m(self):
        """Clusters' rows of tiles: a cluster along M takes ``cluster`` vertically adjacent tiles."""
        return (self.grid_m + self._along("m") - 1) // self._along("m")

    @property
    def cluster_grid_n(self):
        """Clusters' columns of tiles: a cluster along N takes ``cluster`` horizontally adjacent ones."""
        return (self.grid_n + self._along("n") - 1) // self._along("n")

    @property
    def tiles(self) -> int:
        """Work items of the persistent loop: tiles, or clusters' groups of tiles."""
        return self.match.batch * self.cluster_grid_m * self.cluster_grid_n

    @property
    def workers(self) -> int:
        """Persistent workers: CTAs, or clusters of CTAs; one CTA per SM."""
        most = self.num_sms // self.cluster
        return min(most, self.tiles) if isinstance(self.tiles, int) else most

    @property
    def ctas(self) -> int:
        return self.workers * self.cluster

    @property
    def tiles_per_worker(self) -> int:
        return (self.tiles + self.workers - 1) // self.workers

    def cta_m(self, m, rank):
        """The M tile of the CTA of rank ``rank`` in a cluster whose group of tiles is ``m``."""
        return m * self.cluster + rank if self._along("m") > 1 else m

    def cta_n(self, n, rank):
        """The N tile of the CTA of rank ``rank`` in a cluster whose group of tiles is ``n``."""
        return n * self.cluster + rank if self._along("n") > 1 else n

    @property
    def k_steps(self) -> int:
        return -(-self.match.k // self.bk)

    @property
    def a_tile(self) -> int:
        return self.bm * self.bk

    @property
    def b_tile(self) -> int:
        return self.bn * self.bk

    @property
    def a_stage_units(self) -> int:
        """16-byte units from one A stage to the next (a wgmma descriptor's address step)."""
        return self.a_tile * self.match.in_bytes // 16

    @property
    def b_stage_units(self) -> int:
        return self.b_tile * self.match.in_bytes // 16

    @property
    def a_slice_units(self) -> int:
        """16-byte units from one 64-row slice of an A stage to the next (64 rows of ``bk``)."""
        return 64 * self.bk * self.match.in_bytes // 16

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * self.bk * self.match.in_bytes

    @property
    def slice_regs(self) -> int:
        """fp32 accumulator registers per thread of one m64nBN slice."""
        return self.bn // 2

    @property
    def acc_regs(self) -> int:
        return self.m_per_wg * self.slice_regs

    @property
    def chunk_cols(self) -> int:
        return SWIZZLE_BYTES // self.match.out_bytes

    @property
    def chunks(self) -> int:
        return self.bn // self.chunk_cols

    @property
    def out_bn(self) -> int:
        """Output columns of a tile: ``bn``, or half of it where the epilogue pairs chunks."""
        return self.bn // 2 if self.match.pair else self.bn

    @property
    def out_chunks(self) -> int:
        """Chunks of output a 64-row slice of a tile stores."""
        return self.out_bn // self.chunk_cols

    @property
    def held_chunks(self) -> int:
        """Output chunks a consumer thread's tile holds (a deferred epilogue stores one a K step)."""
        return self.m_per_wg * self.out_chunks

    @property
    def held_pairs(self) -> int:
        """A consumer thread's 16-bit output pairs of a tile, one 32-bit register each when held."""
        return self.held_chunks * self.chunk_cols // 8 * 2

    @property
    def held_regs(self) -> int:
        """Registers the kernel allocates for held outputs (one where none are held)."""
        return self.held_pairs if self.deferred else 1

    def held_reg(self, mi, c, j, h):
        """The held register of a thread's pair ``j, h`` of output chunk ``c`` in slice ``mi``."""
        return ((mi * self.out_chunks + c) * (self.chunk_cols // 8) + j) * 2 + h

    @property
    def k_parts(self) -> int:
        """The main loop's parts: the first ``held_chunks`` K steps and the rest where the
        epilogue is deferred, else one."""
        return 2 if self.deferred else 1

    def k_begin(self, part):
        return tirx.if_then_else(part == 0, 0, self.held_chunks) if self.deferred else 0

    def k_end(self, part):
        return tirx.if_then_else(part == 0, self.held_chunks, self.k_steps) if self.deferred else self.k_steps

    def acc_chunk(self, c):
        """The accumulator chunk output chunk ``c`` is made of (the first of its pair)."""
        return 2 * c if self.match.pair else c

    def acc_reg(self, mi, c, j, h):
        """The first accumulator register of a thread's pair ``j, h`` (column group, row half)
        of output chunk ``c`` in 64-row slice ``mi``."""
        return mi * self.slice_regs + (self.acc_chunk(c) * (self.chunk_cols // 8) + j) * 4 + h * 2

    @property
    def pair_regs(self) -> int:
        """Accumulator registers from a value to its pair's (the next chunk's same place)."""
        return self.chunk_cols // 8 * 4

    @property
    def mma_k(self) -> int:
        """K of one wgmma: 16 (16-bit inputs) or 32 (8-bit)."""
        return WGMMA_K_BYTES // self.match.in_bytes

    @property
    def mma_per_step(self) -> int:
        return self.bk // self.mma_k

    @property
    def mma(self) -> str:
        ab = ABBR[self.match.in_dtype]
        return f"wgmma.mma_async.sync.aligned.m64n{self.bn}k{self.mma_k}.f32.{ab}.{ab}"

    @property
    def mma_flags(self) -> str:
        """The wgmma's operands after the descriptors (TVMScript): accumulate, scale A and B by
        1, and for 16-bit inputs the transpose bits (8-bit wgmma has none: K-major only)."""
        flags = "T.bool(True), 1, 1"
        return flags if self.match.in_bytes == 1 else flags + ", K_A.transposed, K_B.transposed"

    @property
    def out_buffers(self) -> int:
        """Epilogue staging chunks per consumer warpgroup (see ``policies.wgmma.ring``)."""
        return staging_buffers(self.consumers, self.stages, self.stage_bytes, self.smem)

    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + staging_bytes(self.consumers, self.out_buffers)

    def coords(self, tile):
        """(batch, M tile, N tile) of a linear tile index: batch outermost, then groups of
        ``group_m`` rows of work items walked column by column (the last group may be shorter;
        odd groups right to left, see ``SNAKE_ORDER``).
        A row is an M tile, or with a cluster along M a pair of them: such a group spans
        ``2 * group_m`` M tiles."""
        grid_m = self.cluster_grid_m
        per_batch = grid_m * self.cluster_grid_n
        b, t = tile // per_batch, tile % per_batch
        if self.group_m <= 1:
            return b, t % grid_m, t // grid_m
        group = self.group_m * self.cluster_grid_n
        first_m = (t // group) * self.group_m
        height = tirx.min(grid_m - first_m, self.group_m)
        n = (t % group) // height
        if SNAKE_ORDER:
            n = tirx.if_then_else((t // group) % 2 == 1, self.cluster_grid_n - 1 - n, n)
        return b, first_m + (t % group) % height, n

    def k_step(self, it, k):
        """The K step of a worker's ``k``-th load in its ``it``-th tile (see ``SNAKE_ORDER``)."""
        return tirx.if_then_else(it % 2 == 1, self.k_steps - 1 - k, k) if SNAKE_ORDER else k

    def swizzled_word(self, row, col):
        """32-bit word of (row, col) in a 128B-swizzled staging row (``col`` even: the pair of
        16-bit outputs at col, col + 1 is one word; an fp32 output is one word each)."""
        byte = col * self.match.out_bytes
        return (((byte // 16) ^ (row % ATOM_ROWS)) * 16 + byte % 16) // 4

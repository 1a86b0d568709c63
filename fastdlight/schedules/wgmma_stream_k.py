"""Stream-K for the wgmma template: the last, partial wave of tiles shared out along K.

A persistent kernel of ``W`` workers (CTAs, or clusters) over ``T`` tiles of ``ks`` K-steps
runs ``ceil(T / W)`` rounds, the last one with ``R = T % W`` tiles: ``W - R`` workers idle
through it (4096³ in 128×256 tiles: 512 tiles for 132 SMs, 3.88 rounds of work take 4). With
stream-K every worker runs ``T // W`` whole tiles, then an equal share, ``R * ks / W`` K-steps,
of the last ``R`` tiles, in order: its range may end one tile's K loop part-way and start the
next's part-way. A tile split between workers is finished by the worker holding its first
K-steps (its *head*); the others (*contributors*) write their fp32 accumulators to a workspace
slot of their own and raise its flag, and the head adds each contributor's slot to its
accumulators before the epilogue.

Ranges are handed out in reverse worker order (worker ``w`` takes share ``W - 1 - w``), so a
tile's head is the worker with the higher CTA index: it waits only for CTAs launched before it,
which are running or done, and never for one the GPU has not started (a persistent kernel
sharing the GPU may not have all its CTAs resident). A contributor writes its slot at the
start of its share and the head reaches it at the end of its own, so it rarely waits at all.

The workspace and flags are ``__device__`` arrays of the kernel's module (zero at load). A head
sets each flag it consumed back to zero, so every launch finds them zero: launches of one
module's kernel must not overlap (one stream, or a CUDA graph: what TVM and the tuner do).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

#: a contributor's piece is at least ``ks / MAX_CONTRIBUTORS`` K-steps, so a head adds at most
#: this many workspace slots (smaller shares make the adds cost more than the split saves)
MAX_CONTRIBUTORS = 8
#: named barrier of the consumer warpgroups (the epilogue uses 1 + its warpgroup: 1..3)
BARRIER_ID = 5


@dataclass(frozen=True)
class StreamK:
    """The static numbers of one kernel's stream-K schedule."""

    tiles: int  # work items (tiles, or a cluster's tiles)
    workers: int
    k_steps: int
    cluster: int
    consumer_threads: int
    acc_regs: int

    @property
    def rounds(self) -> int:
        """Whole tiles every worker runs before its share of the last ones."""
        return self.tiles // self.workers

    @property
    def split_tiles(self) -> int:
        return self.tiles - self.rounds * self.workers

    @property
    def share(self) -> tuple[int, int]:
        """(K-steps every worker gets, workers that get one more)."""
        return divmod(self.split_tiles * self.k_steps, self.workers)

    @property
    def pieces(self) -> int:
        """Most tiles one share touches."""
        base, extra = self.share
        return -(-(base + (extra > 0)) // self.k_steps) + 1

    @property
    def contributors(self) -> int:
        """Most contributors of one tile."""
        return -(-(self.k_steps - 1) // self.share[0])

    @property
    def units(self) -> int:
        return self.rounds + self.pieces

    @property
    def helper(self) -> str:
        return f"fdl_stream_k_{self.slots}x{self.slot_floats}"

    @property
    def slots(self) -> int:
        return self.workers * self.cluster

    @property
    def slot_floats(self) -> int:
        return self.consumer_threads * self.acc_regs

    def start(self, v):
        """First K-step (over the split tiles) of share ``v``."""
        base, extra = self.share
        return v * base + tirx.min(v, extra)

    def unit(self, u, worker):
        """(tile, first K-step, end K-step, first stage count) of worker ``worker``'s unit
        ``u``: a whole tile of its rounds, or piece ``u - rounds`` of its share."""
        ks, rounds = self.k_steps, self.rounds
        v = self.workers - 1 - worker
        s, e = self.start(v), self.start(v + 1)
        t = s // ks + (u - rounds)
        kb = tirx.max(s, t * ks) - t * ks
        ke = tirx.min(e, (t + 1) * ks) - t * ks
        whole = u < rounds
        return (tirx.Select(whole, worker + u * self.workers, rounds * self.workers + t),
                tirx.Select(whole, 0, kb), tirx.Select(whole, ks, ke),
                tirx.Select(whole, u * ks, rounds * ks + t * ks + kb - s))

    def split_tile(self, u, worker):
        """Index among the split tiles of unit ``u`` (a piece)."""
        v = self.workers - 1 - worker
        return self.start(v) // self.k_steps + (u - self.rounds)

    def contributor(self, worker, c, t):
        """(exists, share) of the ``c``-th contributor of split tile ``t`` held by ``worker``."""
        v = self.workers - 1 - worker + 1 + c
        first = self.start(v)
        exists = tirx.all(v < self.workers, first < (t + 1) * self.k_steps, first < self.start(v + 1))
        return exists, v

    def slot(self, share, rank):
        """The workspace slot of share ``share``'s CTA of rank ``rank``."""
        return (self.workers - 1 - share) * self.cluster + rank

    def source(self) -> str:
        """CUDA of the workspace, the flags and the one helper the kernel calls (``op``: 0 store,
        1 load, 2 fence, 3 raise the slot's flag, 4 wait for it and lower it again). Accumulator
        ``i`` of consumer thread ``t`` is float ``i * consumer_threads + t`` of a slot: each
        store and load of a warp is one 128-byte line."""
        name, n = self.helper, self.slots * self.slot_floats
        return f"""__device__ float {name}_ws[{n}];
__device__ unsigned int {name}_flags[{self.slots}];
__device__ __forceinline__ float {name}(int op, int slot, int i, float v) {{
  float* p = {name}_ws + (long long)slot * {self.slot_floats} + i * {self.consumer_threads} + (threadIdx.x - 128);
  if (op == 0) {{ __stcg(p, v); return 0.0f; }}
  if (op == 1) {{ return __ldcg(p); }}
  if (op == 2) {{ __threadfence(); return 0.0f; }}
  unsigned int* flag = {name}_flags + slot;
  if (op == 3) {{ asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(flag) : "memory"); return 0.0f; }}
  unsigned int ready = 0;
  do {{ asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(ready) : "l"(flag) : "memory"); }} while (ready == 0);
  *flag = 0u;
  return 0.0f;
}}
"""


def stream_k(tiles, workers: int, k_steps: int, cluster: int, consumer_threads: int, acc_regs: int) -> StreamK | None:
    """The stream-K schedule, or None where it does not apply: a symbolic tile count, no
    partial wave, or shares too short (see :data:`MAX_CONTRIBUTORS`)."""
    if not isinstance(tiles, int) or tiles % workers == 0:
        return None
    sk = StreamK(tiles, workers, k_steps, cluster, consumer_threads, acc_regs)
    if sk.share[0] * MAX_CONTRIBUTORS < k_steps:
        return None
    return sk

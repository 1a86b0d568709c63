"""The schedule-building steps of the CUDA-core matmul template (see
:mod:`fastdlight.schedules.matmul` for the loop nest they build): tiling and thread binding,
register accumulation with the fused epilogue, shared-memory and register staging of the
inputs, software pipelining, and the small schedule helpers these steps share."""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, tirx

from fastdlight.config import Config
from fastdlight.schedules.base import reverse_compute_inline, root_block

#: Auto-unroll budget below threadIdx: unrolls the small copy loops, never the k-outer loop
#: (the ki and micro-tile loops are unrolled explicitly).
UNROLL_MAX_STEP = 256
#: Static shared memory a kernel may declare; larger tiles use dynamic shared memory.
STATIC_SHARED_LIMIT = 48 * 1024


class MatmulBuilder:
    """One application of the template: holds the schedule and the loops it creates. ``opts`` is
    the MatmulTemplate whose switches (strided_chunks, transpose_shared, pad_shared,
    register_stage) it follows."""

    def __init__(self, sch, main, spatial, reduce, config: Config, opts):
        self.sch, self.main, self.config, self.opts = sch, main, config, opts
        self.spatial, self.reduce = spatial, reduce
        self.num_threads = math.prod(config.threads_per_axis)
        block = sch.get(main)
        self.iter_kinds = {
            iv.var: ("R" if iv.iter_type == tirx.IterVar.CommReduce else "S") for iv in block.iter_vars
        }
        self.param_names = _param_names_by_buffer(sch)
        in_bytes = max(_dtype_bytes(r.source.dtype) for r in block.reads[:2])
        self.chunk = max(1, 16 // in_bytes)  # elements per 16-byte vector of the inputs

    def build(self) -> s_tir.Schedule:
        sch = self.sch
        tx, ko, steps, inners = self._tile()
        c_local = self._accumulate_in_registers(tx)
        self._vectorize_store(c_local)
        pipelined, staged, use_async = self._stage_inputs(ko, steps[-1])
        for loop in (*steps, *inners):
            sch.unroll(loop)
        sch.annotate(tx, "pragma_auto_unroll_max_step", UNROLL_MAX_STEP)
        sch.annotate(tx, "pragma_unroll_explicit", 1)
        sch.decompose_reduction(self.main, ko)
        if pipelined:
            self._annotate_pipeline(ko, staged, use_async)
        self._hoist_predicate(inners)
        return sch

    def _tile(self):
        """Tile spatial axes [grid, chunk, thread, inner] and reduction axes [outer, rstep], bind
        the fused grid, chunk and thread loops. Returns the thread loop, the fused reduction
        outer loop ``ko`` and the rstep and micro-tile loops."""
        sch, cfg = self.sch, self.config
        loops = sch.get_loops(self.main)
        s_loops, r_loops = loops[: len(self.spatial)], loops[len(self.spatial) :]
        grids, chunks, threads, inners = [], [], [], []
        for loop, b, t, axis in zip(s_loops, cfg.block, cfg.thread, self.spatial):
            n_chunk = self._num_chunks(t)
            run = t // n_chunk
            if axis.extent % b and axis.extent % run == 0:
                # a tile that does not divide (a conv, which pad_einsum cannot pad): the exact
                # per-thread run split first, so the bound test only involves the grid, chunk
                # and thread loops, and :meth:`_hoist_predicate` can test it once per k step
                outer, inner = sch.split(loop, [None, run])
                g, c, th = sch.split(outer, [None, n_chunk, b // t])
            else:
                g, c, th, inner = sch.split(loop, [None, n_chunk, b // t, run])
            grids.append(g), chunks.append(c), threads.append(th), inners.append(inner)
        outers, steps = [], []
        for loop, step, axis in zip(r_loops, cfg.rstep, self.reduce):
            o, i = sch.split(loop, [None, min(step, axis.extent)])
            outers.append(o), steps.append(i)
        grids = self._rasterize(grids)
        sch.reorder(*grids, *chunks, *threads, *outers, *steps, *inners)
        sch.bind(sch.fuse(*grids), "blockIdx.x")
        vt = sch.fuse(*chunks)
        if int(sch.get(vt).extent) > 1:
            sch.bind(vt, "vthread.x")
        tx = sch.fuse(*threads)
        sch.bind(tx, "threadIdx.x")
        return tx, sch.fuse(*outers), steps, inners

    def _accumulate_in_registers(self, tx):
        """Accumulate in registers; write back (and run the epilogue) per thread. Returns the
        write-back block."""
        sch = self.sch
        c_local = sch.cache_write(self.main, 0, "local")
        sch.reverse_compute_at(c_local, tx, preserve_unit_loops=True)
        _inline_consumers(sch, c_local)
        consumers = sch.get_consumers(c_local)
        for consumer in consumers:
            # an epilogue that cannot be inlined (a broadcast) still runs per thread, right after
            # the tile, reading the thread's own results: they never need global memory. Its
            # other producers (a batch norm's expand_dims of a parameter) must move with it.
            for producer in sch.get_producers(consumer):
                if not sch.get(producer).same_as(sch.get(c_local)):
                    try:
                        sch.compute_inline(producer)
                    except Exception:  # noqa: BLE001 - reverse_compute_at below says what is wrong
                        pass
            sch.reverse_compute_at(consumer, tx, preserve_unit_loops=True)
        params = {str(p.name) for p in sch.mod["main"].params}
        if consumers and str(sch.get(c_local).writes[0].source.name) not in params:
            sch.set_scope(c_local, 0, "local")
        return c_local

    def _stage_inputs(self, ko, ki) -> tuple[bool, bool, bool]:
        """Inputs: global -> shared at ``ko``, shared -> register fragments at the innermost
        ``ki``. Returns whether the k loop is pipelined, staged through registers, and uses
        cp.async."""
        sch, cfg = self.sch, self.config
        pipelined = cfg.pipeline_stages > 1 and int(sch.get(ko).extent) > 1
        use_async = pipelined and cfg.use_async_copy
        # Without cp.async, double buffering stages the next tile through registers: global
        # loads are issued before the compute and stored to shared memory after it.
        staged = pipelined and not use_async and self.opts.register_stage
        fills = [self._cache_shared(idx, ko) for idx in range(2)]
        copies = 1 if (staged or not pipelined) else cfg.pipeline_stages
        if copies * sum(self._shared_bytes(fill, ko) for fill in fills) > STATIC_SHARED_LIMIT:
            # beyond the static limit: dynamic shared memory (TVM's runtime raises the
            # kernel's opt-in limit at launch)
            for block, _, _ in fills:
                sch.set_scope(block, 0, "shared.dyn")
        frag_lanes = [self._fetch_to_registers(idx, ki, fill) for idx, fill in enumerate(fills)]
        for fill, lanes in zip(fills, frag_lanes):
            self._cooperative_copy(fill, ko, lanes, use_async, staged)
        return pipelined, staged, use_async

    def _hoist_predicate(self, inners) -> None:
        """Test the bound of a predicated split once per k step, not on every multiply-add.
        TVM keeps a split's predicate on the innermost block, so after unrolling each of the
        micro tile's statements carried its own copy (RegNet's grouped convolutions: 16
        channels a group, 7x7 outputs, 3x3 taps: 80-430 K characters of CUDA a candidate,
        0.6-2 s of nvcc each, half of it these tests; TVM's HoistIfThenElse leaves them).
        Blockizing the micro tile loops moves the part of the predicate that does not depend
        on them to the new outer block, one ``if`` around the unrolled micro tile."""
        tiles = zip((*self.spatial, *self.reduce), (*self.config.block, *self.config.rstep))
        if all(axis.extent % min(tile, axis.extent) == 0 for axis, tile in tiles):
            return  # tiles that divide (or padded by pad_einsum): no predicate
        try:
            self.sch.blockize(inners[0], preserve_unit_iters=True)
        except Exception:  # noqa: BLE001 - a predicate the micro tile loops cannot be divided from:
            pass  # it stays where it is

    def _rasterize(self, grids):
        """Launch order in panels of ``rasterization`` block rows: consecutive blocks walk down a
        panel (column by column), so the A rows and B columns they share stay in L2."""
        panel = self.config.rasterization
        if panel <= 1 or len(grids) < 2:
            return grids
        rows = int(self.sch.get(grids[-2]).extent)
        if rows <= panel or rows % panel:
            return grids  # a partial panel would need a predicate on the whole block
        outer, inner = self.sch.split(grids[-2], [None, panel])
        return [*grids[:-2], outer, grids[-1], inner]

    def _num_chunks(self, t: int) -> int:
        if self.opts.strided_chunks and t > self.chunk and t % self.chunk == 0:
            return t // self.chunk
        return 1

    def _annotate_pipeline(self, ko, staged: bool, use_async: bool) -> None:
        sch = self.sch
        # Direct children of ko: each copy's loop nest, then the compute's ki nest.
        children, scopes = [], []
        main = sch.get(self.main)
        for block in sch.get_child_blocks(ko):
            top = sch.get(_loops_below(sch, block, ko)[0])
            stmt = sch.get(block)
            scope = "compute" if stmt.same_as(main) else "copy"
            found = [i for i, c in enumerate(children) if top.same_as(c)]
            if not found:
                children.append(top)
                scopes.append(scope)
            elif scope == "compute":
                scopes[found[0]] = scope
        if staged:
            # each copy becomes (global -> registers, registers -> shared) when lowered
            scopes = [x for sc in scopes for x in ((("load", "store") if sc == "copy" else (sc,)))]
        n = len(scopes)
        compute = [i for i, sc in enumerate(scopes) if sc == "compute"]
        if staged:
            # Iteration i: global -> registers for tile i+1; compute tile i from shared memory;
            # registers -> shared for tile i+1 (TVM inserts the barriers between them).
            loads = [i for i, sc in enumerate(scopes) if sc == "load"]
            stages = [1 if sc == "compute" else 0 for sc in scopes]
            ordered = loads + compute + [i for i in range(n) if i not in loads + compute]
        else:
            stages = [self.config.pipeline_stages - 1 if sc == "compute" else 0 for sc in scopes]
            ordered = list(range(n))
        order = [ordered.index(i) for i in range(n)]
        sch.annotate(ko, "software_pipeline_stage", stages)
        sch.annotate(ko, "software_pipeline_order", order)
        if use_async:
            sch.annotate(ko, "software_pipeline_async_stages", [0])

    def _cache_shared(self, idx: int, ko):
        """Shared-memory copy of input ``idx``'s tile at the ko loop, in a layout where the
        per-thread fragments along spatial axes are contiguous; returns (block, read, transposed)."""
        sch = self.sch
        read = sch.get(self.main).reads[idx]
        dims = [_index_kind(r.min, self.iter_kinds) for r in read.region]
        ndim = len(dims)
        order = list(range(ndim))
        if self.opts.transpose_shared:
            # reduction-only dims outermost: A[m, k] is stored as [k, m]
            order = [d for d in range(ndim) if dims[d] == "R"] + [d for d in range(ndim) if dims[d] != "R"]
        transposed = order != list(range(ndim))

        block = sch.cache_read(self.main, idx, "shared")
        sch.compute_at(block, ko, preserve_unit_loops=True)
        _inline_producers(sch, block)
        if transposed:
            sch.transform_layout(block, ("write", 0), lambda *i: [i[d] for d in order])
        if self.opts.pad_shared and ndim >= 2:
            nbytes = _dtype_bytes(read.source.dtype)
            # rows of k * 32 banks + 16 bytes: the transposing stores of consecutive rows hit
            # different banks, and 16-byte vector accesses stay aligned
            sch.storage_align(block, 0, axis=ndim - 2, factor=128 // nbytes, offset=16 // nbytes)
        return block, read, transposed

    def _shared_bytes(self, fill, ko) -> int:
        """Bytes of one copy of a shared tile, rows padded as ``storage_align`` will pad them."""
        block, read, transposed = fill
        extents = [int(self.sch.get(lp).extent) for lp in _loops_below(self.sch, block, ko)]
        if transposed:
            dims = [_index_kind(r.min, self.iter_kinds) for r in read.region]
            extents = [e for e, d in zip(extents, dims) if d == "R"] + [e for e, d in zip(extents, dims) if d != "R"]
        nbytes = _dtype_bytes(read.source.dtype)
        row = extents[-1]
        if self.opts.pad_shared and len(extents) >= 2:
            factor, offset = 128 // nbytes, 16 // nbytes
            row = -(-(row - offset) // factor) * factor + offset if row > offset else offset
        return math.prod(extents[:-1]) * row * nbytes

    def _cooperative_copy(self, fill, ko, frag_lanes: int, use_async: bool, staged: bool) -> None:
        """All threads copy the tile, vectorized along the global layout's last dim."""
        sch = self.sch
        block, read, transposed = fill
        loops = _loops_below(sch, block, ko)
        extents = [int(sch.get(lp).extent) for lp in loops]
        vec = self._load_vector_width(read, extents)
        if use_async:
            if transposed:
                vec = 1  # cp.async copies equal widths: a transposing copy goes element-wise
            elif vec == frag_lanes and vec > 1:
                # TVM's StorageRewrite retypes a buffer whose accesses all share one vector
                # width (float4 elements), which InjectPTXAsyncCopy then rejects; copying in
                # half-width vectors keeps the buffer scalar-typed.
                vec //= 2
        self._split_cooperative(loops, vec)
        if staged:
            # TVM splits the copy into global -> per-thread registers -> shared memory
            # (ManifestSharedMemoryLocalStage), two statements the pipeline can separate
            sch.annotate(block, "tirx.manifest_shared_memory_local_stage", 1)

    def _split_cooperative(self, loops, vec: int) -> None:
        sch = self.sch
        fused = sch.fuse(*loops)
        if vec > 1:
            _, t, v = sch.split(fused, [None, self.num_threads, vec])
            sch.vectorize(v)
        else:
            _, t = sch.split(fused, [None, self.num_threads])
        sch.bind(t, "threadIdx.x")

    def _load_vector_width(self, read, extents) -> int:
        """Widest legal vector for the global loads of one input: the config's width, reduced
        until it divides the tile row, the global row and the per-step thread sweep."""
        buf = read.source
        names = {buf.name, *self.param_names.get(buf.name, ())}
        vec = max((self.config.vector_width(n, 1) for n in names), default=1)
        vec = min(vec, 16 // _dtype_bytes(buf.dtype))
        # The last index must be a plain iterator, so a tile row starts at a multiple of its step.
        if not isinstance(read.region[-1].min, tirx.Var):
            return 1
        rows = [int(self.sch.mod["main"].params[i].shape[-1]) for i in self._params_of(buf.name)]
        row = math.gcd(int(buf.shape[-1]), *rows)
        while vec > 1 and (extents[-1] % vec or row % vec or math.prod(extents) % (self.num_threads * vec)):
            vec //= 2
        return max(vec, 1)

    def _params_of(self, name: str) -> list[int]:
        params = self.sch.mod["main"].params
        srcs = self.param_names.get(name, ())
        return [i for i, p in enumerate(params) if str(p.name) in srcs]

    def _fetch_to_registers(self, idx: int, ki, fill) -> int:
        """Per-thread fragment of input ``idx`` read from shared memory at the innermost ki;
        returns its vector width (1 if scalar)."""
        sch = self.sch
        _, read, transposed = fill
        block = sch.cache_read(self.main, idx, "local")
        sch.compute_at(block, ki, preserve_unit_loops=True)
        inner = sch.get_loops(block)[-1]
        extent = int(sch.get(inner).extent)
        nbytes = _dtype_bytes(sch.get(block).reads[0].source.dtype)
        # A vector load needs an aligned start: only when the shared row is indexed by one
        # spatial iterator (whose per-thread chunks start at multiples of their length), not
        # by e.g. the conv window q * stride + s.
        dims = [_index_kind(r.min, self.iter_kinds) for r in read.region]
        inner_dim = [d for d in range(len(dims)) if dims[d] != "R"][-1] if transposed else len(dims) - 1
        index = read.region[inner_dim].min
        aligned = isinstance(index, tirx.Var) and self.iter_kinds.get(index) == "S"
        if aligned and extent > 1 and extent * nbytes in (4, 8, 16):
            sch.vectorize(inner)
            return extent
        return 1

    def _vectorize_store(self, block) -> None:
        """Vector stores of each thread's contiguous output chunk, when every vector lies fully
        inside or fully outside the output (the row length is a multiple of the width). No
        vector of any buffer the block touches exceeds 16 bytes: a fused epilogue computes in
        its inputs' dtype (fp32 accumulators, bias), and TVM 0.27 writes an 8-lane fp32
        constant as ``make_ulonglong4`` with eight arguments, which no compiler takes."""
        sch = self.sch
        inner = sch.get_loops(block)[-1]
        extent = int(sch.get(inner).extent)
        stmt = sch.get(block)
        out = stmt.writes[0].source
        widest = max(_dtype_bytes(r.source.dtype) for r in [*stmt.reads, *stmt.writes])
        width = extent
        while width > 1 and (width * widest > 16 or extent % width or int(out.shape[-1]) % width):
            width //= 2
        if width > 1 and width * _dtype_bytes(out.dtype) in (4, 8, 16):
            if width < extent:
                inner = sch.split(inner, [None, width])[1]
            sch.vectorize(inner)


def _inline_producers(sch, block) -> None:
    for producer in sch.get_producers(block):
        try:
            sch.compute_inline(producer)
        except Exception:  # noqa: BLE001 - a producer that cannot be inlined stays a stage
            continue
        _inline_producers(sch, block)
        return


def _inline_consumers(sch, block) -> None:
    consumers = sch.get_consumers(block)
    if len(consumers) > 1:
        # an epilogue that reads the tile's value twice (GELU, SiLU: x * f(x)): inline the
        # intermediate steps into their own consumers until a single consumer is left, which can
        # then join the tile (reverse_compute_inline refuses while another block reads the value)
        for consumer in consumers:
            try:
                sch.compute_inline(consumer)
            except Exception:  # noqa: BLE001 - it writes an output, or is no elementwise step
                continue
            _inline_consumers(sch, block)
            return
    for consumer in consumers:
        try:
            reverse_compute_inline(sch, consumer)
        except Exception:  # noqa: BLE001
            continue
        _inline_consumers(sch, block)
        return


def _loops_below(sch, block, loop) -> list:
    """The loops of ``block`` nested inside ``loop``."""
    loops = sch.get_loops(block)
    target = sch.get(loop)
    for i, lp in enumerate(loops):
        if sch.get(lp).same_as(target):
            return loops[i + 1 :]
    raise ValueError("block is not under the given loop")


def _dtype_bytes(dtype) -> int:
    return max(1, tvm.runtime.DataType(str(dtype)).bits // 8)


def _index_kind(expr, iter_kinds) -> str:
    """'R' if the index uses reduction iterators only, 'S' if it uses any spatial one, '' if none."""
    kinds = {iter_kinds[v] for v in tirx.analysis.undefined_vars(expr) if v in iter_kinds}
    if "S" in kinds:
        return "S"
    return "R" if kinds else ""


def _param_names_by_buffer(sch) -> dict:
    """Intermediate buffer name -> names of the function parameters it is computed from
    (conv: pad -> {data}), so a config's ``vectorize`` can name either."""
    func = sch.mod["main"]
    params = {str(p.name) for p in func.params}
    result = {}
    root = root_block(sch)
    for rv in sch.get_child_blocks(root) if root is not None else []:
        block = sch.get(rv)
        srcs = {r.source.name for r in block.reads} & params
        if srcs and len(block.writes) == 1:
            result[block.writes[0].source.name] = srcs
    return result


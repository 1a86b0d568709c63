"""What reading B bytes costs on this GPU, timed as the decode kernels are: the floor under any
memory-bound kernel of that many bytes, beside the kernels whose targets depend on it.

    python benchmarks/bench_read_floor.py [--only w4a16_layer decode_b1_h32] [--rounds 5] [--list]
                                          [--loads ldg l2_256 ...]

For each size: a read kernel of our own (each thread XORs 16-byte ``ld.global.nc`` loads,
``unroll`` of them in flight, nothing stored; a grid that covers the bytes once, or a
persistent one that strides) in several shapes, each built by fastdlight's pipeline (so launched
as a programmatic dependent, its first statement the dependency wait, as every kernel we build)
and timed in the same CUDA graphs of back-to-back launches over copies rotated out of L2; the
same bytes read in the pattern of the kernels that read them (``CHUNKED``: each CTA a contiguous
chunk, of one region or of K and V); and
torch's (cuBLAS) fp16 GEMV of a layer of the same bytes in a torch CUDA graph, and ours (tuned,
top 8). ``--loads``: the load instructions to time each shape with (``ldg`` by default; the
others add cache hints, :data:`LOADS`); a shape's label then names its load. A row a size: the
best read kernel's ms and TB/s, each shape's, the two GEMVs'. Writes ``$OUT/read_floor.json``
and ``.md``. About 30 s on an H200.
"""

from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_setup import KernelTimer, cases_to_run, rounds_parser, run_cases, table, timed_rounds

NAME = "read_floor"
#: bytes read, and the fp16 layer (N, K) of the same bytes that cuBLAS's GEMV reads
SIZES = {
    # a LLaMA-7B MLP projection (11008x4096 or 4096x11008) in 4-bit weights and fp16 scales of
    # groups of 128
    "w4a16_layer": (11008 * 4096 // 2 + 11008 * 32 * 2, (2816, 4096)),
    # K and V of B1 H32 L4096 d128, fp16
    "decode_b1_h32": (2 * 32 * 4096 * 128 * 2, (8192, 4096)),
    # the fp16 GEMV 1x11008x4096
    "fp16_11008x4096": (11008 * 4096 * 2, (11008, 4096)),
}
#: (threads a CTA, 16-byte loads a thread has in flight, persistent CTAs an SM or 0: one pass)
SHAPES = [(256, 4, 0), (256, 8, 0), (512, 4, 0), (512, 8, 0), (1024, 4, 0), (256, 8, 4), (512, 8, 2),
          (1024, 8, 1), (256, 16, 0), (1024, 16, 1)]
#: the same bytes read as the kernels of a size read them: each CTA its own contiguous chunk of
#: each of ``streams`` equal regions (threads, loads of each region in flight a thread, CTAs,
#: streams, and optionally a group: that many CTAs sharing a chunk, block by block): a 4-bit
#: GEMV's row blocks (344 CTAs of 32 rows of 1x11008x4096, 256 of 16 rows of 1x4096x11008),
#: split-KV decode's chunks of K and V (17, 16 or 8 chunks of 32 heads; or a head's keys shared by
#: its 17 or 16 CTAs a block each in turn), the fp16 GEMV's 688 blocks of 16 rows
CHUNKED = {
    "w4a16_layer": [(256, 4, 344, 1), (256, 8, 344, 1), (512, 4, 256, 1), (512, 8, 256, 1)],
    "decode_b1_h32": [(128, 2, 544, 2), (128, 4, 544, 2), (256, 2, 544, 2), (128, 4, 512, 2), (128, 8, 256, 2),
                      (128, 2, 544, 2, 17), (128, 4, 544, 2, 17), (256, 2, 544, 2, 17), (128, 4, 512, 2, 16)],
    "fp16_11008x4096": [(256, 4, 688, 1), (256, 8, 688, 1)],
}

#: the 16-byte load a read kernel issues: ``__ldg`` (``ld.global.nc``), or with cache hints:
#: ``L2::256B``/``L2::128B`` ask L2 to fetch that much around the line from HBM (fewer, larger
#: DRAM requests for a stream), ``L1::no_allocate`` keeps the stream out of L1, ``ld.global.cg``
#: caches in L2 only (an L2 eviction priority such as ``L2::evict_first`` takes 256-bit loads)
LOADS = {
    "ldg": "",
    "l2_128": "ld.global.nc.L2::128B.v4.u32",
    "l2_256": "ld.global.nc.L2::256B.v4.u32",
    "na": "ld.global.nc.L1::no_allocate.v4.u32",
    "na_l2_256": "ld.global.nc.L1::no_allocate.L2::256B.v4.u32",
    "cg": "ld.global.cg.v4.u32",
}


def load_source(load: str) -> str:
    """The device function ``fdl_load16(const uint4*)`` that issues ``load``'s instruction."""
    if not LOADS[load]:
        return "__forceinline__ __device__ uint4 fdl_load16(const uint4* p) { return __ldg(p); }\n"
    return ("__forceinline__ __device__ uint4 fdl_load16(const uint4* p) {\n  uint4 v;\n"
            f'  asm("{LOADS[load]} {{%0, %1, %2, %3}}, [%4];"\n'
            '               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));\n  return v;\n}\n')


_READ = r"""
__forceinline__ __device__ void fdl_read_floor(const unsigned* words, unsigned* out, int bid, int tid) {
  // XOR of every 16-byte word, so that no load is dead; stored only if it hits a value random
  // data gives once in 2^32 launches
  const uint4* p = reinterpret_cast<const uint4*>(words);
  const long long n = N16, step = (long long)CTAS * THREADS * UNROLL;
  unsigned acc = 0u;
  for (long long base = (long long)bid * THREADS * UNROLL + tid; base < n; base += step) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long i = base + (long long)u * THREADS;
      v[u] = i < n ? fdl_load16(p + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) out[0] = acc;
}
"""


_READ_CHUNKS = r"""
__forceinline__ __device__ void fdl_read_floor(const unsigned* words, unsigned* out, int bid, int tid) {
  // CTA bid streams its own chunk of each of STREAMS equal regions, as a split-KV decode CTA
  // streams its chunk of K and of V: contiguous (GROUP 1), or, GROUP CTAs sharing a chunk,
  // every GROUP-th block of THREADS * UNROLL words of it from block bid % GROUP on
  const uint4* p = reinterpret_cast<const uint4*>(words);
  const long long region = N16 / STREAMS, groups = CTAS / GROUP, per = (region + groups - 1) / groups;
  const long long begin = (long long)(bid / GROUP) * per, end = begin + per < region ? begin + per : region;
  const long long block = (long long)THREADS * UNROLL;
  unsigned acc = 0u;
  for (long long base = begin + (bid % GROUP) * block + tid; base < end; base += GROUP * block) {
    uint4 v[STREAMS * UNROLL];
#pragma unroll
    for (int u = 0; u < STREAMS * UNROLL; ++u) {
      const long long i = base + (long long)(u % UNROLL) * THREADS;
      v[u] = i < end ? fdl_load16(p + (u / UNROLL) * region + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < STREAMS * UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) out[0] = acc;
}
"""


def read_kernel(nbytes: int, threads: int, unroll: int, ctas: int, streams: int = 0, group: int = 1,
                load: str = "ldg"):
    """The TIRx read kernel over ``nbytes`` (a multiple of 16) in ``ctas`` CTAs: striding over
    them (``streams`` 0), or each CTA its chunk of each of ``streams`` regions (``group`` > 1:
    a chunk of ``group`` CTAs, read in turns); its loads ``load``'s (:data:`LOADS`)."""
    from tvm.backend.cuda.op import cuda_func_call
    from tvm.script import tirx as T

    n16 = nbytes // 16
    template = _READ_CHUNKS if streams else _READ
    source = load_source(load) + (template.replace("N16", f"{n16}LL").replace("CTAS", str(ctas))
              .replace("THREADS", str(threads)).replace("UNROLL", str(unroll)).replace("STREAMS", str(streams))
              .replace("GROUP", str(group)))

    @T.prim_func
    def kernel(P: T.Buffer((n16 * 4,), "uint32"), O: T.Buffer((1,), "uint32")):
        T.device_entry()
        bid = T.cta_id([ctas])
        tid = T.thread_id([threads])
        T.evaluate(cuda_func_call("fdl_read_floor", T.address_of(P[0]), T.address_of(O[0]), bid, tid,
                                  source_code=source))

    return kernel.with_attrs({"tirx.kernel": True, "tirx.is_scheduled": True, "tirx.noalias": True,
                              "global_symbol": "read_floor"})


def grid_of(nbytes: int, threads: int, unroll: int, per_sm: int, sm_count: int) -> int:
    one_pass = -(-(nbytes // 16) // (threads * unroll))
    return min(one_pass, per_sm * sm_count) if per_sm else one_pass


def label_of(threads: int, unroll: int, per_sm: int) -> str:
    return f"{threads} threads, {unroll} loads" + (f", persistent {per_sm} an SM" if per_sm else "")


def chunked_label(threads: int, unroll: int, ctas: int, streams: int, group: int = 1) -> str:
    streams_part = f" of {streams} streams" if streams > 1 else ""
    group_part = f", a chunk of {group} CTAs in turns" if group > 1 else ""
    return f"chunks: {ctas} CTAs of {threads} threads, {unroll} loads{streams_part}{group_part}"


def rotated_copies(nbytes: int, l2_bytes: int) -> int:
    """Copies of the input a graph cycles through, so that each launch reads from HBM."""
    return max(2, math.ceil(3 * l2_bytes / nbytes))


def read_timers(name: str, nbytes: int, arch, dev, log, loads=("ldg",)) -> dict:
    """``label -> timer`` of each shape's read kernel over rotated copies of ``nbytes`` (and of
    the chunked shapes of size ``name``), with each of ``loads``."""
    import numpy as np
    import tvm

    from fastdlight.compiler.compile import build
    from fastdlight.measure.graph_timing import time_graph

    rng = np.random.default_rng(0)
    words = nbytes // 4
    sets = [[tvm.runtime.tensor(rng.integers(0, 2**32, words, dtype=np.uint32), dev),
             tvm.runtime.tensor(np.zeros(1, np.uint32), dev)] for _ in range(rotated_copies(nbytes, arch.l2_bytes))]
    timers = {}
    kernels = [(label_of(t, u, s), (t, u, grid_of(nbytes, t, u, s, arch.sm_count), 0)) for t, u, s in SHAPES]
    kernels += [(chunked_label(*shape), shape) for shape in CHUNKED.get(name, [])]
    kernels = [(label + ("" if load == "ldg" else f", {load}"), shape, load)
               for load in loads for label, shape in kernels]
    for label, shape, load in kernels:
        try:
            kernel = read_kernel(nbytes, *shape, load=load)
            mod = build(tvm.IRModule({"read_floor": kernel}), arch.target)
            launch = mod["read_floor"]
            per_launch = nbytes / 3.0e9  # ms at 3 TB/s: sizes the graph
            timers[label] = (lambda f: lambda ms: time_graph(f, sets, dev, ms, per_launch).median_ms)(launch)
        except Exception as e:  # noqa: BLE001 - a shape that does not build is left out, said why
            log(f"  {label}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200])
    return timers


def cublas_timer(shape: tuple[int, int], nbytes: int, l2_bytes: int):
    """torch's fp16 GEMV (cuBLAS) of an (N, K) layer, over rotated weight copies, in a graph."""
    import torch

    from fastdlight.measure.graph_timing import time_torch_graph

    n, k = shape
    copies = rotated_copies(n * k * 2, l2_bytes)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=torch.float16)
    fns = [(lambda w: lambda: torch.nn.functional.linear(x, w))(w) for w in ws]
    return lambda ms: time_torch_graph(fns, ms, n * k * 2 / 3.0e9).median_ms


def ours_timer(shape: tuple[int, int], arch, dev):
    """Our fp16 GEMV of an (N, K) layer, tuned (top 8, verified), over rotated input copies."""
    import fastdlight
    from fastdlight import ops
    from fastdlight.measure.workload import Workload

    op = ops.gemv(*shape, m=1)
    _, best = fastdlight.tune(op.func, arch, topk=8, ref=op.reference, progress=False)
    return KernelTimer(best, Workload(best._func, dev, seed=0).timing_arg_sets(arch.l2_bytes), dev)


def run_size(name: str, arch, rounds: int, round_ms: float, log, loads=("ldg",)) -> dict:
    import tvm

    nbytes, layer = SIZES[name]
    nbytes -= nbytes % 16
    timers = read_timers(name, nbytes, arch, tvm.cuda(0), log, loads)
    timers["cuBLAS fp16 GEMV"] = cublas_timer(layer, nbytes, arch.l2_bytes)
    timers["our fp16 GEMV"] = ours_timer(layer, arch, tvm.cuda(0))
    medians, errors = timed_rounds(timers, rounds, round_ms)
    layer_bytes = layer[0] * layer[1] * 2
    gemvs = ("cuBLAS fp16 GEMV", "our fp16 GEMV")
    shapes = {k: round(v, 5) for k, v in medians.items() if k not in gemvs}
    plain = {k: v for k, v in shapes.items() if not k.startswith("chunks")}
    chunked = {k: v for k, v in shapes.items() if k.startswith("chunks")}
    best = min(plain, key=plain.get) if plain else None
    best_chunked = min(chunked, key=chunked.get) if chunked else None
    row = {"size": name, "mb": round(nbytes / 1e6, 2), "best": best,
           "ms": shapes.get(best), "tbs": round(nbytes / shapes[best] / 1e9, 2) if best else None,
           "chunked_best": best_chunked, "chunked_ms": shapes.get(best_chunked),
           "chunked_tbs": round(nbytes / shapes[best_chunked] / 1e9, 2) if best_chunked else None,
           "cublas_layer": f"1x{layer[0]}x{layer[1]}", "cublas_ms": round(medians["cuBLAS fp16 GEMV"], 5)
           if "cuBLAS fp16 GEMV" in medians else None,
           "shapes": shapes, "errors": errors}
    row["ours_ms"] = round(medians["our fp16 GEMV"], 5) if "our fp16 GEMV" in medians else None
    for key in ("cublas", "ours"):
        if row[f"{key}_ms"]:
            row[f"{key}_tbs"] = round(layer_bytes / row[f"{key}_ms"] / 1e9, 2)
    log(f"  {name}: {row['mb']} MB best {best} {row['ms']} ms ({row['tbs']} TB/s); in chunks {best_chunked} "
        f"{row['chunked_ms']} ms ({row['chunked_tbs']} TB/s); GEMV "
        f"{row['cublas_layer']}: cuBLAS {row['cublas_ms']} ms, ours {row['ours_ms']} ms")
    return row


def markdown(rows: list[dict], device: str) -> str:
    title = (f"read_floor, {device}, {time.strftime('%Y-%m-%d')}: B bytes read by the best of our read kernels "
             "and by cuBLAS's fp16 GEMV of a layer of those bytes, CUDA graphs, inputs rotated out of L2")
    keys = ("size", "mb", "ms", "tbs", "best", "chunked_ms", "chunked_tbs", "chunked_best", "cublas_layer",
            "cublas_ms", "cublas_tbs", "ours_ms", "ours_tbs")
    cells = [["-" if r.get(k) is None else r[k] for k in keys] for r in rows]
    return table(title, ["size", "MB", "read ms", "TB/s", "read kernel", "in chunks ms", "TB/s", "chunked kernel",
                         "fp16 GEMV layer", "cuBLAS ms", "TB/s", "ours ms", "TB/s"], cells)


def main(argv=None) -> int:
    ap = rounds_parser(__doc__.splitlines()[0], round_ms=30.0)
    ap.add_argument("--loads", nargs="+", default=["ldg"], choices=list(LOADS),
                    help="the load instructions to time each shape with (default: ldg)")
    args = ap.parse_args(argv)
    listing = "\n".join(f"{name}: {b / 1e6:.2f} MB (cuBLAS layer 1x{n}x{k})" for name, (b, (n, k)) in SIZES.items())
    names = cases_to_run(NAME, args, SIZES, listing)
    if isinstance(names, int):
        return names
    import tvm

    from fastdlight.arch import CUDA

    arch = CUDA.from_device(tvm.cuda(0))
    return run_cases(NAME, names, arch, lambda name: [run_size(name, arch, args.rounds, args.round_ms,
                                                                lambda msg: print(msg, flush=True),
                                                                args.loads)], markdown)


if __name__ == "__main__":
    sys.exit(main())

"""Where a wgmma kernel's cycles go, tile by tile.

The kernel's generated CUDA source is instrumented before it is compiled: the first consumer
thread of every CTA (thread 128) reads ``clock64`` when each of its tiles starts, when the tile's
first stage is full, and when its main loop ends, and ``%globaltimer`` at entry and exit. Two
consecutive launches are traced, after ``WARM_LAUNCHES`` untraced ones of the same module and
after the plain kernel has heated the GPU. The records go to a device buffer; the last CTA of a
traced launch to finish prints them all, so no printing runs while another CTA works (a
``printf`` per CTA at exit slowed the CTAs still running by up to 10x).

Per launch it reports the span, the CTAs' cycles, and per wave (a CTA's i-th tile) the main
loop's cycles against the tensor cores' ideal, the wait for the tile's first stage, the epilogue
(one tile's main-loop end to the next tile's start) and the last tile's epilogue and drain.

    python benchmarks/trace_wgmma.py --shape 4096 4096 4096 --tile 128x256 [--layout NN]
        [--dtype float16|bfloat16|float8_e4m3fn] [--stages S] [--group G]

The tile is spelled as for ``bench_energy``: ``BMxBN[/WM][+C[m|n]]`` (rows per consumer
warpgroup, a cluster of C CTAs along M or N); its stages and rasterization group are the
policy's unless ``--stages`` / ``--group`` are given.

Writes ``$OUT/trace_wgmma.json`` and ``.md``. Needs a GPU with wgmma (sm_90a).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_energy import BadTile, tile_config, tile_spec  # noqa: E402
from fastdlight.config import Config  # noqa: E402

#: untraced launches of the instrumented module before the two traced ones
WARM_LAUNCHES = 16
#: the thread that records: the first consumer warpgroup's first thread
WATCH_TID = 128
#: CTAs the device buffer holds records for (a persistent grid is one CTA per SM)
MAX_CTAS = 256
#: dense fp16/bf16 tensor-core flops per SM cycle on Hopper: 989.4 TFLOPS = 132 SMs x 4096 x 1.83 GHz
FLOPS_PER_SM_CYCLE = 4096
#: the consumer's tile loop and its main loop in TVM's CUDA source of the template
_TILE_LOOP = re.compile(r"for \(int (k_i(?:_\d+)?) = 0; \1 < (\d+); \+\+\1\) \{")
_K_LOOP = re.compile(r"for \(int (k_k(?:_\d+)?) = 0; \1 < \d+; \+\+\1\) \{")
_MAIN_LOOP_END = "tvm_builtin_ptx_wgmma_wait_group_wait_group_sync_aligned_0();"
_DRAIN = "tvm_builtin_ptx_cp_async_bulk_wait_group_async_bulk_wait_group_0();"


@dataclass(frozen=True)
class TileRecord:
    start: int  # clock64 at the tile's start
    first: int  # ... once its first stage is full (0: the CTA had no such tile)
    end: int  # ... at its main loop's end
    m: int  # the tile's M and N tile indices
    n: int


@dataclass(frozen=True)
class CtaRecord:
    launch: int
    cta: int
    sm: int
    entry_ns: int  # %globaltimer at entry and exit
    exit_ns: int
    entry: int  # clock64 at entry and exit
    exit: int
    tiles: tuple[TileRecord, ...]


class InstrumentError(ValueError):
    """The source does not have the template's shape the instrumentation expects."""


def _probes(ti: str, kv: str, n_tiles: int, first_launch: int) -> dict[str, list[str]]:
    """The lines inserted at each site: ``ti`` and ``kv`` are the source's tile and main-loop
    variables; a CTA's record is launch, CTA, SM, entry/exit ns, entry/exit clock, then per
    tile its start, first-stage and main-loop-end clocks and its M and N tile."""
    width, slots = 7 + 5 * n_tiles, 5 * n_tiles
    rec = f"fdl_rec[((fdl_l - {first_launch}) * {MAX_CTAS} + blockIdx.x) * {width} + "
    return {
        "decl": [f"__device__ unsigned long long fdl_rec[2 * {MAX_CTAS} * {width}];",
                 "__device__ unsigned int fdl_launch = 0;", "__device__ unsigned int fdl_done[2] = {0, 0};"],
        "entry": [
            "  unsigned long long* fdl_r = 0; bool fdl_me = false; int fdl_l = 0;",
            "  unsigned long long fdl_g0 = 0, fdl_c0 = 0;",
            f"  if (threadIdx.x == {WATCH_TID}) {{ fdl_l = atomicAdd(&fdl_launch, 1u) / gridDim.x; "
            f"fdl_me = (fdl_l == {first_launch} || fdl_l == {first_launch + 1}) && blockIdx.x < {MAX_CTAS}; }}",
            # the record is written in place (one thread's global stores): an array of the tiles'
            # clocks in the thread's registers took the room of the kernel's own
            f"  if (fdl_me) {{ fdl_r = &{rec}0]; for (int q = 0; q < {slots}; ++q) fdl_r[7 + q] = 0; "
            'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(fdl_g0)); fdl_c0 = clock64(); }'],
        "tile": [f"      if (fdl_me) fdl_r[7 + {ti} * 5] = clock64();"],
        "first": [f"          if (fdl_me && {kv} == 0) {{ fdl_r[7 + {ti} * 5 + 1] = clock64(); "
                  f"fdl_r[7 + {ti} * 5 + 3] = k_coord_ptr[1]; fdl_r[7 + {ti} * 5 + 4] = k_coord_ptr[2]; }}"],
        "end": [f"        if (fdl_me) fdl_r[7 + {ti} * 5 + 2] = clock64();"],
        "exit": [
            "    if (fdl_me) {",
            '      unsigned long long g1, c1 = clock64(); unsigned sm; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));',
            '      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));',
            "      fdl_r[0] = fdl_l; fdl_r[1] = blockIdx.x; fdl_r[2] = sm;",
            "      fdl_r[3] = fdl_g0; fdl_r[4] = g1; fdl_r[5] = fdl_c0; fdl_r[6] = c1;",
            "      __threadfence();",
            f"      if (atomicAdd(&fdl_done[fdl_l - {first_launch}], 1u) == gridDim.x - 1) {{  // the last CTA prints",
            "        __threadfence();",
            f"        for (int b = 0; b < gridDim.x && b < {MAX_CTAS}; ++b) {{",
            f"          const unsigned long long* r = &fdl_rec[((fdl_l - {first_launch}) * {MAX_CTAS} + b) * {width}];",
            '          printf("FDL %llu %llu %llu %llu %llu %llu %llu\\n", r[0], r[1], r[2], r[3], r[4], r[5], r[6]);',
            f"          for (int q = 0; q < {n_tiles}; ++q) printf(\"FDT %llu %llu %d %llu %llu %llu %llu %llu\\n\", r[0], r[1], q, "
            "r[7 + q * 5], r[8 + q * 5], r[9 + q * 5], r[10 + q * 5], r[11 + q * 5]);",
            "        }",
            "      }",
            "    }"],
    }


def instrument(code: str, first_launch: int = WARM_LAUNCHES) -> str:
    """``code`` (one template kernel's CUDA source) recording and, from the last CTA of launches
    ``first_launch`` and ``first_launch + 1``, printing the records (see the module docstring)."""
    loops = list(_TILE_LOOP.finditer(code))
    k_loops = list(_K_LOOP.finditer(code))
    if len(loops) != 1 or len(k_loops) != 2:
        raise InstrumentError(f"expected one consumer tile loop and two K loops, found {len(loops)} and {len(k_loops)} "
                              "(a shape with one tile a CTA has no tile loop: trace one with two or more)")
    ti, kv = loops[0].group(1), k_loops[1].group(1)
    probes = _probes(ti, kv, int(loops[0].group(2)), first_launch)
    # (site, whether this stripped line is it, whether the probes go before the line)
    sites = [("decl", lambda s, line: line.startswith('extern "C" __global__') and s.endswith(";"), True),
             ("entry", lambda s, line: s.startswith("int k_tid = "), False),
             ("tile", lambda s, line: s == loops[0].group(0), False),
             # the main loop's stage wait (its index a mask or, with a ring not a power of two, a modulo)
             ("first", lambda s, line: s.startswith("tvm_builtin_cuda_mbarrier_wait(") and re.search(rf"\b{kv}\b", s),
              False),
             ("end", lambda s, line: s == _MAIN_LOOP_END, False),
             ("drain", lambda s, line: s == _DRAIN, False),  # the exit probes go after the block it closes
             ("exit", lambda s, line: s == "}", False)]
    out, at = [], 0
    for line in code.split("\n"):
        name, found, before = sites[at] if at < len(sites) else (None, None, False)
        hit = found is not None and found(line.strip(), line)
        if hit and before:
            out += probes[name]
        out.append(line)
        if hit:
            out += [] if before else probes.get(name, [])
            at += 1
    if at < len(sites):
        raise InstrumentError(f"the source ended before the {sites[at][0]} site")
    return "\n".join(out)


def parse(text: str) -> list[CtaRecord]:
    """The CTA records printed by an instrumented kernel (other lines ignored)."""
    heads, tiles = {}, {}
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["FDL"] and len(parts) == 8:
            v = list(map(int, parts[1:]))
            heads[(v[0], v[1])] = v
        elif parts[:1] == ["FDT"] and len(parts) == 9:
            v = list(map(int, parts[1:]))
            tiles.setdefault((v[0], v[1]), {})[v[2]] = TileRecord(v[3], v[4], v[5], v[6], v[7])
    return [CtaRecord(*heads[k], tiles=tuple(t for _, t in sorted(tiles.get(k, {}).items())))
            for k in sorted(heads)]


def ideal_tile_cycles(m_n_k: tuple[int, int, int], bm: int, bn: int, bk: int = 64, in_bytes: int = 2) -> float:
    """A tile's main loop on the tensor cores alone: 2 bm bn K flops at the SM's peak rate
    (twice the 16-bit rate for 8-bit inputs)."""
    steps = -(-m_n_k[2] // bk)
    return 2 * bm * bn * bk * steps / (FLOPS_PER_SM_CYCLE * 2 // in_bytes)


def _stats(values) -> dict:
    v = np.asarray(values, dtype=float)
    return {"n": int(v.size), "median": float(np.median(v)), "p90": float(np.percentile(v, 90)), "max": float(v.max())} if v.size else {}


def summarize(records: list[CtaRecord], ideal: float) -> list[dict]:
    """Per traced launch: span (us), CTA cycles, and per wave the main loop against ``ideal``,
    the first-stage wait, the epilogue after it, and the last tile's epilogue and drain."""
    out = []
    for launch in sorted({r.launch for r in records}):
        ctas = [r for r in records if r.launch == launch]
        waves, last = {}, []
        for r in ctas:
            done = [i for i, t in enumerate(r.tiles) if t.first]
            for i in done:
                t = r.tiles[i]
                w = waves.setdefault(i, {"main_loop": [], "first_stage_wait": [], "epilogue": []})
                w["main_loop"].append((t.end - t.first) / ideal)
                w["first_stage_wait"].append(t.first - t.start)
                if i + 1 in done:
                    w["epilogue"].append(r.tiles[i + 1].start - t.end)
                else:
                    last.append(r.exit - t.end)
        out.append({
            "launch": launch, "ctas": len(ctas),
            "span_us": (max(r.exit_ns for r in ctas) - min(r.entry_ns for r in ctas)) / 1e3,
            "cta_cycles": _stats([r.exit - r.entry for r in ctas]),
            "waves": {i: {k: _stats(v) for k, v in w.items()} for i, w in sorted(waves.items())},
            "last_epilogue": _stats(last),
        })
    return out


def markdown(title: str, summaries: list[dict], ideal: float) -> str:
    lines = [f"## {title}", "", f"Ideal main loop (tensor cores alone): {ideal:.0f} cycles a tile.", ""]
    for s in summaries:
        c = s["cta_cycles"]
        lines += [f"Launch {s['launch']}: {s['ctas']} CTAs, span {s['span_us']:.1f} us; CTA cycles median "
                  f"{c['median']:.0f}, max {c['max']:.0f}; last tile's epilogue and drain median {s['last_epilogue'].get('median', 0):.0f}.",
                  "", "| wave | tiles | main loop / ideal (median, max) | first-stage wait (median) | epilogue after it (median, cycles) |",
                  "|---|---|---|---|---|"]
        for i, w in s["waves"].items():
            ml, fw, ep = w["main_loop"], w["first_stage_wait"], w["epilogue"]
            lines.append(f"| {i} | {ml['n']} | {ml['median']:.3f}, {ml['max']:.3f} | {fw['median']:.0f} | "
                         f"{ep['median']:.0f} |" if ep else f"| {i} | {ml['n']} | {ml['median']:.3f}, {ml['max']:.3f} | {fw['median']:.0f} | - |")
        lines.append("")
    return "\n".join(lines)


@contextlib.contextmanager
def captured_stdout():
    """The process's file descriptor 1 (where the device's printf goes) into a temporary file;
    yields a callable returning what was written."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 1)
        try:
            yield lambda: (f.seek(0), f.read().decode(errors="replace"))[1]
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def trace(func, config: Config, arch) -> list[CtaRecord]:
    """The records of two launches of ``func`` under ``config`` (GPU)."""
    import tvm
    import tvm_ffi

    from fastdlight.schedules import apply_config
    from fastdlight.compiler.compile import build, compile_cubin
    from fastdlight.measure.timing import function_name, heat
    from fastdlight.measure.workload import Workload

    def compile_instrumented(code, *_):
        return bytearray(compile_cubin(instrument(code), tvm.target.Target.current()).binary)

    try:
        with arch.target:
            kernel = apply_config(func, config)
    except Exception as e:  # noqa: BLE001 - one line for the user, whatever the template's reason
        reason = str(e.args[0]) if e.args else repr(e)  # args[0]: no quotes around a KeyError's text
        raise SystemExit(f"trace_wgmma: {reason.splitlines()[0]}") from None
    if kernel is None:
        raise SystemExit(f"trace_wgmma: the wgmma template does not take {config}")
    kernel = kernel.with_attr("global_symbol", "fdl_traced")
    plain = build(tvm.IRModule({"main": kernel}), arch.target)
    previous = tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True)
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_instrumented, override=True)
    try:
        traced = build(tvm.IRModule({"main": kernel}), arch.target)
    finally:
        if previous is not None:
            tvm_ffi.register_global_func("tvm_callback_cuda_compile", previous, override=True)
    wl = Workload(func, tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    launch, name = traced[function_name(traced, kernel)], function_name(plain, kernel)
    heat(plain[name], arg_sets, wl.dev)
    for i in range(WARM_LAUNCHES):
        launch(*arg_sets[i % len(arg_sets)])
    wl.dev.sync()
    with captured_stdout() as read:
        for i in range(2):
            launch(*arg_sets[i % len(arg_sets)])
        wl.dev.sync()
        text = read()
    records = parse(text)
    if not records:
        raise SystemExit("the traced launches printed no records")
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", type=int, nargs=3, default=(4096, 4096, 4096), metavar=("M", "N", "K"))
    ap.add_argument("--layout", default="NN", choices=["NN", "NT", "TN", "TT"])
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float8_e4m3fn"],
                    help="inputs; float8_e4m3fn: ops.matmul_scaled (TN, per-tensor scales, fp16 out)")
    ap.add_argument("--tile", type=tile_spec, default="128x256", help="BMxBN[/WM][+C[m|n]] (default 128x256)")
    ap.add_argument("--stages", type=int, default=None, help="stage ring depth (default: the policy's)")
    ap.add_argument("--group", type=int, default=None, help="rasterization group (default: the policy's)")
    args = ap.parse_args(argv)
    from bench_gemm_hopper import matmul_func
    from bench_setup import write_results
    from fastdlight import ops
    from fastdlight.arch import auto_arch
    from fastdlight.arch.cuda import has_gpu

    if not has_gpu():
        raise SystemExit("trace_wgmma: no CUDA GPU here; it times a kernel on one")
    arch = auto_arch()
    if not arch.has_wgmma:
        raise SystemExit(f"trace_wgmma: {arch} has no wgmma; it traces the sm_90a template")
    m, n, k = args.shape
    fp8 = args.dtype == "float8_e4m3fn"
    func = ops.matmul_scaled(m, n, k, args.dtype).func if fp8 else matmul_func(m, n, k, args.dtype, args.layout)
    try:
        config = tile_config(args.tile, func, arch)
    except BadTile as e:
        raise SystemExit(f"trace_wgmma: {e}") from None
    config = dataclasses.replace(config, pipeline_stages=args.stages or config.pipeline_stages,
                                 rasterization=args.group or config.rasterization)
    records = trace(func, config, arch)
    ideal = ideal_tile_cycles((m, n, k), *config.block, bk=config.rstep[0], in_bytes=1 if fp8 else 2)
    summaries = summarize(records, ideal)
    title = f"{args.dtype} {m}x{n}x{k} {'NT, scaled' if fp8 else args.layout}, {config} on {arch.name}"
    md = markdown(title, summaries, ideal)
    write_results("trace_wgmma", {"title": title, "ideal_cycles": ideal, "launches": summaries,
                                  "records": [dataclasses.asdict(r) for r in records]}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

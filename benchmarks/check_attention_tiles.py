"""Fused attention's tiles on one GPU, at fixed configs (no tuning): each config built, verified
against the function's float64 twin and timed beside torch's ``scaled_dot_product_attention``.

    python benchmarks/check_attention_tiles.py [--only prefill_8k ...] [--tiles 128x176x2p,128x128x3p]
        [--rounds 5] [--round-ms 60] [--clocks] [--list]

The cases are ``bench_attention``'s. A tile is ``BMxBNxSTAGES`` with ``p`` for the persistent
grid, or ``m`` (``m32``: warps of 32 rows) for the mma.sync kernel (``attention_mma``, what GPUs
without wgmma get); without ``--tiles`` a case takes every config the attention policy emits. Every
verified config and torch are timed in CUDA graphs, inputs rotated out of L2, in alternating
rounds (medians): a row a config with ms, TFLOPS, the ratio to torch, registers and the verdict;
a config that fails to build or verify is a row with its error. ``--clocks`` samples the SM
clock and board power (``nvidia-smi``) while each side runs: both sides of a ratio run at the
power limit, and the clock each holds there is part of its speed. Writes
``$OUT/check_attention_tiles.json`` and ``.md``.
"""

from __future__ import annotations

import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_attention import CASES, torch_calls  # noqa: E402
from bench_setup import (  # noqa: E402
    KernelTimer,
    Sampler,
    cases_to_run,
    gpu_arch,
    rounds_parser,
    run_cases,
    table,
    timed_rounds,
)

NAME = "check_attention_tiles"
TILE = re.compile(r"^(\d+)x(\d+)x(\d+)(p|m|m32)?$")


def parse_tiles(text: str) -> list | str:
    """The configs of ``--tiles``, or a one-line complaint naming the first bad one."""
    from fastdlight.config import Config

    configs = []
    for part in (t for t in text.split(",") if t):
        m = TILE.match(part.strip())
        if m is None:
            return f"{NAME}: tile {part!r} is not BMxBNxSTAGES[p|m|m32] (e.g. 128x176x2p, 128x64x2m)"
        bm, bn, stages = (int(g) for g in m.groups()[:3])
        mma = (m.group(4) or "").startswith("m")
        warp = (32,) if m.group(4) == "m32" else (16,) if mma else ()
        try:
            configs.append(Config("attention_mma" if mma else "attention_wgmma", block=(bm, bn), warp=warp,
                                  pipeline_stages=stages, persistent=m.group(4) == "p"))
        except ValueError as e:
            return f"{NAME}: tile {part!r}: {e}"
    return configs


def label_of(config) -> str:
    bm, bn = config.block
    mma = f"mma.sync (warps of {(config.warp or (16,))[0]}) " if config.kind == "attention_mma" else ""
    return f"{mma}{bm}x{bn}, {config.pipeline_stages} stages" + (", persistent" if config.persistent else "")


def watched(timers: dict, windows: dict) -> dict:
    """``timers`` that note when each ran (``windows[key]``: (start, end) pairs)."""
    def wrap(key, timer):
        def run(ms: float) -> float:
            t0 = time.perf_counter()
            out = timer(ms)
            windows.setdefault(key, []).append((t0, time.perf_counter()))
            return out
        return run
    return {key: wrap(key, timer) for key, timer in timers.items()}


def run_case(name: str, arch, configs, rounds: int, round_ms: float, sampler=None) -> list[dict]:
    import torch

    from fastdlight import ops
    from fastdlight.analysis.attention import match_attention
    from fastdlight.measure.graph_timing import time_torch_graph
    from fastdlight.measure.workload import Workload
    from fastdlight.policies.attention import attention_configs
    from fastdlight.search.runner import apply_and_build

    case = CASES[name]
    op = ops.attention(case.batch, case.heads, case.seq_q, case.seq_kv, case.head_dim,
                       kv_heads=case.kv_heads, causal=case.causal, dtype=case.dtype)
    configs = configs or attention_configs(match_attention(op.func), arch, topk=64)
    t0 = time.perf_counter()
    built, _ = apply_and_build(op.func, configs, arch, check="all", budget_ms=10, progress=False)
    results = {r.config: r for r in built}
    build_s = round(time.perf_counter() - t0, 1)
    wl = Workload(op.func, seed=1)
    sets = wl.timing_arg_sets(arch.l2_bytes)
    timers = {i: KernelTimer(results[c], sets, wl.dev) for i, c in enumerate(configs)
              if c in results and results[c].verified and results[c].module is not None}
    fns = torch_calls(case, sets)

    def torch_timer(ms: float) -> float:
        with torch.no_grad():
            return time_torch_graph(fns, ms, 0.1).median_ms

    timers["torch"] = torch_timer
    windows: dict = {}
    medians, errors = timed_rounds(watched(timers, windows), rounds, round_ms)
    clocks = {}
    if sampler is not None:
        for key, spans in windows.items():
            seen = sampler.within(spans)
            clocks[key] = {k: round(v) if v is not None else None for k, v in seen.items()}
    torch_ms = medians.get("torch")
    rows = []
    for i, c in enumerate(configs):
        r, ms = results.get(c), medians.get(i)
        error = errors.get(i) or ("" if r is not None and r.verified else
                                  (r.failure.message.splitlines()[0] if r is not None and r.failure else
                                   (r.check_message if r is not None else "not built") or "not verified"))
        rows.append({"case": name, "shape": case.describe(), "config": label_of(c), "ms": round(ms, 5) if ms else None,
                     "tflops": round(op.flops / (ms * 1e-3) / 1e12, 1) if ms else None,
                     "vs_torch": round(torch_ms / ms, 3) if ms and torch_ms else None,
                     "registers": r.registers if r is not None else None,
                     "spill_bytes": r.spill_bytes if r is not None else None,
                     "verified": bool(r is not None and r.verified), "error": error, **clocks.get(i, {})})
        print(f"  {rows[-1]['config']:<30} {rows[-1]['ms'] or '-':>9} ms {rows[-1]['tflops'] or '-':>7} TFLOPS "
              f"{rows[-1]['vs_torch'] or '-':>6}x  verified={rows[-1]['verified']} {error}"
              f"{'  %s MHz %s W' % (rows[-1].get('clock_mhz'), rows[-1].get('power_w')) if sampler else ''}", flush=True)
    rows.append({"case": name, "shape": case.describe(), "config": "torch SDPA", "ms": round(torch_ms, 5) if torch_ms else None,
                 "tflops": round(op.flops / (torch_ms * 1e-3) / 1e12, 1) if torch_ms else None, "vs_torch": 1.0,
                 "error": errors.get("torch", ""), "build_s": build_s, **clocks.get("torch", {})})
    print(f"  torch SDPA {rows[-1]['ms']} ms ({rows[-1]['tflops']} TFLOPS); build and verify {build_s} s"
          f"{'  %s MHz %s W' % (rows[-1].get('clock_mhz'), rows[-1].get('power_w')) if sampler else ''}", flush=True)
    return rows


def markdown(rows: list[dict], device: str) -> str:
    title = (f"{NAME}, {device}, {time.strftime('%Y-%m-%d')}: fixed attention configs against torch SDPA, CUDA graphs, "
             "inputs rotated out of L2, medians of alternating rounds")
    cells = [[r["case"], r["shape"], r["config"], f"{r['ms']:.4f}" if r.get("ms") else "-", r.get("tflops") or "-",
              f"{r['vs_torch']:.3f}x" if r.get("vs_torch") else "-", r.get("registers") or "-", r.get("verified", "-"),
              r.get("error") or ""] for r in rows]
    return table(title, ["case", "shape", "config", "ms", "TFLOPS", "vs torch", "registers", "verified", "error"], cells)


def main(argv=None) -> int:
    ap = rounds_parser(__doc__.splitlines()[0], round_ms=60.0)
    ap.add_argument("--tiles", default="", help="configs, BMxBNxSTAGES[p|m|m32] comma-separated (default: the policy's)")
    ap.add_argument("--clocks", action="store_true", help="sample the SM clock and board power while each runs")
    args = ap.parse_args(argv)
    configs = parse_tiles(args.tiles)
    names = cases_to_run(NAME, args, CASES, "\n".join(f"{n}: {c.describe()}" for n, c in CASES.items()), (configs,))
    if isinstance(names, int):
        return names
    arch = gpu_arch()
    sampler = Sampler() if args.clocks else None
    return run_cases(NAME, names, arch, lambda name: run_case(name, arch, configs, args.rounds, args.round_ms, sampler),
                     markdown, finish=sampler.stop if sampler is not None else None)


if __name__ == "__main__":
    sys.exit(main())

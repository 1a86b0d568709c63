"""Does a kernel's time depend on how long the GPU has been busy?

The tuner times each candidate for about 100 ms on a GPU that sat idle while the candidates
compiled; a model replays its kernels back to back for seconds. A GEMM draws the most power,
and an H100 lowers its clock when the power stays at the limit. This times a few wgmma tiles of
the GEMMs where a model's kernel ran slower than its tuning time, each *cold* (after an idle
second, as in tuning) and *hot* (right after ``--heat-s`` seconds of the same kernel back to
back), with the SM clock and board power sampled meanwhile (``nvidia-smi``). torch's matmul of
the same shape is timed the same way.

    python benchmarks/bench_sustained.py [--heat-s 2] [--only NAME ...]

Writes ``$OUT/bench_sustained.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tvm  # noqa: E402
from tvm import te  # noqa: E402

from bench_gemm_hopper import matmul_func, torch_matmuls  # noqa: E402
from bench_setup import Sampler, torch_gpu_missing, write_results  # noqa: E402
from fastdlight.arch import auto_arch  # noqa: E402
from fastdlight.policies.wgmma import WgmmaPolicy  # noqa: E402
from fastdlight.relax.gated import gated_product  # noqa: E402
from fastdlight.schedules import apply_config  # noqa: E402
from fastdlight.compiler.compile import build  # noqa: E402
from fastdlight.measure.timing import function_name, time_launches, time_torch
from fastdlight.measure.workload import Workload  # noqa: E402

BUDGET_MS = 100.0


def gated_func(m: int, n: int, k: int):
    x = te.placeholder((m, k), "float16", name="x")
    w = te.placeholder((2 * n, k), "float16", name="w")
    out = gated_product(x, w, "float32", "float16", "float16")
    return te.create_prim_func([x, w, out]).with_attr("global_symbol", "gated")


# name, function, tiles (bm, bn, wm, cluster[, stages: else the policy's]) to compare, and the
# layout torch reads the function's first two arguments in ("NT": B stored [N, K]), or None
CASES = [
    ("gated b4 2048x(2x5632)x2048", lambda: gated_func(2048, 5632, 2048),
     [(128, 256, 64, 1), (256, 128, 128, 1), (128, 256, 64, 2), (256, 128, 128, 2), (64, 256, 64, 1),
      (64, 256, 64, 2), (192, 128, 64, 1), (192, 128, 64, 2)],
     "NT"),
    # 688 tiles of 128x256 for 132 SMs: 5.2 waves; 1376 of 64x256: 10.4; 638 of 192x192: 4.8
    ("mlp up 2048x11008x4096 NN", lambda: matmul_func(2048, 11008, 4096, "float16", "NN"),
     [(128, 256, 64, 1), (256, 128, 128, 1), (128, 256, 64, 2), (256, 128, 128, 2), (192, 192, 64, 1),
      (192, 192, 64, 2), (192, 192, 64, 1, 3), (192, 192, 64, 2, 3), (64, 256, 64, 1),
      (64, 256, 64, 2)],
     "NN"),
    ("mlp down 2048x4096x11008 NN", lambda: matmul_func(2048, 4096, 11008, "float16", "NN"),
     [(128, 192, 64, 1), (128, 256, 64, 1), (256, 128, 128, 1), (128, 256, 64, 2), (256, 128, 128, 2)],
     "NN"),
    ("4096^3 NN", lambda: matmul_func(4096, 4096, 4096, "float16", "NN"),
     [(128, 256, 64, 1), (128, 256, 64, 2), (256, 128, 128, 1), (256, 128, 128, 2), (128, 192, 64, 1),
      (192, 192, 64, 1)], "NN"),
    ("8192^3 NN", lambda: matmul_func(8192, 8192, 8192, "float16", "NN"),
     [(128, 256, 64, 1), (128, 256, 64, 2), (256, 128, 128, 1), (256, 128, 128, 2), (128, 192, 64, 1),
      (192, 192, 64, 1)], "NN"),
    ("odd 3000x5120x1000 NT", lambda: matmul_func(3000, 5120, 1000, "float16", "NT"),
     [(128, 256, 64, 1), (128, 256, 64, 2), (256, 128, 128, 2)], "NT"),
]


def policy_config(func, arch, tile):
    """The policy's config of tile ``(bm, bn, wm, cluster[, stages])``, or None."""
    bm, bn, wm, cluster = tile[:4]
    configs = [c for c in WgmmaPolicy(func, arch).emit_config(64) if (c.block[0], c.block[1], c.warp[0]) == (bm, bn, wm)]
    if not configs:
        return None
    # the policy's own config of that cluster size (its axis, its rasterization group), else
    # another's with the cluster size replaced
    c = next((c for c in configs if c.cluster == cluster), None) or dataclasses.replace(
        configs[0], cluster=cluster, cluster_axis=configs[0].cluster_axis if cluster > 1 else "m")
    return dataclasses.replace(c, pipeline_stages=tile[4] if len(tile) > 4 else c.pipeline_stages)


def timed(run, sampler: Sampler, heat_s: float) -> dict:
    """``run(budget_ms)`` -> median ms: cold (after an idle second) and hot (after ``heat_s`` s)."""
    out = {}
    time.sleep(1.0)
    t0 = time.perf_counter()
    out["cold_ms"] = run(BUDGET_MS)
    out["cold"] = sampler.between(t0, time.perf_counter())
    run(heat_s * 1e3)
    t0 = time.perf_counter()
    out["hot_ms"] = run(BUDGET_MS)
    out["hot"] = sampler.between(t0, time.perf_counter())
    return out


def run_case(name, make, tiles, torch_layout, arch, sampler, heat_s, log) -> dict:
    func = make()
    wl = Workload(func, tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    row, first = {"case": name, "tiles": {}}, None
    for tile in tiles:
        config = policy_config(func, arch, tile)
        if config is None:
            row["tiles"][str(tile)] = {"error": "not among the policy's tiles"}
            continue
        try:
            with arch.target:
                kernel = apply_config(func, config).with_attr("global_symbol", "kernel")
            mod = build(tvm.IRModule({"main": kernel}), arch.target)
            launch = mod[function_name(mod, kernel)]
            out = wl.run_outputs(launch)[0].astype(np.float32)
        except Exception as e:  # noqa: BLE001 - one tile's failure is a row, not the end of the run
            row["tiles"][str(tile)] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            log(f"{name} {config}: {row['tiles'][str(tile)]}")
            continue
        first = out if first is None else first
        r = timed(lambda b: time_launches(launch, arg_sets, wl.dev, b).median_ms, sampler, heat_s)
        # the first tile's output is the yardstick (every tile sums K in the same order)
        r["max_diff_vs_first"] = float(np.nanmax(np.abs(out - first)) if np.isfinite(out).all() else np.inf)
        row["tiles"][str(tile)] = r
        log(f"{name} {config}: {r}")
    if torch_layout is not None:
        # the kernels' own rotated inputs, B read as the case stores it ([K, N], or [N, K]: NT)
        fns = torch_matmuls(arg_sets, torch_layout)
        row["torch"] = timed(lambda b: time_torch(fns, b).median_ms, sampler, heat_s)
        log(f"{name} torch: {row['torch']}")
    return row


def transient(name, make, tile, arch, sampler, seconds: float, batch_ms: float = 10.0) -> dict:
    """One kernel back to back for ``seconds`` after an idle second: the median of every
    ``batch_ms`` batch, with its time since the start (how fast the clock settles)."""
    func = make()
    config = policy_config(func, arch, tile)
    with arch.target:
        kernel = apply_config(func, config).with_attr("global_symbol", "kernel")
    mod = build(tvm.IRModule({"main": kernel}), arch.target)
    launch = mod[function_name(mod, kernel)]
    wl = Workload(func, tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    time_launches(launch, arg_sets, wl.dev, 20.0)
    time.sleep(1.0)
    t0, series = time.perf_counter(), []
    while time.perf_counter() - t0 < seconds:
        ms = time_launches(launch, arg_sets, wl.dev, batch_ms).median_ms
        series.append((round(time.perf_counter() - t0, 4), ms))
    return {"case": name, "tile": str(tile), "series": series, "clock": sampler.between(t0, time.perf_counter())}


def markdown(rows, device) -> str:
    lines = [f"Device: {device}", "", "| case | kernel | cold ms | MHz, W | hot ms | MHz, W | hot / cold | hot: mJ a run, "
             "kcycles a run |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        kernels = dict(row["tiles"])
        if "torch" in row:
            kernels["torch"] = row["torch"]
        for kernel, r in kernels.items():
            if "error" in r:
                lines.append(f"| {row['case']} | {kernel} | {r['error']} | | | | |")
                continue
            cw = lambda s: f"{s['clock_mhz']:.0f}, {s['power_w']:.0f}" if s["clock_mhz"] else "-"  # noqa: E731
            diff = f" (max diff {r['max_diff_vs_first']:.3g})" if "max_diff_vs_first" in r else ""
            hot = r["hot"]
            # at the power limit a run's energy sets its speed; cycles a run are its speed at one clock
            work = (f"{hot['power_w'] * r['hot_ms']:.0f}, {hot['clock_mhz'] * r['hot_ms']:.0f}"
                    if hot["clock_mhz"] else "-")
            lines.append(f"| {row['case']} | {kernel}{diff} | {r['cold_ms']:.4f} | {cw(r['cold'])} | {r['hot_ms']:.4f} "
                         f"| {cw(hot)} | {r['hot_ms'] / r['cold_ms']:.3f} | {work} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heat-s", type=float, default=2.0)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--transient", type=float, default=0.0,
                        help="seconds of the first case's first tile back to back, timed in 10 ms batches")
    args = parser.parse_args(argv)
    missing = torch_gpu_missing()
    if missing:
        print(f"bench_sustained: {missing}")
        return 2
    import torch
    arch = auto_arch()
    sampler = Sampler()
    rows = []
    for name, make, tiles, torch_layout in CASES:
        if args.only and not any(s in name for s in args.only):
            continue
        rows.append(run_case(name, make, tiles, torch_layout, arch, sampler, args.heat_s, print))
    series = []
    if args.transient:
        name, make, tiles, _layout = next(c for c in CASES if not args.only or any(s in c[0] for s in args.only))
        series.append(transient(name, make, tiles[0], arch, sampler, args.transient))
        print(series[-1])
    sampler.stop()
    device = torch.cuda.get_device_name()
    write_results("bench_sustained", {"device": device, "rows": rows, "transient": series}, markdown(rows, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Weight-only 4-bit decode GEMV on one GPU: the dequantizing GEMV template's best-known configs
against its split-K and global-activation forms, at fixed configs (no tuning), beside our fp16
GEMV of the same layer.

    python benchmarks/check_w4a16_decode.py [--only NAME ...] [--rounds 5] [--round-ms 30] [--fixed-only] [--list]

For each case (``ops.matmul_int4(1, N, K)``, group 128, fp16): the configs of ``CONFIGS`` and
the policy's variants (``dequant_gemv_variants``) are built, timed and verified against the
float64 reference of the dequantized weights in one ``apply_and_build`` (``check="all"``), the
tensor-core form's (``gemv_dequant_mma``) among them; our
fp16 GEMV (``ops.gemv(N, K)``) is tuned. Then every verified config and the fp16 GEMV are timed
in CUDA graphs, inputs rotated out of L2, in alternating rounds (each timing after an untimed
run of its own; medians). A row a config: ms, GB/s of the packed weights and scales, the
speed-up over the fp16 GEMV, registers, verdict; a config that fails to build or verify is a row
with its error. Writes ``$OUT/check_w4a16_decode.json`` and ``.md``. About 30-50 s on an H200.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_setup import KernelTimer, cases_to_run, rounds_parser, run_cases, table, timed_rounds

NAME = "check_w4a16_decode"
GROUP = 128
CASES = {"1x11008x4096": (1, 11008, 4096), "1x4096x11008": (1, 4096, 11008)}
#: (rows a CTA, rows a warp, split-K CTAs, activations read from global memory): the best-known
#: config first (run W, 2026-12-01), then hand-picked ones (among them CTAs of 16 and 32 warps,
#: which stage the activations half and a quarter as often); the policy's variants follow
CONFIGS = {
    "1x11008x4096": [(32, 4, 1, False), (16, 2, 1, False), (8, 1, 1, False), (16, 1, 1, False), (32, 2, 1, False),
                     (64, 4, 1, False), (32, 1, 1, False), (64, 2, 1, False), (32, 4, 2, False), (16, 4, 1, False)],
    "1x4096x11008": [(16, 1, 1, False), (16, 2, 1, False), (8, 1, 1, False), (32, 2, 1, False), (32, 1, 1, False),
                     (64, 2, 1, False), (16, 2, 4, False)],
}
FP16_TOPK = 8
#: H200 HBM3e, for the fraction of peak
PEAK_GBS = 4800.0


def config_of(rows: int, per_warp: int, split: int, x_global: bool):
    from fastdlight.config import Config
    from fastdlight.analysis.weight_only import X_GLOBAL_WIDTH

    return Config("gemv_dequant", block=(rows,), thread=(per_warp,), rstep=(256,), reduce_thread=(32,), split_k=split,
                  vectorize={"X": X_GLOBAL_WIDTH} if x_global else {})


def label_of(config) -> str:
    if config.kind == "gemv_dequant_mma":
        return (f"tensor cores: {config.block[0]} rows, {config.warp[0]} warps splitting K, "
                f"{config.pipeline_stages} steps ahead")
    parts = [f"{config.block[0]} rows", f"{config.thread[0]} a warp", f"{config.num_threads} threads"]
    if config.split_k > 1:
        parts.append(f"split-K {config.split_k}")
    if config.vectorize:
        parts.append("X from global")
    if config.persistent:
        parts.append("persistent")
    return ", ".join(parts)


def case_configs(name: str, op, arch, variants: bool = True) -> list:
    from fastdlight.analysis.weight_only import match_weight_only
    from fastdlight.policies.gemv_dequant import dequant_gemv_configs

    fixed = [config_of(*c) for c in CONFIGS[name]]
    policy = [c for c in dequant_gemv_configs(match_weight_only(op.func), arch, 8, variants=True)
              if c.split_k > 1 or c.vectorize or c.kind == "gemv_dequant_mma"] if variants else []
    out = []
    for c in fixed + policy:
        if c not in out:
            out.append(c)
    return out


def run_case(name: str, arch, rounds: int, round_ms: float, log, variants: bool = True) -> list[dict]:
    import tvm

    import fastdlight
    from fastdlight import ops
    from fastdlight.measure.workload import Workload
    from fastdlight.search.runner import apply_and_build

    m, n, k = CASES[name]
    op = ops.matmul_int4(m, n, k, GROUP)
    configs = case_configs(name, op, arch, variants)
    t0 = time.perf_counter()
    rows, results = [], {}
    try:
        built, _ = apply_and_build(op.func, configs, arch, check="all", budget_ms=10, ref=op.reference,
                                   progress=False)
        results = {r.config: r for r in built}
    except Exception as e:  # noqa: BLE001 - every config a row with the error
        err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        results = {}
        log(f"  apply_and_build failed: {err}")
    build_s = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    fp16 = ops.gemv(n, k, m=m)
    _, fp16_best = fastdlight.tune(fp16.func, arch, topk=FP16_TOPK, ref=fp16.reference, progress=False)
    fp16_tune_s = round(time.perf_counter() - t0, 1)

    dev = tvm.cuda(0)
    wl = Workload(op.func, dev, seed=0)
    sets = wl.timing_arg_sets(arch.l2_bytes)
    wl16 = Workload(fp16_best._func, dev, seed=0)
    timers, errors_setup = {"fp16": KernelTimer(fp16_best, wl16.timing_arg_sets(arch.l2_bytes), dev)}, {}
    for i, c in enumerate(configs):
        r = results.get(c)
        if r is not None and r.verified and r.module is not None:
            try:
                timers[i] = KernelTimer(r, sets, dev)
            except Exception as e:  # noqa: BLE001 - a row with its error
                errors_setup[i] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    medians, errors = timed_rounds(timers, rounds, round_ms)
    fp16_ms = medians.pop("fp16")
    for i, c in enumerate(configs):
        r = results.get(c)
        ms = medians.get(i)
        error = errors.get(i) or errors_setup.get(i)
        if r is not None and r.verified and ms is None and error is None:
            error = "no loaded module to time"
        if r is None:
            error = error or "not built (apply_and_build failed)"
        elif r.failure is not None or not r.verified:
            error = error or (r.failure.message.splitlines()[0] if r.failure else (r.check_message or "not verified"))
        row = {"case": name, "config": repr(c), "label": label_of(c) + (" (best known)" if i == 0 else ""), "ms": round(ms, 5) if ms else None,
               "gbs": round(op.bytes / ms / 1e6) if ms else None,
               "of_peak": round(op.bytes / ms / 1e6 / PEAK_GBS, 3) if ms else None,
               "vs_fp16": round(fp16_ms / ms, 3) if ms and fp16_ms else None,
               "verified": bool(r is not None and r.verified), "registers": r.registers if r is not None else None,
               "spill_bytes": r.spill_bytes if r is not None else None, "error": error}
        rows.append(row)
        log(f"  {row['label']:<52} {row['ms'] if ms else '-':>9} ms {row['gbs'] or '-':>6} GB/s "
            f"{(str(row['vs_fp16']) + 'x') if row['vs_fp16'] else '-':>7} vs fp16  regs={row['registers']} "
            f"verified={row['verified']}{'  ' + error if error else ''}")
    rows.append({"case": name, "config": repr(fp16_best.config), "label": "fp16 GEMV (tuned)",
                 "ms": round(fp16_ms, 5) if fp16_ms else None,
                 "gbs": round(fp16.bytes / fp16_ms / 1e6) if fp16_ms else None, "vs_fp16": 1.0,
                 "verified": bool(fp16_best.verified), "error": errors.get("fp16"), "build_s": build_s,
                 "fp16_tune_s": fp16_tune_s})
    log(f"  fp16 GEMV {fp16_ms and round(fp16_ms, 5)} ms ({rows[-1]['gbs']} GB/s; {fp16_best.config!r}); "
        f"build+verify {build_s} s, fp16 tune {fp16_tune_s} s")
    return rows


def markdown(rows: list[dict], device: str) -> str:
    title = (f"check_w4a16_decode, {device}, {time.strftime('%Y-%m-%d')}: W4A16 (group 128) decode GEMV at fixed "
             "configs, CUDA graphs, inputs rotated out of L2, medians of alternating rounds")
    cells = [[r["case"], r["label"], f"{r['ms']:.4f}" if r.get("ms") else "-", r.get("gbs") or "-",
              f"{r['vs_fp16']:.2f}x" if r.get("vs_fp16") else "-", r.get("registers") or "-", r.get("verified"),
              r.get("error") or ""] for r in rows]
    return table(title, ["case", "config", "ms", "GB/s", "vs fp16 GEMV", "registers", "verified", "error"], cells)


def main(argv=None) -> int:
    ap = rounds_parser(__doc__.splitlines()[0], round_ms=30.0)
    ap.add_argument("--fixed-only", action="store_true", help="the configs of CONFIGS only, not the policy's variants")
    args = ap.parse_args(argv)
    listing = "\n".join("\n  ".join([name, *(label_of(config_of(*c)) for c in configs)])
                        for name, configs in CONFIGS.items())
    names = cases_to_run(NAME, args, CASES, listing)
    if isinstance(names, int):
        return names
    import tvm

    from fastdlight.arch import CUDA

    arch = CUDA.from_device(tvm.cuda(0))
    return run_cases(NAME, names, arch, lambda name: run_case(name, arch, args.rounds, args.round_ms,
                                                               lambda msg: print(msg, flush=True),
                                                               not args.fixed_only), markdown)


if __name__ == "__main__":
    sys.exit(main())

"""Which quick timing ranks wgmma tiles as the power limit does? For each GEMM and its tiles:
(a) the truth: each side back to back (bench_energy.stretch: 1 s lead, `--seconds` timed), 2 turns;
(b) the tuner's hot retime (measure.heat of the first, then 3 rounds of 100 ms own heat + 33 ms);
(c) one clock: round robin of single samples (~0.5 ms each) over all sides, 400 ms in all.
Run from the checkout: python .diag/r20/rankers.py [--only NAME ...]"""
import argparse, json, math, os, sys, time
import numpy as np
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import tvm
from bench_energy import Nvml, ClockSampler, stretch, kernel_sides, tile_configs, Side
from bench_gemm_hopper import matmul_func, torch_matmuls
from bench_setup import torch_fp32_accumulation
from fastdlight.arch import auto_arch
from fastdlight.tune.measure import Workload, time_launches, time_torch, heat, MIN_SAMPLE_MS
from fastdlight.tune.cuda_events import Event

CASES = {
    "8192NT": ((8192, 8192, 8192, "float16", "NT"), ["192x192/64", "128x192/64", "128x256", "256x128", "128x256+2"]),
    "up2048": ((2048, 11008, 4096, "float16", "NN"), ["192x192/64", "128x256", "256x128", "256x192"]),
    "4096NN": ((4096, 4096, 4096, "float16", "NN"), ["128x256", "256x128", "192x192/64", "256x192", "128x192/64"]),
    "down4096": ((4096, 4096, 11008, "float16", "NN"), ["128x256", "256x128", "192x192/64", "128x192/64"]),
    "qkv": ((2048, 12288, 4096, "float16", "NN"), ["256x192", "256x128", "128x256", "192x192/64"]),
}

def my_sides(func, configs, arch, wl, arg_sets, layout):
    import torch
    from bench_gemm_hopper import torch_operands
    from fastdlight.schedules import apply_config
    from fastdlight.tune.compile import build
    from fastdlight.tune.measure import function_name
    a, b = torch_operands(wl.args, layout)
    ref = torch.matmul(a.float(), b.float()).cpu().numpy()
    sides, singles = [], []
    for config in configs:
        with arch.target:
            kernel = apply_config(func, config).with_attr("global_symbol", "kernel")
        mod = build(tvm.IRModule({"main": kernel}), arch.target)
        launch = mod[function_name(mod, kernel)]
        out = wl.run_outputs(launch)[0].astype(np.float32)
        err = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-9))
        assert err < 1e-2, (config, err)
        sides.append(Side(repr(config), lambda ms, f=launch: time_launches(f, arg_sets, wl.dev, ms).median_ms, None))
        st = {"i": 0}
        def once(f=launch, st=st):
            f(*arg_sets[st["i"] % len(arg_sets)]); st["i"] += 1
        singles.append(once)
    return sides, singles

def one_clock(fns, budget_ms=400.0, batch=20):
    """round robin over fns (one launch per call each), each sample >= MIN_SAMPLE_MS."""
    def per_launch(f, k=6):
        f(); s, e = Event(), Event(); s.record()
        for _ in range(k): f()
        e.record(); e.synchronize(); return s.elapsed_ms(e) / k
    est = [per_launch(f) for f in fns]
    number = [max(1, math.ceil(MIN_SAMPLE_MS / max(x, 1e-3))) for x in est]
    rounds = max(10, math.ceil(budget_ms / sum(n * x for n, x in zip(number, est))))
    out = [[] for _ in fns]
    for first in range(0, rounds, batch):
        taken = []
        for i in range(first, min(rounds, first + batch)):
            order = list(range(len(fns))) if i % 2 == 0 else list(range(len(fns)))[::-1]
            for j in order:
                s, e = Event(), Event(); s.record()
                for _ in range(number[j]): fns[j]()
                e.record(); taken.append((j, s, e))
        taken[-1][2].synchronize()
        for j, s, e in taken: out[j].append(s.elapsed_ms(e) / number[j])
    return [float(np.median(o)) for o in out]

def tuner_hot(runs, heat_fn):
    heat_fn()
    samples = [[] for _ in runs]
    for rnd in range(3):
        for i, run in enumerate(runs):
            if not (rnd == 0 and i == 0):
                run(100.0)
            samples[i].append(run(33.0))
    return [float(np.median(s)) for s in samples]

def main():
    ap = argparse.ArgumentParser(); ap.add_argument("--only", nargs="*"); ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    torch_fp32_accumulation()
    arch = auto_arch(); nvml = Nvml(); clock = ClockSampler(nvml)
    out_dir = os.environ.get("OUT", ".")
    rows = []
    for name, (shape, specs) in CASES.items():
        if args.only and name not in args.only: continue
        m, n, k, dtype, layout = shape
        func = matmul_func(m, n, k, dtype, layout)
        configs = tile_configs(specs, func, arch)
        wl = Workload(func, tvm.cuda(0), seed=0)
        arg_sets = wl.timing_arg_sets(arch.l2_bytes)
        sides, singles = my_sides(func, configs, arch, wl, arg_sets, layout)
        fns = torch_matmuls(arg_sets, layout)
        sides.append(Side("cuBLAS", lambda ms: time_torch(fns, ms).median_ms, None))
        # single-launch callables for the round robin
        from fastdlight.schedules import apply_config
        names = [s.name for s in sides]
        # (c) one clock first (on a GPU heated by the builds' checks only lightly: heat it with cuBLAS 1 s)
        sides[-1].run(1000.0)
        state = {"i": 0}
        def torch_once():
            fns[state["i"] % len(fns)](); state["i"] += 1
        oc = one_clock(singles + [torch_once])
        # (b) the tuner's hot retime over the tiles (not cuBLAS), then cuBLAS's own hot
        hot = tuner_hot([s.run for s in sides[:-1]], lambda: sides[0].run(500.0))
        # (a) truth: 2 turns of stretches
        truth = {nm: [] for nm in names}
        for turn in range(2):
            for s in (sides if turn % 2 == 0 else sides[::-1]):
                truth[s.name].append(stretch(s.run, args.seconds, nvml, clock))
        row = {"case": name, "sides": {}}
        base = np.mean([r["ms"] for r in truth["cuBLAS"]])
        for i, nm in enumerate(names):
            t = truth[nm]
            row["sides"][nm] = {"sustained_ms": float(np.mean([r["ms"] for r in t])),
                                "mj": float(np.mean([r["mj_per_gemm"] for r in t])),
                                "mhz": float(np.mean([r["mhz"] for r in t])),
                                "one_clock_ms": oc[i], "tuner_hot_ms": hot[i] if i < len(hot) else None}
        rows.append(row)
        print(f"== {name} {shape}")
        for nm, r in row["sides"].items():
            short = nm.replace("Config[matmul_wgmma]", "").split(", rstep")[0] + (" c2" if "cluster" in nm else "")
            print(f"  {short:44s} sustained {r['sustained_ms']:.4f} ({base / r['sustained_ms']:.3f}x) "
                  f"mJ {r['mj']:.1f} MHz {r['mhz']:.0f} | one clock {r['one_clock_ms']:.4f} ({oc[-1] / r['one_clock_ms']:.3f}x) "
                  f"| tuner hot {r['tuner_hot_ms'] if r['tuner_hot_ms'] is None else round(r['tuner_hot_ms'], 4)}", flush=True)
    json.dump(rows, open(os.path.join(out_dir, "rankers.json"), "w"), indent=1)
    clock.stop()

if __name__ == "__main__":
    main()

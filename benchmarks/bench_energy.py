"""Energy per GEMM at the power limit: wgmma tiles against cuBLAS, each run back to back.

A hot H100 runs a large fp16 GEMM at its power limit (700 W), so what sets a kernel's
sustained speed is the energy it spends per GEMM, not its cycles alone. Each side runs back to
back for ``--seconds`` after a second of itself; NVML's energy counter (millijoules since the
driver loaded) is read around that stretch, and the SM clock, the board's power and NVML's clock
event reasons are sampled every 10 ms, so each side gets its median time, mean clock, mean power,
energy per GEMM, cycles per GEMM, mean and highest sampled power, and the share of samples in
which the power cap, a hardware slowdown or the power brake held the clock. Sides take turns,
twice (the second time in reverse order), and the two stretches are averaged.

    python benchmarks/bench_energy.py [--seconds 3] [--only 4096 ...]

Writes ``$OUT/bench_energy.json`` and ``.md``. Needs torch, a GPU and ``libnvidia-ml``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tvm  # noqa: E402

from bench_gemm_hopper import matmul_func, torch_matmuls  # noqa: E402
from bench_setup import torch_fp32_accumulation, torch_gpu_missing, write_results  # noqa: E402
from fastdlight.arch import auto_arch  # noqa: E402
from fastdlight.policies.config import Config  # noqa: E402
from fastdlight.schedules import apply_config  # noqa: E402
from fastdlight.tune.compile import build  # noqa: E402
from fastdlight.tune.measure import Workload, function_name, time_launches, time_torch  # noqa: E402

#: NVML's clock type of the SM clock
NVML_CLOCK_SM = 1
#: each side's untimed lead-in (its own clock and power settle) and the batches it is timed in
LEAD_MS, BATCH_MS = 1000.0, 250.0


def wgmma(bm, bn, wm, cluster=1, axis="m", group=16) -> Config:
    return Config("matmul_wgmma", block=(bm, bn), warp=(wm, bn), rstep=(64,), pipeline_stages=4,
                  use_async_copy=True, rasterization=group, cluster=cluster, cluster_axis=axis)


# name, (M, N, K, dtype, layout), the tiles to run
CASES = [
    ("4096³ NN", (4096, 4096, 4096, "float16", "NN"),
     [wgmma(128, 256, 64), wgmma(128, 256, 64, 2), wgmma(256, 128, 128, 2, "n", 8)]),
    ("8192³ NN", (8192, 8192, 8192, "float16", "NN"), [wgmma(128, 256, 64, 2), wgmma(128, 256, 64)]),
    ("LLaMA up 2048×11008×4096", (2048, 11008, 4096, "float16", "NN"), [wgmma(192, 192, 64, group=8)]),
]


class Nvml:
    """The GPU's energy counter and SM clock through ``libnvidia-ml``."""

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        self.dev = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.dev)) != 0:
            raise RuntimeError(f"no NVML device {index}")

    def energy_mj(self) -> int:
        value = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(value)) != 0:
            raise RuntimeError("this GPU reports no energy counter")
        return value.value

    def sm_mhz(self) -> int:
        value = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.dev, NVML_CLOCK_SM, ctypes.byref(value))
        return value.value

    def power_w(self) -> float:
        """The board's power draw now (NVML's sample, milliwatts), in watts."""
        value = ctypes.c_uint()
        self.lib.nvmlDeviceGetPowerUsage(self.dev, ctypes.byref(value))
        return value.value / 1e3

    def clock_reasons(self) -> int:
        """The bits of what holds the clocks below their maximum now (``CLOCK_REASONS``)."""
        value = ctypes.c_ulonglong()
        # the newer name first; drivers before 535 have only the older one
        query = (getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
                 or self.lib.nvmlDeviceGetCurrentClocksThrottleReasons)
        query(self.dev, ctypes.byref(value))
        return value.value


#: NVML's clock event (throttle) reasons this benchmark reports, by bit
CLOCK_REASONS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80}


class ClockSampler:
    """The SM clock, the board power and the clock event reasons every 10 ms, in a thread."""

    def __init__(self, nvml: Nvml):
        self.samples: list[tuple[float, int, float, int]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, args=(nvml,), daemon=True).start()

    def _run(self, nvml: Nvml):
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), nvml.sm_mhz(), nvml.power_w(), nvml.clock_reasons()))
            time.sleep(0.01)

    def _within(self, t0: float, t1: float) -> list:
        return [s[1:] for s in self.samples if t0 <= s[0] <= t1]

    def mean(self, t0: float, t1: float) -> float:
        values = [mhz for mhz, _, _ in self._within(t0, t1)]
        return float(np.mean(values)) if values else float("nan")

    def power(self, t0: float, t1: float) -> tuple[float, float]:
        """The mean and the highest sampled board power (NVML's power reading, which the power
        cap acts on; the energy counter's average over the same stretch can differ by a few %)."""
        values = [w for _, w, _ in self._within(t0, t1)]
        return (float(np.mean(values)), float(np.max(values))) if values else (float("nan"), float("nan"))

    def reasons(self, t0: float, t1: float) -> dict[str, float]:
        """The share of samples each reason in ``CLOCK_REASONS`` was set in."""
        bits = [r for _, _, r in self._within(t0, t1)]
        return {name: float(np.mean([bool(b & bit) for b in bits])) if bits else float("nan")
                for name, bit in CLOCK_REASONS.items()}

    def stop(self):
        self._stop.set()


def stretch(run, seconds: float, nvml: Nvml, clock: ClockSampler) -> dict:
    """``run(budget_ms)`` (median ms of a timing) back to back: time, clock, power, energy."""
    run(LEAD_MS)
    t0, e0 = time.perf_counter(), nvml.energy_mj()
    medians = [run(BATCH_MS) for _ in range(max(1, round(seconds * 1e3 / BATCH_MS)))]
    t1, e1 = time.perf_counter(), nvml.energy_mj()
    ms, mhz, watts = float(np.median(medians)), clock.mean(t0, t1), (e1 - e0) / 1e3 / (t1 - t0)
    return {"ms": ms, "mhz": mhz, "w": watts, "mj_per_gemm": watts * ms, "kcycles_per_gemm": mhz * ms,
            **dict(zip(("sampled_w", "max_sampled_w"), clock.power(t0, t1))),
            **{f"share_{k}": v for k, v in clock.reasons(t0, t1).items()}}


def run_case(name, shape, configs, arch, seconds, nvml, clock, log) -> dict:
    m, n, k, dtype, layout = shape
    func = matmul_func(m, n, k, dtype, layout)
    wl = Workload(func, tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    fns = torch_matmuls(arg_sets, layout)
    sides = {}
    for config in configs:
        with arch.target:
            kernel = apply_config(func, config).with_attr("global_symbol", "kernel")
        mod = build(tvm.IRModule({"main": kernel}), arch.target)
        launch = mod[function_name(mod, kernel)]
        wl.run_outputs(launch)
        sides[repr(config)] = lambda ms, launch=launch: time_launches(launch, arg_sets, wl.dev, ms).median_ms
    sides["cuBLAS"] = lambda ms: time_torch(fns, ms).median_ms
    names = list(sides)
    runs = {s: [] for s in names}
    for order in (names, names[::-1]):
        for s in order:
            runs[s].append(stretch(sides[s], seconds, nvml, clock))
    row = {"case": name, "sides": {s: {key: float(np.mean([r[key] for r in v])) for key in v[0]} for s, v in runs.items()}}
    log(json.dumps(row))
    return row


def markdown(rows, device: str, seconds: float) -> str:
    lines = [f"Device: {device}. Each side back to back for {seconds:g} s after {LEAD_MS / 1e3:g} s of itself, "
             "twice in turns; NVML energy counter and SM clock.", "",
             "| case | kernel | ms | MHz | W | mJ a GEMM | kcycles a GEMM | time vs cuBLAS | energy vs cuBLAS | cycles vs cuBLAS "
             "| sampled W (mean, max) | power cap / HW slowdown / power brake (share of samples) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = row["sides"]["cuBLAS"]
        for name, r in row["sides"].items():
            lines.append(f"| {row['case']} | {name} | {r['ms']:.4f} | {r['mhz']:.0f} | {r['w']:.0f} | {r['mj_per_gemm']:.1f} "
                         f"| {r['kcycles_per_gemm']:.1f} | {base['ms'] / r['ms']:.3f} | {r['mj_per_gemm'] / base['mj_per_gemm']:.3f} "
                         f"| {r['kcycles_per_gemm'] / base['kcycles_per_gemm']:.3f} "
                         f"| {r.get('sampled_w', float('nan')):.0f}, {r.get('max_sampled_w', float('nan')):.0f} "
                         f"| {r.get('share_sw_power_cap', float('nan')):.2f} / {r.get('share_hw_slowdown', float('nan')):.2f} "
                         f"/ {r.get('share_hw_power_brake', float('nan')):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed stretch of each side (default 3)")
    parser.add_argument("--only", nargs="*", help="cases whose name contains one of these")
    args = parser.parse_args(argv)
    missing = torch_gpu_missing()
    if missing:
        print(f"bench_energy: {missing}")
        return 2
    import torch
    try:
        nvml = Nvml()
        nvml.energy_mj()
    except (OSError, RuntimeError) as e:
        print(f"bench_energy: no NVML energy counter here ({e})")
        return 2
    torch_fp32_accumulation()
    arch = auto_arch()
    clock = ClockSampler(nvml)
    rows = [run_case(name, shape, configs, arch, args.seconds, nvml, clock, print)
            for name, shape, configs in CASES if not args.only or any(s in name for s in args.only)]
    clock.stop()
    device = torch.cuda.get_device_name()
    write_results("bench_energy", {"device": device, "seconds": args.seconds, "rows": rows},
                  markdown(rows, device, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())

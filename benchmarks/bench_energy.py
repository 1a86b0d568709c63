"""Energy per GEMM at the power limit: wgmma tiles against cuBLAS, each run back to back.

A hot H100 runs a large fp16 GEMM at its power limit (700 W), so what sets a kernel's
sustained speed is the energy it spends per GEMM, not its cycles alone. Each side runs back to
back for ``--seconds`` after a second of itself; NVML's energy counter (millijoules since the
driver loaded) is read around that stretch, and the SM clock, the board's power and NVML's clock
event reasons are sampled every 10 ms, so each side gets its median time, mean clock, mean power,
energy per GEMM, cycles per GEMM, mean and highest sampled power, and the share of samples in
which the power cap, a hardware slowdown or the power brake held the clock. Right after its
stretch each side is also timed hot for 30 ms (as the tuner's finalists are) and in a CUDA graph
(as the models are): a tile can rank differently there than at the cap. Sides take ``--turns``
turns (2), the order flipping each turn, and the turns are averaged. Every kernel's output is
checked against fp32 torch first.

    python benchmarks/bench_energy.py [--seconds 3] [--turns 2] [--only 4096 ...]
    python benchmarks/bench_energy.py --shape 2048 12288 4096 [--dtype float16] [--layout NN] \
        --tile 128x256 --tile 256x192/128 --tile 128x256+2

A tile is ``BMxBN[/WM][+C[m|n]]``: rows per consumer warpgroup WM (default BM / 2, or 64 for a
192-row tile: three warpgroups; WM = BM is ping-pong), a cluster of C CTAs along M or N (default
the policy's axis); its stages and rasterization group are the policy's, as the tuner's are.

Writes ``$OUT/bench_energy.json`` and ``.md``. Needs torch, a GPU and ``libnvidia-ml``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tvm  # noqa: E402

from bench_gemm_hopper import matmul_func, torch_matmuls  # noqa: E402
from bench_setup import torch_fp32_accumulation, torch_gpu_missing, write_results  # noqa: E402
from fastdlight.arch import auto_arch  # noqa: E402
from fastdlight.config import Config  # noqa: E402
from fastdlight.policies.wgmma import WgmmaPolicy  # noqa: E402
from fastdlight.schedules import apply_config  # noqa: E402
from fastdlight.schedules.wgmma.template import config_fits  # noqa: E402
from fastdlight.compiler.compile import build  # noqa: E402
from fastdlight.measure.graph_timing import time_graph, time_torch_graph  # noqa: E402
from fastdlight.measure.timing import function_name, time_launches, time_torch
from fastdlight.measure.workload import Workload  # noqa: E402

#: NVML's clock type of the SM clock
NVML_CLOCK_SM = 1
#: each side's untimed lead-in (its own clock and power settle) and the batches it is timed in
LEAD_MS, BATCH_MS = 1000.0, 250.0
#: after its stretch, each side's hot timing (the tuner's finalists get 33 ms) and graph timing
HOT_MS, GRAPH_MS = 30.0, 100.0
#: a kernel whose output is further than this from fp32 torch's (relative to its largest value)
#: is wrong, and not timed
MAX_REL_ERR = 1e-2

# name, (M, N, K, dtype, layout), the tiles to run
CASES = [
    ("4096³ NN", (4096, 4096, 4096, "float16", "NN"), ["128x256", "128x256+2", "256x128/128+2n"]),
    ("8192³ NN", (8192, 8192, 8192, "float16", "NN"), ["128x256+2", "128x256"]),
    ("LLaMA up 2048×11008×4096", (2048, 11008, 4096, "float16", "NN"), ["192x192/64"]),
]

TILE = re.compile(r"(\d+)x(\d+)(?:/(\d+))?(?:\+(\d+)([mn])?)?")


class BadTile(ValueError):
    """A tile spec that is malformed, or that the wgmma template does not take for the GEMM."""


def tile_spec(text: str) -> str:
    """``text`` if it reads as a tile (for argparse: a malformed one is refused in one line)."""
    if not TILE.fullmatch(text.strip().lower()):
        raise argparse.ArgumentTypeError(f"{text!r} is not BMxBN[/WM][+C[m|n]] (e.g. 256x192/128, 128x256+2)")
    return text.strip().lower()


def tile_config(spec: str, func, arch) -> Config:
    """The wgmma config of tile ``spec`` (see the module docstring) for ``func`` on ``arch``."""
    match = TILE.fullmatch(spec.strip().lower())
    if match is None:
        raise BadTile(f"{spec!r} is not BMxBN[/WM][+C[m|n]]")
    bm, bn = int(match[1]), int(match[2])
    wm = int(match[3]) if match[3] else 64 if bm == 192 else bm // 2
    cluster = int(match[4] or 1)
    if not (bm and bn and wm):
        raise BadTile(f"tile {spec}: zero rows or columns")
    try:
        policy = WgmmaPolicy(func, arch)
        config = policy.config(policy.tile(bm, bn, wm, cluster, match[5] if cluster > 1 else None))
    except ValueError as e:  # no wgmma path for the GEMM, or a config the Config type refuses
        raise BadTile(f"tile {spec}: {e}") from None
    if config.pipeline_stages < 2 or not config_fits(policy.match, config):
        raise BadTile(f"the wgmma template does not take tile {spec} (warpgroups of {wm} rows) for this GEMM")
    return config


def tile_configs(specs, func, arch) -> list[Config]:
    """The configs of ``specs``, each once (``128x256`` and ``128x256/64`` are one tile)."""
    configs = {}
    for spec in specs:
        config = tile_config(spec, func, arch)
        configs.setdefault(repr(config), config)
    return list(configs.values())


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


@dataclass(frozen=True)
class Side:
    """One kernel of a case: its queued-launch timing (median ms over a budget) and its CUDA
    graph timing (budget, estimated ms a launch)."""

    name: str
    run: Callable[[float], float]
    graph: Callable[[float, float], float]


class WrongOutput(RuntimeError):
    """A kernel whose output is not fp32 torch's."""


def kernel_sides(func, configs, arch, wl, arg_sets, layout) -> list[Side]:
    """Each config's kernel, built and checked against fp32 torch on the case's inputs."""
    import torch

    from bench_gemm_hopper import torch_operands

    a, b = torch_operands(wl.args, layout)
    ref = torch.matmul(a.float(), b.float()).cpu().numpy()
    sides = []
    for config in configs:
        with arch.target:
            kernel = apply_config(func, config).with_attr("global_symbol", "kernel")
        mod = build(tvm.IRModule({"main": kernel}), arch.target)
        launch = mod[function_name(mod, kernel)]
        out = wl.run_outputs(launch)[0].astype(np.float32)
        err = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-9))
        if not err < MAX_REL_ERR:
            raise WrongOutput(f"{config}: max relative error {err:.1e} against fp32 torch")
        sides.append(Side(repr(config), lambda ms, f=launch: time_launches(f, arg_sets, wl.dev, ms).median_ms,
                          lambda ms, est, f=launch: time_graph(f, arg_sets, wl.dev, ms, est).median_ms))
    return sides


def run_case(name, shape, configs, arch, seconds, turns, nvml, clock, log) -> dict:
    m, n, k, dtype, layout = shape
    func = matmul_func(m, n, k, dtype, layout)
    wl = Workload(func, tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    fns = torch_matmuls(arg_sets, layout)
    sides = kernel_sides(func, configs, arch, wl, arg_sets, layout)
    sides.append(Side("cuBLAS", lambda ms: time_torch(fns, ms).median_ms,
                      lambda ms, est: time_torch_graph(fns, ms, est).median_ms))
    row = {"case": name, **take_turns(sides, turns, seconds, nvml, clock)}
    log(json.dumps(row))
    return row


def take_turns(sides: list[Side], turns: int, seconds: float, nvml, clock) -> dict:
    """Every side's stretch, then its hot and graph timings, ``turns`` times, the order flipping
    each turn: the turns' means by side, and each turn's median ms."""
    runs = {s.name: [] for s in sides}
    for turn in range(turns):
        for side in sides if turn % 2 == 0 else sides[::-1]:
            r = stretch(side.run, seconds, nvml, clock)
            r["hot_ms"] = side.run(HOT_MS)
            r["graph_ms"] = side.graph(GRAPH_MS, r["ms"])
            runs[side.name].append(r)
    return {"sides": {s: {key: float(np.mean([r[key] for r in v])) for key in v[0]} for s, v in runs.items()},
            "turn_ms": {s: [r["ms"] for r in v] for s, v in runs.items()}}


def markdown(rows, device: str, seconds: float, turns: int = 2) -> str:
    nan = float("nan")
    lines = [f"Device: {device}. Each side back to back for {seconds:g} s after {LEAD_MS / 1e3:g} s of itself, "
             f"{turns} turns, the order flipping; NVML energy counter and SM clock; then {HOT_MS:g} ms hot and "
             "in a CUDA graph.", "",
             "| case | kernel | ms | MHz | W | mJ a GEMM | kcycles a GEMM | time vs cuBLAS | energy vs cuBLAS | cycles vs cuBLAS "
             "| sampled W (mean, max) | power cap / HW slowdown / power brake (share of samples) "
             "| hot vs cuBLAS | graph vs cuBLAS |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = row["sides"]["cuBLAS"]
        for name, r in row["sides"].items():
            lines.append(f"| {row['case']} | {name} | {r['ms']:.4f} | {r['mhz']:.0f} | {r['w']:.0f} | {r['mj_per_gemm']:.1f} "
                         f"| {r['kcycles_per_gemm']:.1f} | {base['ms'] / r['ms']:.3f} | {r['mj_per_gemm'] / base['mj_per_gemm']:.3f} "
                         f"| {r['kcycles_per_gemm'] / base['kcycles_per_gemm']:.3f} "
                         f"| {r.get('sampled_w', nan):.0f}, {r.get('max_sampled_w', nan):.0f} "
                         f"| {r.get('share_sw_power_cap', nan):.2f} / {r.get('share_hw_slowdown', nan):.2f} "
                         f"/ {r.get('share_hw_power_brake', nan):.2f} "
                         f"| {base.get('hot_ms', nan) / r.get('hot_ms', nan):.3f} "
                         f"| {base.get('graph_ms', nan) / r.get('graph_ms', nan):.3f} |")
    return "\n".join(lines) + "\n"


def selected_cases(args, parser) -> list[tuple[str, tuple, list[str]]]:
    """``--shape`` with its ``--tile``s as one case, or the built-in cases ``--only`` names."""
    if args.shape is None:
        if args.tile:
            parser.error("--tile needs --shape")
        return [c for c in CASES if not args.only or any(s in c[0] for s in args.only)]
    if not args.tile:
        parser.error("--shape needs at least one --tile")
    if min(args.shape) < 1:
        parser.error(f"--shape {' '.join(map(str, args.shape))}: every extent must be positive")
    m, n, k = args.shape
    return [(f"{args.dtype} {m}×{n}×{k} {args.layout}", (m, n, k, args.dtype, args.layout), args.tile)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed stretch of each side (default 3)")
    parser.add_argument("--turns", type=int, default=2, help="turns of every side, the order flipping (default 2)")
    parser.add_argument("--only", nargs="*", help="built-in cases whose name contains one of these")
    parser.add_argument("--shape", type=int, nargs=3, metavar=("M", "N", "K"), help="one GEMM of your own")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--layout", default="NN", choices=["NN", "NT", "TN", "TT"])
    parser.add_argument("--tile", type=tile_spec, action="append", help="BMxBN[/WM][+C[m|n]], repeatable")
    args = parser.parse_args(argv)
    if args.turns < 1 or args.seconds <= 0:
        parser.error("--turns and --seconds must be positive")
    cases = selected_cases(args, parser)
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
    if not arch.has_wgmma:
        print(f"bench_energy: {arch.arch} has no wgmma; it times the sm_90a template")
        return 2
    try:  # every tile checked before any is timed
        cases = [(name, shape, tile_configs(specs, matmul_func(*shape), arch)) for name, shape, specs in cases]
    except BadTile as e:
        print(f"bench_energy: {e}")
        return 2
    clock = ClockSampler(nvml)
    try:
        rows = [run_case(name, shape, configs, arch, args.seconds, args.turns, nvml, clock, print)
                for name, shape, configs in cases]
    except WrongOutput as e:
        print(f"bench_energy: {e}")
        return 1
    finally:
        clock.stop()
    device = torch.cuda.get_device_name()
    write_results("bench_energy", {"device": device, "seconds": args.seconds, "turns": args.turns, "rows": rows},
                  markdown(rows, device, args.seconds, args.turns))
    return 0


if __name__ == "__main__":
    sys.exit(main())

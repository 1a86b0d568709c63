"""How much the timing method moves the numbers: one kernel, four ways (GPU + torch needed).

    python benchmarks/timing_methods.py [--budget-ms 100]

For a short memory-bound kernel (fp16 16384×1024 row sum, fastdlight's policy top-1) and a
longer compute-bound one (fp32 1024³ matmul), and torch's version of each:

* ``flush+sync``: TVM ``time_evaluator`` style: 1.5 × L2 written by a device copy, device
  synchronized, one launch between two events (what fastdlight used before "rotate").
* ``zero_ queued``: Triton ``do_bench`` style: ``buf.zero_()`` over 2 × L2, then the events and
  the launch, nothing synchronized in between (launch latency hidden, dirty L2 kept).
* ``rotate+sync``: inputs rotated through copies, device synchronized before each launch
  (clean L2, launch latency exposed).
* ``rotate queued``: fastdlight's default (:func:`fastdlight.measure.timing.time_launches`).

The differences separate the two effects: dirty lines left by a write flush, and the host's
launch latency when the GPU idles before each launch.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tvm  # noqa: E402

from fastdlight import ops  # noqa: E402
from fastdlight.arch import CUDA  # noqa: E402
from fastdlight.policies.default import DefaultPolicy  # noqa: E402
from fastdlight.schedules import apply_config  # noqa: E402
from fastdlight.compiler.compile import build  # noqa: E402
from fastdlight.measure.cuda_events import Event  # noqa: E402
from fastdlight.measure.timing import flush_bytes_for, function_name, time_launches, time_module
from fastdlight.measure.workload import Workload  # noqa: E402


def median_of(samples):
    return float(np.median(samples))


def synced_rotation(launch, arg_sets, dev, n):
    start, end, out = Event(), Event(), []
    for i in range(n):
        dev.sync()
        start.record()
        launch(*arg_sets[i % len(arg_sets)])
        end.record()
        end.synchronize()
        out.append(start.elapsed_ms(end))
    return median_of(out)


def zero_queued(torch, launch, args, l2_bytes, n):
    buf = torch.empty(2 * l2_bytes // 4, dtype=torch.int32, device="cuda")
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in pairs:
        buf.zero_()
        s.record()
        launch(*args)
        e.record()
    torch.cuda.synchronize()
    return median_of([s.elapsed_time(e) for s, e in pairs])


def methods(torch, launch, arg_sets, dev, arch, budget_ms, tvm_mod=None, name=None):
    n = 200
    row = {}
    if tvm_mod is not None:
        row["flush+sync"] = time_module(tvm_mod, name, arg_sets[:1], dev, budget_ms, "flush",
                                        flush_bytes_for(arch.l2_bytes)).median_ms
    else:
        flush = torch.empty(flush_bytes_for(arch.l2_bytes) // 4, dtype=torch.int32, device="cuda")

        def once():
            flush.zero_()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            launch(*arg_sets[0])
            e.record()
            torch.cuda.synchronize()
            return s.elapsed_time(e)

        row["flush+sync"] = median_of([once() for _ in range(n)])
    row["zero_ queued"] = zero_queued(torch, launch, arg_sets[0], arch.l2_bytes, n)
    row["rotate+sync"] = synced_rotation(launch, arg_sets, dev, n)
    row["rotate queued"] = time_launches(launch, arg_sets, dev, budget_ms).median_ms
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-ms", type=float, default=100.0)
    args = parser.parse_args()
    import torch

    dev = tvm.cuda(0)
    arch = CUDA.from_device(dev)
    target = tvm.target.Target.from_device(dev)
    cases = [
        ("row sum fp16 16384x1024", ops.reduce((16384, 1024), "float16", "sum"), lambda a, out: torch.sum(a, 1)),
        ("matmul fp32 1024^3", ops.matmul(1024, 1024, 1024, "float32"), lambda a, b, out: torch.matmul(a, b, out=out)),
    ]
    print(f"device: {dev.device_name}; medians in µs\n")
    print(f"| kernel | {' | '.join(['flush+sync', 'zero_ queued', 'rotate+sync', 'rotate queued'])} |")
    print("|---|---|---|---|---|")
    for label, op, torch_fn in cases:
        cfg = DefaultPolicy(op.func, arch).emit_config(1)[0]
        mod = build(apply_config(op.func, cfg).mod, target).mod
        wl = Workload(op.func, dev)
        sets = wl.timing_arg_sets(arch.l2_bytes)
        name = function_name(mod, op.func)
        ours = methods(torch, mod[name], sets, dev, arch, args.budget_ms, mod, name)
        tsets = [[torch.from_dlpack(t) for t in s] for s in sets]
        theirs = methods(torch, torch_fn, tsets, dev, arch, args.budget_ms)
        for who, row in ((f"{label}, fastdlight top-1", ours), (f"{label}, torch", theirs)):
            print(f"| {who} | " + " | ".join(f"{v * 1e3:.1f}" for v in row.values()) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

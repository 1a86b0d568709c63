"""A model tuned on several GPUs of one machine (``ApplyFastTuning(devices=...)``, one worker
process per GPU) against the same model tuned on one GPU: candidates per second and winners.

    python benchmarks/bench_devices.py [--models resnet18_nhwc_b16,llama_b1_s512] [--devices 0,1]

Per model (``torch_models``, as ``bench_models`` prepares it): the prepared module tuned from a
fresh database on GPU 0 alone, then on ``--devices``. A row: seconds, candidates built (the
reports' sum), candidates per second of each and their ratio, where the one-GPU run's time went
(its stages: builds, the GPU's turn, ...), each GPU's share of the spread run, and the functions
whose winners differ: another config kind, or a time more than 3 % apart (each time was taken on the GPU that
tuned the function). Writes ``$OUT/bench_devices.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_setup import write_results  # noqa: E402

NAME = "bench_devices"
DEFAULT_MODELS = ("resnet18_nhwc_b16", "llama_b1_s512")
#: winners whose times differ by more than this are listed
SAME_WITHIN = 0.03


def prepared_module(name: str, arch):
    import torch_models

    from fastdlight.relax import for_inference, prepare

    spec = torch_models.specs()[name]
    mod, params = torch_models.export_relax(spec, torch_models.build(spec))
    return prepare(arch.target)(for_inference(mod, params, layout=spec.layout or "auto", fp16_io=True))


def tune(mod, arch, devices, topk: int) -> dict:
    from fastdlight.relax import ApplyFastTuning

    tuning = ApplyFastTuning(topk=topk, target=arch, meta_database_dir=tempfile.mkdtemp(prefix="fastdlight_dev_"),
                             devices=devices, progress=False)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuning(mod)
    seconds = time.perf_counter() - t0
    report = {e.function: e for e in tuning.report if e.status in ("tuned", "database")}
    per_device = {}
    for e in report.values():
        d = per_device.setdefault(str(e.device if e.device is not None else "here"), [0, 0, 0.0])
        d[0], d[1], d[2] = d[0] + 1, d[1] + e.candidates, d[2] + e.seconds
    stages = {k: round(v, 1) for k, v in sorted(tuning.stage_seconds.items(), key=lambda kv: -kv[1]) if v >= 0.5}
    return {"seconds": round(seconds, 2), "candidates": sum(e.candidates for e in report.values()),
            "report": report, "requeued": sorted(e.function for e in tuning.report if e.requeued),
            # functions, candidates and summed tuning seconds each GPU's worker had; where this
            # process's time went (a spread run's is mostly waiting for the workers)
            "shares": {k: {"functions": f, "candidates": c, "seconds": round(t, 1)} for k, (f, c, t) in per_device.items()},
            "stages": stages}


def differing(one: dict, many: dict) -> list[str]:
    out = []
    for name, a in one.items():
        b = many.get(name)
        if b is None or a.latency_ms is None or b.latency_ms is None:
            continue
        kinds = (a.config.kind if a.config else None, b.config.kind if b.config else None)
        if kinds[0] != kinds[1] or abs(b.latency_ms / a.latency_ms - 1) > SAME_WITHIN:
            out.append(f"{name}: {kinds[0]} {a.latency_ms:.4f} ms / {kinds[1]} {b.latency_ms:.4f} ms")
    return out


def bench(name: str, devices, topk: int, arch) -> dict:
    mod = prepared_module(name, arch)
    one = tune(mod, arch, None, topk)
    many = tune(mod, arch, devices, topk)
    rate = [r["candidates"] / r["seconds"] if r["seconds"] else None for r in (one, many)]
    return {"model": name, "devices": list(devices), "one_s": one["seconds"], "many_s": many["seconds"],
            "one_candidates": one["candidates"], "many_candidates": many["candidates"],
            "one_per_s": rate[0] and round(rate[0], 2), "many_per_s": rate[1] and round(rate[1], 2),
            "speedup": round(rate[1] / rate[0], 2) if all(rate) else None,
            "differing": differing(one["report"], many["report"]), "requeued": many["requeued"],
            "one_stages": one["stages"], "many_shares": many["shares"]}


def markdown(rows: list[dict]) -> str:
    lines = ["| model | GPUs | s (1 GPU) | s (GPUs) | candidates/s (1 GPU) | candidates/s (GPUs) | ratio "
             "| winners differing | requeued |", "|" + "---|" * 9]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | - | - | {r['error']} |")
            continue
        lines.append(f"| {r['model']} | {','.join(map(str, r['devices']))} | {r['one_s']} | {r['many_s']} "
                     f"| {r['one_per_s']} | {r['many_per_s']} | {r['speedup']}x | {len(r['differing'])} "
                     f"| {len(r['requeued'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--devices", default="0,1", help="the GPUs of the spread run")
    ap.add_argument("--topk", type=int, default=20)
    args = ap.parse_args(argv)
    from fastdlight.search.options import parse_devices

    try:
        devices = parse_devices(args.devices)
    except ValueError as e:
        print(f"error: --{e}", file=sys.stderr)
        return 2
    import tvm

    from fastdlight.arch import CUDA, has_gpu

    if not has_gpu():
        print("error: bench_devices needs CUDA GPUs", file=sys.stderr)
        return 2
    arch = CUDA.from_device(tvm.cuda(0))
    rows = []
    for name in [n for n in args.models.split(",") if n]:
        try:
            rows.append(bench(name, devices, args.topk, arch))
        except Exception as e:  # noqa: BLE001 - a row, not a crash
            rows.append({"model": name, "error": f"{type(e).__name__}: {str(e).strip()[:200]}"})
        print(rows[-1], flush=True)
    data = {"benchmark": NAME, "device": arch.device_name, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    write_results(NAME, data, f"{NAME}, {data['device']}, {data['date']}\n\n" + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A model tuned on several GPUs of one machine (``ApplyFastTuning(devices=...)``: each function
timed on one of them, builds shared) against the same model tuned on one GPU: candidates per second
and winners.

    python benchmarks/bench_devices.py [--models resnet18_nhwc_b16,llama_b1_s512] [--devices 0,1] [--jobs N]

After a small operator tuned on each GPU (processes started, contexts made), per model
(``torch_models``, as ``bench_models`` prepares it), each run from a fresh database: GPU 0 alone
with the pass's default functions at a time; ``--devices``; GPU 0 alone with as many functions at
a time as the run on ``--devices`` (so that the ratio is not only the concurrency's; at the
default, a repeat of the first run). A
row: seconds, candidates built (the reports' sum), candidates per second of each and the ratios,
where each run's time went (its stages: builds, the GPU's turn, ...), the functions each GPU timed,
the seconds each GPU's turn was held, the tuning process's CPU seconds, the function that took
longest from its start to its pick (a wall that more GPUs cannot cut below), and the functions
whose winners differ from the one-GPU run's: another config kind, or a time more than 3 % apart, for the run on ``--devices`` and for the second run on GPU 0 (how far two runs on
one GPU differ). Writes ``$OUT/bench_devices.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import resource
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


def tune(mod, arch, devices, topk: int, jobs: int | None) -> dict:
    from fastdlight.measure.gpu_turns import GPU_TURNS
    from fastdlight.relax import ApplyFastTuning

    tuning = ApplyFastTuning(topk=topk, target=arch, meta_database_dir=tempfile.mkdtemp(prefix="fastdlight_dev_"),
                             devices=devices, progress=False, jobs=jobs)
    given, held = dict(GPU_TURNS.given), GPU_TURNS.held_s()
    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuning(mod)
    seconds = time.perf_counter() - t0
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    report = {e.function: e for e in tuning.report if e.status in ("tuned", "database")}
    stages = {k: round(v, 1) for k, v in sorted(tuning.stage_seconds.items(), key=lambda kv: -kv[1]) if v >= 0.5}
    return {"seconds": round(seconds, 2), "candidates": sum(e.candidates for e in report.values()),
            "longest": longest_function(report.values()),
            "jobs": tuning.jobs, "report": report, "stages": stages,
            # functions (and dispatchers' checks) each GPU timed
            "functions_per_gpu": {str(i): n - given.get(i, 0) for i, n in GPU_TURNS.given.items()
                                  if n > given.get(i, 0)},
            # how busy each GPU was kept (its turn held) and the tuning process's own CPU time
            # (its threads share one interpreter: near the wall time, the host paces the run)
            "gpu_held_s": {str(i): round(s - held.get(i, 0.0), 1) for i, s in GPU_TURNS.held_s().items()
                           if s > held.get(i, 0.0)},
            "process_cpu_s": round(cpu.ru_utime + cpu.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1)}


def longest_function(entries) -> dict:
    """The function whose tuning took longest (its report's seconds, from its start to its
    pick): the functions are tuned side by side, so the run takes at least that long whatever
    the GPUs."""
    entries = [e for e in entries if e.seconds is not None]
    if not entries:
        return {}
    e = max(entries, key=lambda e: e.seconds)
    return {"function": e.function, "s": round(e.seconds, 2), "candidates": e.candidates}


def differing(one: dict, many: dict) -> list[str]:
    """The functions whose winners differ: another kind, or a time more than 3% apart; each
    winner with its place among the policy's configs (``#0`` its first; none for stock Dlight),
    and ``same config`` where both runs picked one config (then the two times are the same
    kernel measured twice, not two picks)."""
    out = []
    for name, a in one.items():
        b = many.get(name)
        if b is None or a.latency_ms is None or b.latency_ms is None:
            continue
        kinds = (a.config.kind if a.config else None, b.config.kind if b.config else None)
        if kinds[0] != kinds[1] or abs(b.latency_ms / a.latency_ms - 1) > SAME_WITHIN:
            same = " (same config)" if a.config is not None and a.config == b.config else ""
            out.append(f"{name}: {_winner(a)} {a.latency_ms:.4f} ms / {_winner(b)} {b.latency_ms:.4f} ms{same}")
    return out


def _winner(entry) -> str:
    kind = entry.config.kind if entry.config else None
    return f"{kind} #{entry.rank}" if entry.rank is not None else str(kind)


def warm_up(devices, arch) -> None:
    """A small operator tuned on each GPU first: the build and probe processes started, each
    GPU's context made, before any run is timed."""
    import fastdlight
    from fastdlight import ops

    op = ops.elementwise((1024, 1024), "float16", "add")
    for d in devices:
        fastdlight.tune(op.func, arch, topk=4, devices=(d,))


def bench(name: str, devices, topk: int, jobs: int | None, arch) -> dict:
    mod = prepared_module(name, arch)
    one = tune(mod, arch, None, topk, None)
    many = tune(mod, arch, devices, topk, jobs)
    # GPU 0 again, at the GPUs' run's concurrency: where that is the default's, a repeat of the
    # first run, whose winners then say how far two runs on one GPU differ
    one_wide = tune(mod, arch, None, topk, many["jobs"])
    runs = {"one": one, "one_wide": one_wide, "many": many}
    rate = {k: r["candidates"] / r["seconds"] if r["seconds"] else None for k, r in runs.items()}
    row = {"model": name, "devices": list(devices)}
    for k, r in runs.items():
        row.update({f"{k}_s": r["seconds"], f"{k}_jobs": r["jobs"], f"{k}_candidates": r["candidates"],
                    f"{k}_per_s": rate[k] and round(rate[k], 2), f"{k}_stages": r["stages"],
                    f"{k}_functions_per_gpu": r["functions_per_gpu"], f"{k}_gpu_held_s": r["gpu_held_s"],
                    f"{k}_process_cpu_s": r["process_cpu_s"], f"{k}_longest": r["longest"]})
    row["speedup"] = round(rate["many"] / rate["one"], 2) if rate["many"] and rate["one"] else None
    row["speedup_same_jobs"] = round(rate["many"] / rate["one_wide"], 2) if rate["many"] and rate["one_wide"] else None
    row["differing"] = differing(one["report"], many["report"])
    row["differing_one_gpu"] = differing(one["report"], one_wide["report"])
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| model | GPUs | s (1 GPU, its jobs) | s (1 GPU, jobs of GPUs) | s (GPUs) | candidates/s | ratio "
             "| ratio at equal jobs | winners differing (GPUs / GPU 0 again) | longest function s (1 GPU / GPUs) |",
             "|" + "---|" * 10]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | - | - | {r['error']} | - |")
            continue
        longest = " / ".join(f"{x['s']} ({x['function']})" if x else "-"
                             for x in (r.get("one_longest") or {}, r.get("many_longest") or {}))
        lines.append(f"| {r['model']} | {','.join(map(str, r['devices']))} | {r['one_s']} ({r['one_jobs']}) "
                     f"| {r['one_wide_s']} ({r['one_wide_jobs']}) | {r['many_s']} ({r['many_jobs']}) "
                     f"| {r['one_per_s']} / {r['one_wide_per_s']} / {r['many_per_s']} | {r['speedup']}x "
                     f"| {r['speedup_same_jobs']}x | {len(r['differing'])} / {len(r.get('differing_one_gpu', []))} "
                     f"| {longest} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--devices", default="0,1", help="the GPUs of the spread run")
    ap.add_argument("--topk", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=None, help="functions at a time on the GPUs (default: the pass's)")
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
    warm_up(devices, arch)
    rows = []
    for name in [n for n in args.models.split(",") if n]:
        try:
            rows.append(bench(name, devices, args.topk, args.jobs, arch))
        except Exception as e:  # noqa: BLE001 - a row, not a crash
            rows.append({"model": name, "error": f"{type(e).__name__}: {str(e).strip()[:200]}"})
        print(rows[-1], flush=True)
    data = {"benchmark": NAME, "device": arch.device_name, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    write_results(NAME, data, f"{NAME}, {data['device']}, {data['date']}\n\n" + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

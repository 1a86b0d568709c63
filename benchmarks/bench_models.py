"""Whole models through Relax: torch eager, torch in a CUDA graph, torch.compile, stock Dlight
(at sm_90a and sm_90) and fastdlight, from one run on one GPU.

    python benchmarks/bench_models.py --models mlp_gelu,llama_b1_s512 --out results/ [--profile [--trace]]
    python benchmarks/bench_models.py --export-fixtures tests/relax/fixtures   # TVMScript, no weights

The Relax side: torch model (fp32) -> torch.export -> Relax -> weights bound, BatchNorm decomposed,
ToMixedPrecision (fp16, fp32 accumulation; fp16 input and output, as the ``.half()`` torch model
takes and returns them) [-> ConvertLayout NHWC] -> then either TVM's default
pipeline with stock Dlight, or fastdlight's (``fastdlight.relax``: prepare -> ApplyFastTuning ->
build). Every side is timed inside a CUDA graph (torch eager also queued, as users run it), median
over >= 100 ms. Weights (>= 100 MB for the transformer models) exceed the L2, so no flush is needed.
Each model's row is written as soon as it is done (JSON lines + a markdown table), so a run cut
short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import fastdlight  # noqa: E402
from fastdlight.arch import CUDA  # noqa: E402
from fastdlight.relax import ApplyFastTuning, build, prepare  # noqa: E402
from fastdlight.relax.pipeline import for_inference, prim_funcs  # noqa: E402
from fastdlight.measure.graph_timing import time_graph, time_torch_graph  # noqa: E402
from fastdlight.measure.timing import time_launches, time_torch  # noqa: E402
from bench_setup import kernel_trace  # noqa: E402

BUDGET_MS = 200.0
STOCK_TARGETS = {"sm_90a": {"tag": "nvidia/nvidia-h100"}, "sm_90": {"tag": "nvidia/nvidia-h100", "arch": "sm_90"}}


@dataclass
class Row:
    model: str
    description: str
    device: str = ""
    torch_eager_ms: float | None = None
    torch_graph_ms: float | None = None
    torch_compile_ms: float | None = None
    stock_sm_90a_ms: float | None = None
    stock_sm_90_ms: float | None = None
    fastdlight_ms: float | None = None  # the median of fastdlight_runs_ms
    fastdlight_runs_ms: list = field(default_factory=list)  # three timings of the built model
    tune_s: float | None = None
    replay_s: float | None = None
    replay_hits: int = 0  # functions the replay took from the database (of `functions`)
    tune_stages: dict = field(default_factory=dict)  # where the tuning wall went (tune.clock)
    build_s: float | None = None
    stock_build_s: float | None = None
    functions: int = 0
    untuned: list = field(default_factory=list)
    stock_won: list = field(default_factory=list)
    max_rel_err: float | None = None
    errors: dict = field(default_factory=dict)
    profile: list = field(default_factory=list)
    kernel_check: list = field(default_factory=list)  # --kernel-check: (function, ms alone, ms tuned)
    trace: dict = field(default_factory=dict)  # --trace: side -> [{kernel, us, launches}] per model call


def traced(row: Row, side: str, fn) -> None:
    """``row.trace[side]``: the kernels of ``fn()`` (a diagnostic: its failure is noted, not fatal)."""
    try:
        row.trace[side] = kernel_trace(fn)
    except Exception as e:  # noqa: BLE001
        row.errors[f"trace {side}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"


def time_vm(vm, args, dev, row: Row | None = None) -> float:
    """Median ms of one ``vm["main"](*args)`` inside a CUDA graph (queued launches if the VM
    cannot be captured: noted in ``row.errors``)."""
    fn = vm["main"]
    estimate = time_launches(fn, [args], dev, budget_ms=20).median_ms
    try:
        return time_graph(fn, [args], dev, BUDGET_MS, per_launch_ms=estimate).median_ms
    except Exception as e:  # noqa: BLE001
        if row is not None:
            row.errors["cuda graph"] = f"not capturable, queued launches timed: {str(e).splitlines()[0][:150]}"
        return time_launches(fn, [args], dev, BUDGET_MS).median_ms


def run_torch(model, x, row: Row, args):
    import torch

    with torch.no_grad():
        row.torch_eager_ms = time_torch([lambda: model(x)], BUDGET_MS).median_ms
        row.torch_graph_ms = time_torch_graph([lambda: model(x)], BUDGET_MS, row.torch_eager_ms).median_ms
        if not args.skip_compile:
            try:
                compiled = torch.compile(model)
                compiled(x)
                row.torch_compile_ms = time_torch_graph([lambda: compiled(x)], BUDGET_MS, row.torch_eager_ms).median_ms
                if args.trace:
                    traced(row, "torch.compile", lambda: compiled(x))
            except Exception as e:  # noqa: BLE001
                row.errors["torch.compile"] = str(e).splitlines()[0][:200]
        return model(x).float().cpu().numpy()


def run_stock(mod, x_tvm, dev, row: Row):
    for sm, spec in STOCK_TARGETS.items():
        try:
            t0 = time.perf_counter()
            target = tvm.target.Target(spec)
            with target, tvm.transform.PassContext(opt_level=3):
                ex = tvm.compile(mod, target=target)
            if sm == "sm_90a":
                row.stock_build_s = round(time.perf_counter() - t0, 2)
            setattr(row, f"stock_{sm}_ms", time_vm(relax.VirtualMachine(ex, dev), [x_tvm], dev))
        except Exception as e:  # noqa: BLE001
            row.errors[f"stock {sm}"] = str(e).strip().splitlines()[-1][:200]


def run_fastdlight(mod, x_tvm, dev, arch: CUDA, row: Row, args) -> np.ndarray:
    prepared = prepare(arch.target)(mod)
    row.functions = len(prim_funcs(prepared))
    db = tempfile.mkdtemp(prefix="fastdlight_models_")
    tuning = ApplyFastTuning(topk=args.topk, target=arch, meta_database_dir=db, progress=False)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tuning(prepared)
    row.tune_s = round(time.perf_counter() - t0, 2)
    replay = ApplyFastTuning(topk=args.topk, target=arch, meta_database_dir=db, progress=False)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        replay(prepared)
    row.replay_s = round(time.perf_counter() - t0, 2)
    row.replay_hits = sum(e.status == "database" for e in replay.report)
    row.tune_stages = tuning.stage_seconds
    t0 = time.perf_counter()
    ex = build(tuned, arch.target)
    row.build_s = round(time.perf_counter() - t0, 2)
    vm = relax.VirtualMachine(ex, dev)
    row.fastdlight_runs_ms = [round(time_vm(vm, [x_tvm], dev, row), 4) for _ in range(3)]
    if args.trace:
        traced(row, "fastdlight", lambda: vm["main"](x_tvm))
    row.fastdlight_ms = float(np.median(row.fastdlight_runs_ms))
    row.untuned = [e.function for e in tuning.report if e.status == "untuned"]
    row.stock_won = [e.function for e in tuning.report if e.winner == "stock"]
    calls = call_counts(prepared)
    row.profile = sorted(
        ({"function": e.function, "calls": calls.get(e.function, 1), "winner": e.winner,
          "ms": e.latency_ms, "stock_ms": e.stock_ms, "config": repr(e.config) if e.config else None,
          "seconds": e.seconds, "error": e.error, "failed": e.failed, "seeded": e.seeded,
          "fallback": e.fallback} for e in tuning.report),
        key=lambda p: -(p["ms"] or 0) * p["calls"])
    if args.kernel_check:
        row.kernel_check = kernel_check(tuned, arch, dev, tuning.report)
    out = vm["main"](x_tvm)
    out = out if hasattr(out, "numpy") else out[0]  # the exported graph returns a tuple
    return out.numpy().astype(np.float32)


def kernel_check(tuned, arch: CUDA, dev, report) -> list:
    """Each scheduled function of the tuned module, compiled alone and timed as the tuner does:
    (function, ms now, ms the tuner measured). A function far slower now than when it was tuned
    points at the build, not the kernel."""
    from fastdlight.compiler.build_task import lower_and_compile
    from fastdlight.measure.timing import time_module
    from fastdlight.measure.workload import Workload

    tuned_ms = {e.function: e.latency_ms for e in report}
    views = {e.function for e in report if e.status == "view"}  # no kernel: a view of the input
    rows = []
    for name, func in prim_funcs(tuned).items():
        if name in views:
            continue
        func = func.with_attr("global_symbol", "main")
        try:
            ex, _, _ = lower_and_compile(tvm.IRModule({"main": func}), arch.target)
            wl = Workload(func, dev)
            ms = time_module(ex, "main", wl.timing_arg_sets(arch.l2_bytes), dev, 50).median_ms
        except Exception as e:  # noqa: BLE001
            ms = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        rows.append((name, ms, tuned_ms.get(name)))
    return rows


def call_counts(mod) -> dict[str, int]:
    counts: dict[str, int] = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            name = expr.args[0].name_hint
            counts[name] = counts.get(name, 0) + 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return counts


def bench_model(name: str, args, dev, arch: CUDA) -> Row:
    import torch
    import torch_models

    spec = torch_models.specs()[name]
    row = Row(name, spec.description, device=arch.device_name or arch.name)
    model = torch_models.build(spec)
    mod, params = torch_models.export_relax(spec, model)
    mod = for_inference(mod, params, layout=spec.layout or "auto", fp16_io=True)  # as a user gets it
    x32 = torch.randn(spec.input_shape, generator=torch.Generator().manual_seed(1))
    model16 = model.half().cuda()
    ref = run_torch(model16, x32.half().cuda(), row, args)
    del model16
    torch.cuda.empty_cache()
    x_tvm = tvm.runtime.tensor(x32.half().numpy(), dev)
    run_stock(mod, x_tvm, dev, row)
    try:
        out = run_fastdlight(mod, x_tvm, dev, arch, row, args)
        row.max_rel_err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-6))
    except Exception as e:  # noqa: BLE001
        row.errors["fastdlight"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
    return row


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def markdown(rows: list[Row]) -> str:
    head = ("| model | torch eager ms | torch graph ms | torch.compile ms | Dlight sm_90a ms | Dlight sm_90 ms "
            "| fastdlight ms | vs torch graph | vs torch eager | vs compile | vs best Dlight | tune s | replay s "
            "| build s (Dlight) | untuned | stock won |")
    lines = [head, "|" + "---|" * 16]
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else "-"  # noqa: E731
    for r in rows:
        stock = min((v for v in (r.stock_sm_90a_ms, r.stock_sm_90_ms) if v), default=None)
        lines.append(
            f"| {r.model} | {fmt(r.torch_eager_ms)} | {fmt(r.torch_graph_ms)} | {fmt(r.torch_compile_ms)} "
            f"| {fmt(r.stock_sm_90a_ms)} | {fmt(r.stock_sm_90_ms)} | {fmt(r.fastdlight_ms)} "
            f"| {ratio(r.torch_graph_ms, r.fastdlight_ms)} | {ratio(r.torch_eager_ms, r.fastdlight_ms)} "
            f"| {ratio(r.torch_compile_ms, r.fastdlight_ms)} | {ratio(stock, r.fastdlight_ms)} | {r.tune_s} "
            f"| {r.replay_s} ({r.replay_hits} hits) | {r.build_s} ({r.stock_build_s}) | {len(r.untuned)}/{r.functions} "
            f"| {len(r.stock_won)} |")
    return "\n".join(lines) + "\n\nRatios are speedups of fastdlight (> 1: fastdlight faster).\n"


def profile_text(r: Row, top: int = 8) -> str:
    lines = [f"\n### {r.model}: top functions (tuned time x calls)\n",
             "| function | calls | winner | ms | stock ms | config |", "|---|---|---|---|---|---|"]
    for p in r.profile[:top]:
        ms = f"{p['ms']:.4f}" if p["ms"] else "-"
        st = f"{p['stock_ms']:.4f}" if p["stock_ms"] else "-"
        lines.append(f"| {p['function']} | {p['calls']} | {p['winner']} | {ms} | {st} | {p['config'] or p['error']} |")
    for p in r.profile:
        if p.get("fallback"):
            lines.append(f"\n{p['function']}{' (seeded)' if p.get('seeded') else ''}: an earlier candidate set "
                         f"failed as a whole: {p['fallback'][:300]}")
    for side, kernels in r.trace.items():
        total = sum(k["us"] for k in kernels)
        lines.append(f"\n{side}: kernels as the model runs them ({total:.1f} us of device time a call)\n")
        lines += ["| kernel | us a call | launches |", "|---|---|---|"]
        lines += [f"| {k['kernel']} | {k['us']} | {k['launches']} |" for k in kernels[:top + 4]]
    if r.tune_stages:
        stages = ", ".join(f"{k} {v:.1f}" for k, v in r.tune_stages.items())
        lines.append(f"\nTuning {r.tune_s} s wall; seconds by stage, summed over threads and workers: {stages}")
    return "\n".join(lines)


def export_fixtures(out_dir: str, names) -> None:
    """The Relax modules of the models (weights as parameters, values left out) as TVMScript."""
    import torch_models

    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        spec = torch_models.specs()[name]
        mod, _ = torch_models.export_relax(spec, torch_models.build(spec))
        with open(os.path.join(out_dir, f"{name}.py"), "w") as f:
            f.write(f"# {spec.description}: torch.export -> Relax (fp32, weights as parameters)\n")
            text = mod.script(show_meta=True)  # BatchNorm statistics are constants: keep them
            tvm.ir.assert_structural_equal(tvm.script.from_source(text), mod)
            f.write(text)
        print(f"wrote {name}.py ({len(text) // 1024} KB)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp_gelu,mlp_silu,decoder_ln,llama_b1_s512,resnet18_nhwc_b16")
    ap.add_argument("--topk", type=int, default=20)
    ap.add_argument("--out", default="bench_models_out")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--skip-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--kernel-check", action="store_true",
                    help="time each tuned function of the built model alone, beside its tuning time")
    ap.add_argument("--trace", action="store_true",
                    help="every kernel's device time as the model runs, fastdlight's and torch.compile's "
                         "(in the JSON; in the markdown with --profile)")
    ap.add_argument("--export-fixtures", metavar="DIR")
    args = ap.parse_args(argv)
    try:
        import torch_models
    except ImportError as e:
        print(f"error: bench_models needs torch ({e})", file=sys.stderr)
        return 2
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in torch_models.specs()]
    if unknown:
        print(f"error: unknown model(s) {unknown}; known: {sorted(torch_models.specs())}", file=sys.stderr)
        return 2
    if args.export_fixtures:
        export_fixtures(args.export_fixtures, names)
        return 0
    if not fastdlight.has_gpu():
        print("error: bench_models needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = tvm.cuda(0)
    arch = CUDA.from_device(dev)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name in names:
        t0 = time.perf_counter()
        row = bench_model(name, args, dev, arch)
        rows.append(row)
        with open(os.path.join(args.out, "bench_models.jsonl"), "a") as f:
            f.write(json.dumps(asdict(row)) + "\n")
        text = markdown(rows) + ("".join(profile_text(r) for r in rows) if args.profile else "")
        with open(os.path.join(args.out, "bench_models.md"), "w") as f:
            f.write(f"Device: {row.device}\n\n{text}\n")
        print(f"[{name}: {time.perf_counter() - t0:.0f} s] " + json.dumps({k: v for k, v in asdict(row).items()
                                                                           if k != "profile"}), flush=True)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

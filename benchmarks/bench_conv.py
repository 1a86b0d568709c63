"""ResNet-18's convolution layers: what the tuner picks against cuDNN (torch) and stock Dlight.

    python benchmarks/bench_conv.py [--batch 16] [--topk 20] [--only NAME ...] [--layouts NHWC NCHW]
                                    [--dtypes float16 bfloat16] [--pipeline] [--dry-run]
                                    [--held-out N [--seed S]]

Each case is one layer as FuseOps leaves it in the model (``cast(conv2d(x, w))``, fp32
accumulation, fp16 or bf16 in and out): NHWC data with OHWI weights (what
``relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})`` gives) or NCHW with
OIHW. fastdlight tunes it through ``tune_function`` (its tensor-core and CUDA-core configs and
stock Dlight's schedules measured together, the fastest verified one wins); then the winner and
``torch.nn.functional.conv2d`` (cuDNN, ``cudnn.benchmark=True``, channels_last memory for the
NHWC rows, the same stored tensors) are both timed inside CUDA graphs, alternately in
``ROUNDS`` rounds, inputs rotated out of L2 (medians). The row gives the winner, the best time of
each family while tuning, and the ratio to cuDNN.

``--pipeline``: each layer as a one-layer Relax model through the model pipeline instead
(``for_inference(layout="NHWC")`` with the weight bound, as a model binds it; ``compile_model``),
timed as one VM call in the same CUDA graphs. That is how a model runs the 3-channel stem (an
im2col gather and a GEMM, :mod:`fastdlight.relax.convs`; the weight's columns folded at compile
time) and NCHW layers (a transpose of the input, an NHWC convolution and a transpose back, every
kernel in the timing; the weight's transpose folded).

``--held-out N``: N convolutions of random geometry (drawn from ``--seed``, by default the
clock; the log names it) instead of ResNet-18's layers: shapes no test names, each tuned and its
winner verified against torch in fp64 like every row.

``--dry-run`` (no GPU): every case's function and its candidate configs, nothing built or timed.
Writes ``$OUT/bench_conv.json`` and ``.md`` (``bench_conv_pipeline.*`` with ``--pipeline``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tvm  # noqa: E402
from tvm import relax, te, topi  # noqa: E402

from bench_setup import kernel_trace, open_log, torch_fp32_accumulation  # noqa: E402
from fastdlight.arch import auto_arch, has_gpu  # noqa: E402
from fastdlight.relax import compile_model, for_inference, prepare  # noqa: E402
from fastdlight.relax.pipeline import prim_funcs  # noqa: E402
from fastdlight.policies.select import candidate_sets
from fastdlight.search.candidates import stock_configs, tune_function  # noqa: E402
from fastdlight.measure.graph_timing import time_graph, time_torch_graph  # noqa: E402
from fastdlight.measure.timing import function_name
from fastdlight.measure.workload import Workload  # noqa: E402
from fastdlight.search.options import TuneOptions  # noqa: E402


@dataclass(frozen=True)
class Layer:
    name: str
    cin: int
    cout: int
    size: int  # input height = width
    kernel: int
    stride: int
    pad: int


#: ResNet-18 (224x224 input): the stem, each stage's 3x3 layers and its 1x1 stride-2 downsample
LAYERS = [
    Layer("stem 7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3),
    Layer("l1 3x3 64->64 @56", 64, 64, 56, 3, 1, 1),
    Layer("l2 3x3/2 64->128 @56", 64, 128, 56, 3, 2, 1),
    Layer("l2 3x3 128->128 @28", 128, 128, 28, 3, 1, 1),
    Layer("l2 ds 1x1/2 64->128 @56", 64, 128, 56, 1, 2, 0),
    Layer("l3 3x3/2 128->256 @28", 128, 256, 28, 3, 2, 1),
    Layer("l3 3x3 256->256 @14", 256, 256, 14, 3, 1, 1),
    Layer("l3 ds 1x1/2 128->256 @28", 128, 256, 28, 1, 2, 0),
    Layer("l4 3x3/2 256->512 @14", 256, 512, 14, 3, 2, 1),
    Layer("l4 3x3 512->512 @7", 512, 512, 7, 3, 1, 1),
    Layer("l4 ds 1x1/2 256->512 @14", 256, 512, 14, 1, 2, 0),
]

#: timing rounds of the winner and cuDNN, alternated (medians reported)
ROUNDS = 5


def held_out_layers(count: int, seed: int) -> list[Layer]:
    """``count`` convolutions of random geometry, drawn from ``seed``: shapes no test names (the
    channels a multiple of 8 or a few odd ones, kernels 1/3/5/7, stride 1 or 2, padding none or
    "same", 7 to 64 pixels; the input at least as large as the kernel)."""
    import random

    rng = random.Random(seed)
    layers = []
    while len(layers) < count:
        kernel, stride = rng.choice((1, 3, 5, 7)), rng.choice((1, 2))
        cin = rng.choice((3, 5, 12)) if rng.random() < 0.2 else 8 * rng.randint(1, 48)
        cout, size = 8 * rng.randint(1, 48), rng.randint(max(7, kernel), 64)
        pad = rng.choice((0, kernel // 2))
        name = f"held-out {kernel}x{kernel}/{stride} {cin}->{cout} @{size} pad {pad}"
        layers.append(Layer(name, cin, cout, size, kernel, stride, pad))
    return layers


@dataclass(frozen=True)
class Case:
    layer: Layer
    batch: int
    layout: str  # "NHWC" (OHWI weights) or "NCHW" (OIHW weights)
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.layer.name} {self.layout} {self.dtype} b{self.batch}"

    def func(self) -> tvm.tirx.PrimFunc:
        ly, n = self.layer, self.batch
        nhwc = self.layout == "NHWC"
        data = te.placeholder((n, ly.size, ly.size, ly.cin) if nhwc else (n, ly.cin, ly.size, ly.size), self.dtype,
                              name="data")
        k = ly.kernel
        weight = te.placeholder((ly.cout, k, k, ly.cin) if nhwc else (ly.cout, ly.cin, k, k), self.dtype, name="weight")
        conv = topi.nn.conv2d(data, weight, ly.stride, ly.pad, 1, data_layout=self.layout,
                              kernel_layout="OHWI" if nhwc else "OIHW", out_dtype="float32")
        out = topi.cast(conv, self.dtype)
        return te.create_prim_func([data, weight, out]).with_attr("global_symbol", "conv")

    def relax_module(self) -> tvm.IRModule:
        """The layer as a one-layer model: ``astype(conv2d(data, weight, out_dtype=float32))``."""
        ly = self.layer
        shapes = [[int(v) for v in p.shape] for p in self.func().params[:2]]
        bb = relax.BlockBuilder()
        data, weight = (relax.Var(n, relax.TensorType(s, self.dtype)) for n, s in zip(("data", "weight"), shapes))
        nhwc = self.layout == "NHWC"
        with bb.function("main", [data, weight]):
            with bb.dataflow():
                conv = bb.emit(relax.op.nn.conv2d(data, weight, strides=ly.stride, padding=ly.pad,
                                                  data_layout=self.layout, kernel_layout="OHWI" if nhwc else "OIHW",
                                                  out_dtype="float32"))
                out = bb.emit_output(relax.op.astype(conv, self.dtype))
            bb.emit_func_output(out)
        return bb.get()

    def pipeline_module(self, weight) -> tvm.IRModule:
        """:meth:`relax_module` ready for the model pipeline, ``weight`` bound as a model binds
        it (its layout changes fold at compile time)."""
        return for_inference(self.relax_module(), [weight], fp16=False, layout="NHWC")

    def torch_operands(self, data, weight):
        """torch's NCHW / OIHW views of the stored tensors (channels_last memory for NHWC)."""
        if self.layout == "NHWC":
            return data.permute(0, 3, 1, 2), weight.permute(0, 3, 1, 2)
        return data, weight

    def reference(self):
        def ref(data, weight):
            import torch

            x, w = self.torch_operands(torch.from_numpy(data.astype(np.float64)).cuda(),
                                       torch.from_numpy(weight.astype(np.float64)).cuda())
            y = torch.nn.functional.conv2d(x, w, stride=self.layer.stride, padding=self.layer.pad)
            return (y.permute(0, 2, 3, 1) if self.layout == "NHWC" else y).cpu().numpy()

        return ref


@dataclass
class Row:
    case: str
    winner: str = ""
    ms: float | None = None
    cudnn_ms: float | None = None
    ratio: float | None = None  # cuDNN time / ours: > 1 is faster than cuDNN
    family_ms: dict | None = None  # best time while tuning: tensor cores / CUDA cores / stock Dlight
    tflops: float | None = None
    tune_s: float | None = None
    error: str = ""
    trace: dict = field(default_factory=dict)  # --pipeline: side -> kernels of one call (bench_setup.kernel_trace)


FAMILIES = {"tensor cores": ("matmul_tc", "matmul_wgmma"), "CUDA cores": ("matmul",), "stock Dlight": ("dlight",)}


def family_best(results) -> dict:
    out = {}
    for family, kinds in FAMILIES.items():
        times = [r.latency_ms for r in results
                 if r.config.kind in kinds and r.latency_ms is not None and r.verified is not False]
        out[family] = min(times, default=None)
    return out


def flops(case: Case) -> float:
    ly = case.layer
    out = (ly.size + 2 * ly.pad - ly.kernel) // ly.stride + 1
    return 2.0 * case.batch * out * out * ly.cout * ly.cin * ly.kernel * ly.kernel


def run_case(case: Case, arch, topk: int, budget_ms: float, log) -> Row:
    func = case.func()
    t0 = time.perf_counter()
    tuned = tune_function(func, arch, topk, TuneOptions(check="winner", ref=case.reference(), progress=False))
    tune_s = time.perf_counter() - t0
    best = tuned.best
    for r in tuned.results:
        log(f"    {r.config}  {r.latency_ms if r.latency_ms is not None else '-'} ms verified={r.verified} "
            f"{(r.error or '')[:200]}")
    wl = Workload(best._func, tvm.cuda(0), seed=0)
    launch = best.module[function_name(best.module, best._func)]
    ms, cudnn_ms = time_against_cudnn(case, launch, wl.timing_arg_sets(arch.l2_bytes), wl.dev, budget_ms,
                                      best.latency_ms)
    return Row(case.name, repr(best.config), ms, cudnn_ms, cudnn_ms / ms, family_best(tuned.results),
               flops(case) / ms / 1e9, round(tune_s, 1))


def run_pipeline_case(case: Case, arch, topk: int, budget_ms: float, log) -> Row:
    """The layer as a one-layer model through :func:`fastdlight.relax.compile_model`."""
    wl = Workload(case.func(), tvm.cuda(0), seed=0)
    arg_sets = wl.timing_arg_sets(arch.l2_bytes)
    weight = arg_sets[0][1]
    mod = case.pipeline_module(weight)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex, _tuned, report = compile_model(mod, arch.target, topk=topk, progress=False)
    tune_s = time.perf_counter() - t0
    kernels = [e for e in report if e.latency_ms is not None]
    for e in report:
        log(f"    {e.function}: {e.status} {e.winner} {e.latency_ms} ms {e.config!r}")
    vm = relax.VirtualMachine(ex, tvm.cuda(0))
    got = vm["main"](arg_sets[0][0]).numpy().astype(np.float64)
    want = case.reference()(arg_sets[0][0].numpy(), weight.numpy())
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    if err > PIPELINE_TOLERANCE:
        raise AssertionError(f"pipeline output differs from torch's by {err:.3g} (relative to the largest value)")
    estimate = sum(e.latency_ms for e in kernels)
    ms, cudnn_ms = time_against_cudnn(case, lambda d, _w, _out: vm["main"](d), arg_sets, wl.dev, budget_ms,
                                      estimate)
    winner = "pipeline: " + ", ".join(f"{e.function} {e.config.kind if e.config else e.status} {e.latency_ms:.4f}"
                                      for e in kernels)
    trace = {}
    try:  # the kernels as the call runs them, beside their tuning times above
        trace = {"fastdlight": kernel_trace(lambda: vm["main"](arg_sets[0][0])),
                 "cuDNN": kernel_trace(cudnn_call(case, arg_sets[0]))}
    except Exception as e:  # noqa: BLE001 - a diagnostic: the row stands without it
        log(f"    no kernel trace: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
    for side, rows in trace.items():
        log(f"    {side} kernels: " + ", ".join(f"{k['kernel'][:60]} {k['us']} us x{k['launches']}" for k in rows))
    return Row(case.name, winner, ms, cudnn_ms, cudnn_ms / ms, None, flops(case) / ms / 1e9, round(tune_s, 1),
               trace=trace)


#: largest difference from torch's fp64 result, relative to its largest value, of a pipeline case
PIPELINE_TOLERANCE = 2e-2


def cudnn_call(case: Case, args):
    """torch's conv2d of the layer on the stored tensors ``args[:2]`` (NCHW views of NHWC memory)."""
    import torch

    x, w = case.torch_operands(*(torch.from_dlpack(a) for a in args[:2]))
    return lambda: torch.nn.functional.conv2d(x, w, stride=case.layer.stride, padding=case.layer.pad)


def time_against_cudnn(case: Case, launch, arg_sets, dev, budget_ms: float, estimate_ms: float):
    """Medians of ``launch(*args)`` and of torch's conv2d on the same stored tensors, each in
    CUDA graphs, inputs rotated, alternately in ``ROUNDS`` rounds: ``(ours ms, cuDNN ms)``."""
    import torch

    fns = [cudnn_call(case, args) for args in arg_sets]  # the same stored tensors as ours, rotated likewise
    for fn in fns:  # cudnn.benchmark picks its algorithm on the first calls, outside the graphs
        fn()
    torch.cuda.synchronize()
    ours, cudnn = [], []
    for _ in range(ROUNDS):  # alternate the two sides: GPU clocks drift over a run
        ours.append(time_graph(launch, arg_sets, dev, budget_ms, estimate_ms).median_ms)
        cudnn.append(time_torch_graph(fns, budget_ms, estimate_ms).median_ms)
    return float(np.median(ours)), float(np.median(cudnn))


def dry_run(case: Case, arch, topk: int, log, pipeline: bool = False) -> Row:
    """The candidates' kinds of the layer's function (``pipeline``: of each function the model
    pipeline makes of the layer)."""
    if pipeline:
        shape = [int(v) for v in case.func().params[1].shape]
        weight = tvm.runtime.empty(shape, case.dtype)  # values do not matter to the candidates
        funcs = prim_funcs(prepare(arch.target)(case.pipeline_module(weight)))
    else:
        funcs = {"conv": case.func()}
    found = []
    for name, func in funcs.items():
        sets = list(candidate_sets(func, arch, topk, stock_configs(func, arch)))
        kinds = sorted({c.kind for s in sets for c in s.configs})
        log(f"    {name}: {len(sets)} candidate sets, kinds {kinds}")
        found.append(f"{name} {'/'.join(kinds)}" if pipeline else ", ".join(kinds))
    return Row(case.name, winner="(dry run) " + "; ".join(found))


def markdown(rows: list[Row], device: str) -> str:
    lines = [
        f"Device: {device}. fastdlight's tuner vs cuDNN (torch conv2d, cudnn.benchmark, fp32 accumulation), "
        f"both in CUDA graphs, alternately in {ROUNDS} rounds (inputs rotated out of L2), medians.",
        "",
        "| case | winner | ms | TFLOPS | cuDNN ms | ratio | best tensor cores / CUDA cores / stock ms (tuning) | tune s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.error:
            lines.append(f"| {r.case} | FAILED: {r.error[:100]} | | | | | | |")
            continue
        fam = " / ".join(f"{v:.4f}" if v else "–" for v in (r.family_ms or {}).values())
        num = (lambda v, f: format(v, f) if v is not None else "–")
        lines.append(f"| {r.case} | {r.winner} | {num(r.ms, '.4f')} | {num(r.tflops, '.0f')} | {num(r.cudnn_ms, '.4f')} "
                     f"| {num(r.ratio, '.2f')}× | {fam} | {r.tune_s if r.tune_s is not None else '–'} |")
    return "\n".join(lines)


def cases(args) -> list[Case]:
    layers = held_out_layers(args.held_out, args.seed) if args.held_out else LAYERS
    out = [Case(ly, args.batch, layout, dtype) for ly in layers for layout in args.layouts for dtype in args.dtypes]
    return [c for c in out if not args.only or any(s in c.name for s in args.only)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--budget-ms", type=float, default=100.0)
    parser.add_argument("--layouts", nargs="+", default=["NHWC", "NCHW"], choices=["NHWC", "NCHW"])
    parser.add_argument("--dtypes", nargs="+", default=["float16"], choices=["float16", "bfloat16"])
    parser.add_argument("--only", nargs="*", help="substrings of case names to run")
    parser.add_argument("--pipeline", action="store_true", help="each layer as a one-layer model through the "
                        "Relax pipeline (im2col stem, NCHW via NHWC), timed as one VM call")
    parser.add_argument("--dry-run", action="store_true", help="candidates only; nothing built or timed (no GPU)")
    parser.add_argument("--held-out", type=int, default=0, metavar="N",
                        help="N convolutions of random geometry instead of ResNet-18's layers")
    parser.add_argument("--seed", type=int, default=None, help="of --held-out (default: from the clock, logged)")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = int(time.time())
    if not args.dry_run and not has_gpu():
        print("error: bench_conv needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    name = "bench_conv_pipeline" if args.pipeline else "bench_conv"
    out_dir, log = open_log(name)
    arch = auto_arch()
    device = f"{tvm.cuda(0).device_name} ({arch.arch}, {arch.sm_count} SMs)" if not args.dry_run else arch.name
    if not args.dry_run:
        import torch

        torch_fp32_accumulation()
        torch.backends.cudnn.benchmark = True
    log(f"device: {device}" + (f"; held-out shapes of seed {args.seed}" if args.held_out else ""))
    rows = []
    for case in cases(args):
        log(f"== {case.name}")
        try:
            if args.dry_run:
                row = dry_run(case, arch, args.topk, log, args.pipeline)
            else:
                run = run_pipeline_case if args.pipeline else run_case
                row = run(case, arch, args.topk, args.budget_ms, log)
        except Exception as e:  # noqa: BLE001 - report and go on with the next case
            row = Row(case.name, error=f"{type(e).__name__}: {e}")
            log(traceback.format_exc())
        rows.append(row)
        log(json.dumps(asdict(row)))
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump({"device": device, "rows": [asdict(r) for r in rows]}, f, indent=1)
    table = markdown(rows, device)
    log(table)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

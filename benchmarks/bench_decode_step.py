"""A LLaMA-style decode step (one token per sequence, a KV cache of L tokens; ``decode_step.py``)
per token: fastdlight against torch eager and torch with a static cache in a CUDA graph.

    python benchmarks/bench_decode_step.py [--model llama3_8b] [--lengths 512,2048,8192] [--batch 1] [--topk 20]
    python benchmarks/bench_decode_step.py --dry-run --small   # CPU: export (symbolic L), import, prepare

Per cache length L (LLaMA-3-8B's layer: dim 4096, 32 query and 8 key/value heads, FFN 14336;
``--model phi3_mini``: dim 3072, 32 heads of 96, FFN 8192; ``--model mqa``: LLaMA-3-8B's with one
key/value head):

* torch eager: ``DecodeStep`` in fp16 (the form fastdlight compiles), and ``StaticCacheStep``
  (the new key and value written into a preallocated cache, SDPA over its first L + 1), queued;
* torch graph: ``StaticCacheStep`` replayed from a CUDA graph (its writes repeat at position L);
* stock Dlight and fastdlight: ``DecodeStep`` exported once with the cache length symbolic,
  ``for_inference`` (fp16 in and out), built by TVM's pipeline / tuned by fastdlight with a
  kernel per length behind a dispatcher (``opt_shapes``: the lengths asked) and built: one
  module serves every length, run by the VM inside a CUDA graph. ``max_rel_err``: fastdlight's
  hidden state against torch's fp16 ``DecodeStep``, relative to its largest element.

Writes ``$OUT/bench_decode_step.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_setup import write_results  # noqa: E402

NAME = "bench_decode_step"
DEFAULT_LENGTHS = "512,2048,8192"
#: ``--model``'s layers (``decode_step.SHAPES``; named here, where torch is not imported yet)
MODELS = ("llama3_8b", "phi3_mini", "mqa")


def relax_module(model, example, symbolic: bool = False):
    """The step exported at ``example``'s shapes (``symbolic``: with the cache length a symbolic
    dimension), through ``for_inference`` (fp16 in and out); and the name of the cache length's
    variable in it (None when static)."""
    import torch
    from torch.export import Dim
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from fastdlight.relax import for_inference

    dynamic = None
    if symbolic:
        length = Dim("cache_len", min=2, max=1 << 20)
        dynamic = ({}, {2: length}, {2: length}, {}, {})
    with torch.no_grad():
        program = torch.export.export(model, example, dynamic_shapes=dynamic)
    mod, params = relax.frontend.detach_params(from_exported_program(program, keep_params_as_input=True))
    dim = mod["main"].params[1].ty.shape[2]
    return for_inference(mod, params["main"], fp16_io=True), (str(dim) if symbolic else None)


def torch_side(s, model, batch: int, length: int, row: dict):
    """torch's times at cache length ``length`` into ``row``; its fp16 output of ``DecodeStep``."""
    import torch
    from bench_models import BUDGET_MS

    import decode_step
    from fastdlight.measure.graph_timing import time_torch_graph
    from fastdlight.measure.timing import time_torch

    x, k, v, cos, sin = (t.half().cuda() for t in decode_step.inputs(s, batch, length))
    static = decode_step.build(s, decode_step.StaticCacheStep).half().cuda()
    static.load_state_dict(model.state_dict())
    big_k = torch.zeros(batch, s.kv_heads, length + 1, s.head_dim, dtype=torch.float16, device="cuda")
    big_v = torch.zeros_like(big_k)
    big_k[:, :, :length], big_v[:, :, :length] = k, v
    with torch.no_grad():
        ref = model(x, k, v, cos, sin)[0].float().cpu().numpy()
        row["torch_eager_ms"] = time_torch([lambda: model(x, k, v, cos, sin)], BUDGET_MS).median_ms
        step = lambda: static(x, big_k, big_v, cos, sin, length)  # noqa: E731
        row["torch_static_eager_ms"] = time_torch([step], BUDGET_MS).median_ms
        row["torch_static_graph_ms"] = time_torch_graph([step], BUDGET_MS, row["torch_static_eager_ms"]).median_ms
    return ref


class TvmSide:
    """The step's one module (the cache length symbolic) built by TVM's pipeline (stock Dlight)
    and tuned by fastdlight with a kernel per length behind a dispatcher."""

    def __init__(self, mod, dim: str, lengths, arch, topk: int, meta: dict):
        import tvm
        from tvm import relax

        from fastdlight.relax import compile_model

        self.dev, self.stock = tvm.cuda(0), None
        try:
            with arch.target, tvm.transform.PassContext(opt_level=3):
                self.stock = relax.VirtualMachine(tvm.compile(mod, target=arch.target), self.dev)
        except Exception as e:  # noqa: BLE001 - a row, not a crash
            meta["errors"]["stock"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
        t0 = time.perf_counter()
        ex, _tuned, report = compile_model(mod, arch, topk=topk, progress=False, opt_shapes={dim: list(lengths)},
                                           meta_database_dir=tempfile.mkdtemp(prefix="fastdlight_decode_"))
        meta["tune_s"] = round(time.perf_counter() - t0, 1)
        meta["winners"] = {w: sum(1 for e in report if e.winner == w) for w in ("fastdlight", "stock")}
        meta["stock_won"] = sorted(e.function for e in report if e.winner == "stock")
        meta["untuned"] = {e.function: e.error for e in report if e.status == "untuned"}
        meta["dispatch"] = {e.function: e.dispatch for e in report if e.dispatch}
        # winner, its time, stock Dlight's, ours at best (among the policy's first 4 and 8), config
        meta["functions"] = {e.function: [e.winner, _ms(e.latency_ms), _ms(e.stock_ms),
                                          [ms for _, ms in e.best_of_first], str(e.config)] for e in report}
        self.vm = relax.VirtualMachine(ex, self.dev)

    def run(self, s, batch: int, length: int, row: dict):
        """Stock's and fastdlight's times at ``length`` into ``row``; fastdlight's output."""
        import tvm
        from bench_models import time_vm

        import decode_step

        args = [tvm.runtime.tensor(t.half().numpy(), self.dev) for t in decode_step.inputs(s, batch, length)]
        if self.stock is not None:
            row["stock_ms"] = time_vm(self.stock, args, self.dev)
        out = self.vm["main"](*args)
        row["fastdlight_ms"] = time_vm(self.vm, args, self.dev)
        return out[0].numpy().astype("float32")


def run(s, batch: int, lengths, arch, topk: int) -> tuple[dict, list[dict]]:
    """(what the tuning did, a row per length)."""
    import numpy as np

    import decode_step

    model = decode_step.build(s)
    mod, dim = relax_module(model, decode_step.inputs(s, batch, lengths[0]), symbolic=True)
    meta = {"errors": {}}
    tvm_side = TvmSide(mod, dim, lengths, arch, topk, meta)
    model = model.half().cuda()
    rows = []
    for length in lengths:
        row = {"batch": batch, "length": length, "errors": {}}
        try:
            ref = torch_side(s, model, batch, length, row)
            out = tvm_side.run(s, batch, length, row)
            row["max_rel_err"] = float(np.abs(out - ref).max() / max(float(np.abs(ref).max()), 1e-6))
        except Exception as e:  # noqa: BLE001 - a row, not a crash
            row["errors"]["case"] = f"{type(e).__name__}: {e}"[:300]
        print(row, flush=True)
        rows.append(row)
    return meta, rows


def dry_run(s, batch: int, lengths, target: str) -> dict:
    """The CPU part: the step exported with a symbolic cache length, imported, prepared."""
    import decode_step
    from fastdlight.relax import prepare
    from fastdlight.relax.pipeline import prim_funcs

    t0 = time.perf_counter()
    mod, dim = relax_module(decode_step.build(s), decode_step.inputs(s, batch, lengths[0]), symbolic=True)
    return {"batch": batch, "cache_length": dim, "functions": len(prim_funcs(prepare(target)(mod))),
            "seconds": round(time.perf_counter() - t0, 1)}


def _ms(value):
    return None if value is None else round(value, 4)


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def markdown(rows: list[dict]) -> str:
    lines = ["| batch | L | max rel err | torch eager ms | torch static-cache eager ms | torch static-cache graph ms "
             "| stock Dlight ms | fastdlight ms | vs eager | vs static graph | vs stock |", "|" + "---|" * 11]
    def ms(value) -> str:  # (a side that failed: "-"; the reason is in the JSON's errors)
        return f"{value:.3f}" if value else "-"

    for r in rows:
        f = r.get("fastdlight_ms")
        err = f"{r['max_rel_err']:.1e}" if r.get("max_rel_err") is not None else "-"
        lines.append(
            f"| {r['batch']} | {r['length']} | {err} | {ms(r.get('torch_eager_ms'))} "
            f"| {ms(r.get('torch_static_eager_ms'))} | {ms(r.get('torch_static_graph_ms'))} "
            f"| {ms(r.get('stock_ms'))} | {ms(f)} | {_ratio(r.get('torch_eager_ms'), f)} "
            f"| {_ratio(r.get('torch_static_graph_ms'), f)} | {_ratio(r.get('stock_ms'), f)} |")
    return "\n".join(lines) + "\n\nRatios are the other side's time over fastdlight's (> 1: fastdlight faster).\n"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default=DEFAULT_LENGTHS, help="cache lengths L, comma-separated")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--topk", type=int, default=20)
    ap.add_argument("--model", choices=MODELS, default=MODELS[0],
                    help="the layer: LLaMA-3-8B's, Phi-3-mini's (head dim 96) or LLaMA-3-8B's with one K/V head")
    ap.add_argument("--small", action="store_true", help="a small layer (dim 256, 8/2 heads, FFN 512), for checks")
    ap.add_argument("--dry-run", action="store_true", help="CPU only: export, import, prepare")
    ap.add_argument("--target", default="nvidia/nvidia-h100", help="the target of --dry-run's prepare")
    args = ap.parse_args(argv)
    try:
        lengths = [int(v) for v in args.lengths.split(",")]
        if not lengths or min(lengths) < 1 or args.batch < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--lengths {args.lengths} and --batch {args.batch}: positive integers")
    args.lengths = lengths
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import decode_step
    except ImportError as e:
        print(f"error: bench_decode_step needs torch ({e})", file=sys.stderr)
        return 2
    s = decode_step.DecodeShape(dim=256, heads=8, kv_heads=2, ffn=512) if args.small else decode_step.SHAPES[args.model]
    if args.dry_run:
        print(dry_run(s, args.batch, args.lengths, args.target), flush=True)
        return 0
    import tvm

    from fastdlight.arch import CUDA, has_gpu

    if not has_gpu():
        print("error: bench_decode_step needs a CUDA GPU (--dry-run runs the CPU part)", file=sys.stderr)
        return 2
    from bench_setup import torch_fp32_accumulation

    torch_fp32_accumulation()
    arch = CUDA.from_device(tvm.cuda(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta, rows = run(s, args.batch, args.lengths, arch, args.topk)
    data = {"benchmark": NAME, "device": arch.device_name, "date": time.strftime("%Y-%m-%d"),
            "shape": vars(s), "tuning": meta, "rows": rows}
    write_results(NAME, data, f"{NAME}, {data['device']}, {data['date']}\n\n" + markdown(rows)
                  + f"\nOne module for every length (tuned in {meta.get('tune_s')} s; untuned: "
                  + f"{', '.join(meta.get('untuned', {})) or 'none'}).\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

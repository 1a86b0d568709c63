"""``torch.compile(model, backend="fastdlight")`` on zoo models (a CNN, an encoder, a decoder):
outputs against eager, the first compile in a fresh cache, the steady state against the Relax
path of the same tuned module, and a second process's time to its first result.

    python benchmarks/bench_torch_backend.py [--models resnet50,bert_base_2l,llama_gqa_2l] [--sizes quick]

Per model and size, in a process of its own with a fresh ``FASTDLIGHT_CACHE``:

* ``compile_s``: ``torch.compile(model, backend="fastdlight")`` to its first output (export,
  import, tuning into the cache's database, build, CUDA graph capture), on the fp16 model;
* ``max_rel_err``: that output against torch eager fp16, relative to the largest element;
* ``backend_ms``: a call of the compiled model in steady state, captured in a CUDA graph as
  ``bench_zoo`` times torch.compile's (the program's own graph, added to that one as a node;
  dynamo's guards and the Python of a call are not in it); ``relax_ms``: the same model through
  ``for_inference`` -> ``compile_model`` (every function a hit in the database the compile
  filled) -> VM in a CUDA graph, as ``bench_zoo`` times it; ``vs relax`` is their ratio (1.0:
  the backend costs nothing);
* ``queued_ms``: calls of the compiled model queued one after another (CUDA events, median):
  each one replay of the program's graph, plus dynamo's guards and the call's Python on the
  host, which a model shorter than them waits for;
* ``second_s``: a new process with the same cache, from ``torch.compile`` to its first output
  (no tuning: every function from the database); ``second_process_s`` the whole process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import zoo_models
from bench_setup import one_line, refusal, write_results
from bench_zoo import sizes_of

from fastdlight.torch_backend import register

NAME = "bench_torch_backend"
#: a CNN, an encoder and a decoder of the zoo
DEFAULT_MODELS = ("resnet50", "bert_base_2l", "llama_gqa_2l")


def first_result(name: str, size: str):
    """(fp16 model on the GPU, its inputs, compiled model, seconds from torch.compile to the
    first output, that output)."""
    import torch

    model = zoo_models.build(name).half().cuda()
    x = [t.half().cuda() if t.is_floating_point() else t.cuda() for t in zoo_models.MODELS[name].example_inputs(size=size)]
    torch._dynamo.reset()
    register()  # the name, where this source tree runs without the installed package's entry point
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled = torch.compile(model, backend="fastdlight")
        out = compiled(*x)
        torch.cuda.synchronize()
    return model, x, compiled, time.perf_counter() - t0, out


def relax_ms(name: str, size: str, model, dev) -> float:
    """The Relax path on the tuned database the backend filled (``FASTDLIGHT_CACHE``)."""
    import tvm
    from bench_models import time_vm
    from tvm import relax

    from fastdlight.arch import CUDA
    from fastdlight.relax import compile_model, for_inference
    from fastdlight.torch_backend.cache import database_dir

    spec = zoo_models.MODELS[name]
    mod, params = zoo_models.to_relax(zoo_models.export(name, size, model=zoo_models.build(name)))
    arch = CUDA.from_device(dev)
    ex, _, _ = compile_model(for_inference(mod, params, fp16_io=True), arch, meta_database_dir=database_dir(),
                             progress=False)
    vm = relax.VirtualMachine(ex, dev)
    x = [tvm.runtime.tensor(t.half().numpy() if t.is_floating_point() else t.numpy(), dev)
         for t in spec.example_inputs(size=size)]
    return time_vm(vm, x, dev)


def case(name: str, size: str, second: bool = True) -> dict:
    import torch
    import tvm
    from bench_models import BUDGET_MS
    from bench_setup import torch_fp32_accumulation

    from fastdlight.measure.graph_timing import time_torch_graph
    from fastdlight.measure.timing import time_torch

    torch_fp32_accumulation()
    row: dict = {"model": name, "size": size}
    model, x, compiled, row["compile_s"], out = first_result(name, size)
    with torch.no_grad():
        ref = model(*x).float()
        row["max_rel_err"] = float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
        row["queued_ms"] = time_torch([lambda: compiled(*x)], BUDGET_MS).median_ms
        row["backend_ms"] = time_torch_graph([lambda: compiled(*x)], BUDGET_MS, row["queued_ms"]).median_ms
    row["relax_ms"] = relax_ms(name, size, model, tvm.cuda(0))
    if not second:
        return row
    t0 = time.perf_counter()
    second = subprocess.run([sys.executable, __file__, "--second", f"{name}:{size}"], capture_output=True,
                            text=True, timeout=600, check=False)
    row["second_process_s"] = round(time.perf_counter() - t0, 2)
    lines = [line for line in second.stdout.splitlines() if line.startswith("{")]
    row["second_s"] = json.loads(lines[-1])["first_result_s"] if lines else None
    if second.returncode:
        row["error"] = (second.stderr.strip().splitlines() or ["the second process failed"])[-1][:200]
    return row


def markdown(rows: list[dict]) -> str:
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    lines = [("| model | size | max rel err | compile s (cold) | backend ms (graph) | relax ms | vs relax "
              "| backend ms (queued calls) | second process: s to first result (whole process) | error |"),
             "|" + "---|" * 10]
    for r in rows:
        ratio = r["relax_ms"] / r["backend_ms"] if r.get("relax_ms") and r.get("backend_ms") else None
        lines.append(f"| {r['model']} | {r['size']} | {f(r.get('max_rel_err'), '.1e')} | {f(r.get('compile_s'), '.1f')} "
                     f"| {f(r.get('backend_ms'), '.3f')} | {f(r.get('relax_ms'), '.3f')} | {f(ratio, '.2f')} "
                     f"| {f(r.get('queued_ms'), '.3f')} "
                     f"| {f(r.get('second_s'), '.1f')} ({f(r.get('second_process_s'), '.1f')}) | {r.get('error', '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--sizes", default="quick", help="quick (each model's first size), all, or a comma list")
    ap.add_argument("--no-second", action="store_true", help="leave out the second process")
    ap.add_argument("--second", help=argparse.SUPPRESS)  # NAME:SIZE, the second process
    args = ap.parse_args(argv)
    if args.second:
        name, size = args.second.split(":")
        print(json.dumps({"first_result_s": round(first_result(name, size)[3], 2)}))
        return 0
    names = [n for n in args.models.split(",") if n]
    error = refusal(NAME, names, zoo_models.MODELS, "model")
    if error:
        print(error, file=sys.stderr)
        return 2
    rows = []
    for name in names:
        for size in sizes_of(zoo_models.MODELS[name], args.sizes):
            os.environ["FASTDLIGHT_CACHE"] = tempfile.mkdtemp(prefix="fastdlight_backend_")
            try:
                rows.append(case(name, size, second=not args.no_second))
            except Exception as e:  # noqa: BLE001 - a row, not a crash
                rows.append({"model": name, "size": size, "error": one_line(e)})
            print(json.dumps(rows[-1]), flush=True)
    import tvm

    from fastdlight.arch import CUDA

    data = {"benchmark": NAME, "device": CUDA.from_device(tvm.cuda(0)).device_name, "date": time.strftime("%Y-%m-%d"),
            "rows": rows}
    write_results(NAME, data, f"{NAME}, {data['device']}, {data['date']}\n\n" + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

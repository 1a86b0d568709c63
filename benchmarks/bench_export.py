"""An exported kernel (C++ header + example program, no TVM) against the same kernel run by TVM.

    python benchmarks/bench_export.py [--rounds 7]

For each case (fp16 add 4096x8192, softmax 4096x4096, fp16 GEMM 4096^3 with fp32 sums): tune on
the GPU (top 4), export, build the example with the export's own nvcc command, then alternate
``--rounds`` times: the kernel timed through TVM (``fastdlight.measure.timing``: inputs rotated,
queued launches between CUDA events, median over 100 ms) and the example program (the same
method in C++). The ratio is the median of the example's medians over the median of TVM's (the
issue's target: within 5%); alternating keeps clock drift out of it. Writes export.md/.json/.log
under $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_setup import open_log  # noqa: E402

CASES = {
    "add_f16_4096x8192": lambda ops: ops.elementwise((4096, 8192), "float16", "add"),
    "softmax_f16_4096x4096": lambda ops: ops.softmax(4096, 4096, "float16"),
    "matmul_f16_4096_f32acc": lambda ops: ops.matmul(4096, 4096, 4096, "float16", layout="NT", acc_dtype="float32"),
}


def tvm_timer(func, config, arch):
    import tvm

    from fastdlight.compiler import build_task
    from fastdlight.compiler.compile import build
    from fastdlight.measure.timing import function_name, time_module
    from fastdlight.measure.workload import Workload

    with arch.target:
        mod = build_task.as_module(build_task.apply_template(func, config))
    built = build(mod, arch.target)
    lib = getattr(built, "mod", built)
    arg_sets = Workload(func, tvm.cuda(0), 0).timing_arg_sets(arch.l2_bytes)
    return lambda: time_module(lib, function_name(lib, func), arg_sets, tvm.cuda(0), budget_ms=100).median_ms


def example_runner(out_dir: str, name: str):
    command = json.load(open(os.path.join(out_dir, f"{name}.json")))["build_command"]
    subprocess.run(command, shell=True, cwd=out_dir, check=True, capture_output=True, timeout=600)
    exe = os.path.join(out_dir, f"{name}_example")

    def run() -> float:
        out = subprocess.run([exe], cwd=out_dir, capture_output=True, text=True, timeout=300).stdout
        if not out.strip().endswith("PASS"):
            raise RuntimeError(f"{name}: the example did not pass:\n{out[-2000:]}")
        return float(re.search(r"time: median ([\d.]+) ms", out)[1])

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    out_dir, log = open_log("export")

    from fastdlight.export import export
    from fastdlight import ops
    from fastdlight.arch import auto_arch

    arch = auto_arch()
    rows = []
    for case in args.cases.split(","):
        op = CASES[case](ops)
        with tempfile.TemporaryDirectory() as tmp:
            where = os.path.join(tmp, case)
            result = export(op.func, where, name=case, topk=4, ref=op.reference)
            tvm_ms, example_ms = [], []
            timer, example = tvm_timer(op.func, result.config, arch), example_runner(where, case)
            for _ in range(args.rounds):
                tvm_ms.append(timer())
                example_ms.append(example())
        row = {"case": case, "config": repr(result.config), "tvm_ms": statistics.median(tvm_ms),
               "exported_ms": statistics.median(example_ms), "tvm_runs": tvm_ms, "exported_runs": example_ms}
        row["exported_over_tvm"] = row["exported_ms"] / row["tvm_ms"]
        rows.append(row)
        log(f"{case}: {row['config']}: TVM {row['tvm_ms']:.4f} ms, exported {row['exported_ms']:.4f} ms, "
            f"ratio {row['exported_over_tvm']:.3f}; runs TVM {[round(t, 4) for t in tvm_ms]} "
            f"exported {[round(t, 4) for t in example_ms]}")
    lines = [f"# Exported kernels against TVM ({arch.name}), medians of {args.rounds} alternating rounds", "",
             "| case | config | TVM ms | exported ms | exported / TVM |", "|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['config']} | {r['tvm_ms']:.4f} | {r['exported_ms']:.4f} | {r['exported_over_tvm']:.3f} |"
              for r in rows]
    log("\n".join(lines))
    with open(os.path.join(out_dir, "export.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "export.json"), "w") as f:
        json.dump({"device": arch.name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

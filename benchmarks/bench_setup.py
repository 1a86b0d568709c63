"""What the GEMM benchmarks set up the same way: a log under ``$OUT`` and cuBLAS held to fp32
accumulation (as fastdlight's kernels accumulate), so the two sides compute the same thing."""

from __future__ import annotations

import os


def open_log(name: str):
    """``(out_dir, log)``: ``$OUT`` (or the current directory) and a ``log(msg)`` that prints and
    appends to ``{out_dir}/{name}.log``."""
    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    log_file = open(os.path.join(out_dir, f"{name}.log"), "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    return out_dir, log


def torch_fp32_accumulation() -> None:
    import torch

    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_tf32 = False

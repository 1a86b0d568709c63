"""Decode attention (one query token per sequence against a KV cache) through the model path,
against torch's ``scaled_dot_product_attention`` (its flash decoding), both in CUDA graphs.

    python benchmarks/bench_decode_attention.py [--cases b1_h32,b16_h32] [--topk 8] [--merge auto|kernel|step]
    python benchmarks/bench_decode_attention.py --paged 16 [--cases ...]
    python benchmarks/bench_decode_attention.py --list

Per case, ``CacheAttention`` (``softmax(q Kᵀ * scale) V`` with the query heads of a K/V head as
the rows of one matmul, the cache length symbolic) is exported with ``torch.export``, prepared
by ``for_inference`` (fp16 in and out), tuned at the case's length by ``compile_model`` (the
rewrite makes it the split-KV step: a chunk step whose last CTA a head merges where the chunks
are few, else the pair of chunk step and merge; ``--merge kernel|step``: one form always,
``FASTDLIGHT_DECODE_MERGE``) and run by the VM; torch runs SDPA on ``[B, H, 1, D]`` queries over
the ``[B, G, L, D]`` cache (``enable_gqa`` where G < H); both sides cycle through copies of the
inputs (the same tensors, shared by DLPack) so that no launch finds its cache in L2. TB/s: the
cache's bytes over the time. ``max_rel_err``: fastdlight against SDPA, relative to its largest
element. ``--paged N`` instead times the chunk step alone, tuned at each case's split count from
a contiguous cache and from a cache in pages of N tokens (a pool, a page table shuffled, the
lengths read at run time), both by the tuner's own timing. Writes
``$OUT/bench_decode_attention.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_setup import write_results

NAME = "bench_decode_attention"
#: name -> (batch, query heads, K/V heads, cache length, head dim)
CASES = {
    "b1_h32": (1, 32, 32, 4096, 128),
    "b16_h32": (16, 32, 32, 4096, 128),
    "b64_h32_2k": (64, 32, 32, 2048, 128),
    "b1_gqa_8k": (1, 32, 8, 8192, 128),
    "b4_gqa_8k": (4, 32, 8, 8192, 128),  # LLaMA-3-8B serving four sequences
    # head dims no power of two: Phi-3 mini's 96, Phi-2's 80
    "b1_phi3_d96": (1, 32, 32, 4096, 96),
    "b1_phi2_d80": (1, 32, 32, 2048, 80),
    # MQA: 32 query heads on one K/V head (rows in blocks of 8)
    "b8_mqa_8k": (8, 32, 1, 8192, 128),
}


def cache_attention_module():
    import torch
    from torch import nn

    class CacheAttention(nn.Module):
        """``q [B, G, R, D]`` (R query heads a K/V head) over ``k, v [B, G, L, D]``."""

        def forward(self, q, k, v):
            scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
            return torch.matmul(scores.float().softmax(dim=-1).to(q.dtype), v)

    return CacheAttention().eval()


def relax_module(model, example):
    """The module exported with the cache length symbolic, through ``for_inference``; and the
    length's variable name."""
    import torch
    from torch.export import Dim
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from fastdlight.relax import for_inference

    length = Dim("cache_len", min=2, max=1 << 20)
    with torch.no_grad():
        program = torch.export.export(model, example, dynamic_shapes=({}, {2: length}, {2: length}))
    mod, params = relax.frontend.detach_params(from_exported_program(program, keep_params_as_input=True))
    return for_inference(mod, params.get("main", []), fp16_io=True), str(mod["main"].params[1].ty.shape[2])


def run_case(name: str, arch, topk: int) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import tvm
    from bench_models import BUDGET_MS
    from tvm import relax

    from fastdlight.measure.graph_timing import time_graph, time_torch_graph
    from fastdlight.measure.timing import rotation_copies, time_launches, time_torch
    from fastdlight.relax import compile_model

    b, h, g, length, d = CASES[name]
    row = {"case": name, "batch": b, "heads": h, "kv_heads": g, "length": length, "head_dim": d, "errors": {}}
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=gen) for shape in
               ((b, g, h // g, d), (b, g, length, d), (b, g, length, d)))
    mod, dim = relax_module(cache_attention_module(), (q, k, v))
    t0 = time.perf_counter()
    ex, _tuned, report = compile_model(mod, arch, topk=topk, progress=False, opt_shapes={dim: [length]},
                                       meta_database_dir=tempfile.mkdtemp(prefix="fastdlight_decode_attn_"))
    row["tune_s"] = round(time.perf_counter() - t0, 1)
    row["winners"] = {e.function: e.winner for e in report}
    row["kernels"] = {e.function: (str(e.config), getattr(e.config, "warp", None), e.latency_ms) for e in report}
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    cache_bytes = 2 * b * g * length * d * 2
    # both sides cycle through copies of the inputs, so that no launch finds its cache in L2
    # (B1 with 8 K/V heads: 34 MB, less than an H200's L2)
    copies = rotation_copies(cache_bytes, arch.l2_bytes)
    sets = [[tvm.runtime.tensor(t.half().numpy(), dev) for t in (q, k, v)] for _ in range(copies)]
    out = vm["main"](*sets[0])
    out = (out if hasattr(out, "numpy") else out[0]).numpy().astype("float32")  # an exported graph's tuple
    estimate = time_launches(vm["main"], sets, dev, budget_ms=20).median_ms
    row["fastdlight_ms"] = time_graph(vm["main"], sets, dev, BUDGET_MS, per_launch_ms=estimate).median_ms
    with torch.no_grad():
        fns = [lambda q4=torch.from_dlpack(s[0]).reshape(b, h, 1, d), kt=torch.from_dlpack(s[1]),
               vt=torch.from_dlpack(s[2]): F.scaled_dot_product_attention(q4, kt, vt, enable_gqa=g < h) for s in sets]
        ref = fns[0]().reshape(b, g, h // g, d).float().cpu().numpy()
        eager = time_torch(fns, BUDGET_MS).median_ms
        row["torch_graph_ms"] = time_torch_graph(fns, BUDGET_MS, eager).median_ms
    row["input_copies"] = copies
    row["max_rel_err"] = float(np.abs(out - ref).max() / max(float(np.abs(ref).max()), 1e-6))
    row["fastdlight_tbs"] = cache_bytes / row["fastdlight_ms"] / 1e9
    row["torch_tbs"] = cache_bytes / row["torch_graph_ms"] / 1e9
    return row


def shape_of(row: dict) -> str:
    return f"B{row['batch']} H{row['heads']}/G{row['kv_heads']} L{row['length']} d{row['head_dim']}"


def markdown(rows: list[dict]) -> str:
    lines = ["| case | shape | max rel err | torch SDPA ms | fastdlight ms | vs torch | TB/s (ours / torch) | tune s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shape = shape_of(r)
        if r.get("fastdlight_ms") is None or r.get("torch_graph_ms") is None:
            lines.append(f"| {r['case']} | {shape} | - | - | - | - | - | {'; '.join(r['errors'].values())} |")
            continue
        lines.append(f"| {r['case']} | {shape} | {r['max_rel_err']:.1e} | {r['torch_graph_ms']:.4f} "
                     f"| {r['fastdlight_ms']:.4f} | {r['torch_graph_ms'] / r['fastdlight_ms']:.2f}x "
                     f"| {r['fastdlight_tbs']:.2f} / {r['torch_tbs']:.2f} | {r['tune_s']} |")
    return "\n".join(lines) + "\n"


def paged_case(name: str, arch, topk: int, page: int) -> dict:
    """The chunk step of case ``name`` tuned from a contiguous cache and from pages of ``page``
    tokens: each one's tuned time (ms), config and tuning seconds."""
    import fastdlight
    from fastdlight import ops
    from fastdlight.analysis.decode_attention import default_splits

    b, h, g, length, d = CASES[name]
    splits = default_splits(b, g, arch.sm_count, h // g)
    row = {"case": name, "batch": b, "heads": h, "kv_heads": g, "length": length, "head_dim": d,
           "page_size": page, "splits": splits, "errors": {}}
    for form, size in (("contiguous", 0), ("paged", page)):
        op = ops.decode_attention(b, g, h // g, length, d, splits=splits, appended=False, page_size=size)
        t0 = time.perf_counter()
        try:
            _results, best = fastdlight.tune(op.func, arch, topk=topk)
        except Exception as e:  # noqa: BLE001 - a cell, not a crash
            row["errors"][form] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
            continue
        row[f"{form}_ms"], row[f"{form}_config"] = best.latency_ms, str(best.config)
        row[f"{form}_tune_s"] = round(time.perf_counter() - t0, 1)
    if row.get("contiguous_ms") and row.get("paged_ms"):
        row["paged_vs_contiguous"] = round(row["contiguous_ms"] / row["paged_ms"], 3)
    return row


def paged_markdown(rows: list[dict]) -> str:
    lines = ["| case | shape | page | splits | contiguous ms | paged ms | paged vs contiguous | tune s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shape = shape_of(r)
        if "paged_vs_contiguous" not in r:
            lines.append(f"| {r['case']} | {shape} | {r.get('page_size', '-')} | {r.get('splits', '-')} | - | - | - "
                         f"| {'; '.join(r['errors'].values())} |")
            continue
        lines.append(f"| {r['case']} | {shape} | {r['page_size']} | {r['splits']} | {r['contiguous_ms']:.4f} "
                     f"| {r['paged_ms']:.4f} | {r['paged_vs_contiguous']:.2f}x "
                     f"| {r['contiguous_tune_s']} / {r['paged_tune_s']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of --list")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--merge", choices=("auto", "kernel", "step"), default="auto",
                    help="where the chunks are merged: the chunk step's last CTA where they are few (auto), "
                         "a kernel of their own, or the step always")
    ap.add_argument("--paged", type=int, default=0, metavar="N",
                    help="time the chunk step from a contiguous cache and from pages of N tokens instead")
    args = ap.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown or not names:
        ap.error(f"unknown case(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(CASES)}")
    if args.list:
        for c in names:
            print(c, "B{} H{} G{} L{} d{}".format(*CASES[c]))
        return 0
    from fastdlight.analysis.decode_attention import PAGE_SIZES

    if args.paged and args.paged not in PAGE_SIZES:
        ap.error(f"--paged {args.paged}: pages of {', '.join(map(str, PAGE_SIZES))} tokens")
    try:
        import torch  # noqa: F401
        import tvm

        from fastdlight.arch import CUDA, has_gpu
    except ImportError as e:
        print(f"error: {NAME} needs torch ({e})", file=sys.stderr)
        return 2
    if not has_gpu():
        print(f"error: {NAME} needs a CUDA GPU", file=sys.stderr)
        return 2
    arch = CUDA.from_device(tvm.cuda(0))
    os.environ["FASTDLIGHT_DECODE_MERGE"] = args.merge
    date = time.strftime("%Y-%m-%d")
    rows = []

    def save(echo: bool) -> None:  # after every case: a run cut short keeps the cases it finished
        if args.paged:
            data = {"benchmark": NAME, "device": arch.device_name, "date": date, "paged": rows}
            md = f"{NAME} --paged {args.paged}, {arch.device_name}, {date}\n\n" + paged_markdown(rows)
        else:
            data = {"benchmark": NAME, "device": arch.device_name, "date": date, "merge": args.merge, "rows": rows}
            md = f"{NAME} --merge {args.merge}, {arch.device_name}, {date}\n\n" + markdown(rows)
        write_results(NAME, data, md, echo=echo)

    for c in names:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rows.append(paged_case(c, arch, args.topk, args.paged) if args.paged else run_case(c, arch, args.topk))
        except Exception as e:  # noqa: BLE001 - a row, not a crash
            b, h, g, length, d = CASES[c]
            rows.append({"case": c, "batch": b, "heads": h, "kv_heads": g, "length": length, "head_dim": d,
                         "errors": {"case": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"}})
        print(rows[-1], flush=True)
        save(echo=False)
    save(echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Split-KV decode attention at fixed split counts (no tuning of the split): for each count, the
chunk step's configs each built, verified against the float64 reference and timed, as the pair
(chunk step, then the merge kernel) and as one step whose last CTA a head merges, beside torch's
``scaled_dot_product_attention``.

    python benchmarks/check_decode_splits.py [--only b1_h32 b16_h32] [--splits 17,26] [--forms pair,step]
        [--topk 4] [--rounds 5] [--round-ms 60] [--list]

The cases are ``bench_decode_attention``'s (one query token a head, the cache contiguous, no
appended token). Without ``--splits`` a case tries the default count
(:func:`~fastdlight.analysis.decode_attention.default_splits`), one and a half and twice it,
and one chunk where the batch's K/V heads fill the SMs twice. A pair's merge is the fastest of
its policy's configs (timed by the tuner); each config of the chunk step is timed with it in
one CUDA graph, both launches a replay, inputs rotated out of L2, torch in a CUDA graph too, in
alternating rounds (medians). A row a (split count, form, config): ms, TB/s of the cache, the
ratio to torch, registers, verdict. Writes ``$OUT/check_decode_splits.json`` and ``.md``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_decode_attention import CASES  # noqa: E402
from bench_setup import cases_to_run, gpu_arch, rounds_parser, run_cases, table, timed_rounds  # noqa: E402

NAME = "check_decode_splits"
FORMS = ("pair", "step")


def split_counts(batch: int, kv_heads: int, sm_count: int, rows: int = 1) -> list[int]:
    """The counts a case tries by default: the default, 1.5 and 2 times it, and one chunk where
    the (batch, K/V head) CTAs alone are two an SM."""
    from fastdlight.analysis.decode_attention import MAX_SPLITS, default_splits

    base = default_splits(batch, kv_heads, sm_count, rows)
    counts = {base, min(MAX_SPLITS, -(-3 * base // 2)), min(MAX_SPLITS, 2 * base)}
    if batch * kv_heads >= 2 * sm_count:
        counts.add(1)
    return sorted(counts)


def parse_list(text: str, allowed=None) -> list | str:
    """``text``'s comma-separated items (ints where ``allowed`` is None), or a one-line complaint."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if allowed is not None:
        bad = [t for t in items if t not in allowed]
        return f"{NAME}: unknown form(s) {bad}; known: {', '.join(allowed)}" if bad else items
    if not all(t.isdigit() and int(t) > 0 for t in items):
        return f"{NAME}: --splits takes positive integers, comma-separated (e.g. 17,26)"
    return [int(t) for t in items]


def graph_timer(launch, sets, dev, per_launch_ms: float):
    """``ms -> median ms`` of ``launch(*args)`` replayed from a CUDA graph over ``sets``."""
    from fastdlight.measure.graph_timing import time_graph

    return lambda ms: time_graph(launch, sets, dev, ms, per_launch_ms).median_ms


def best_merge(shape, arch):
    """The merge kernel of ``shape``'s pair: the fastest verified of its policy's configs."""
    from fastdlight.analysis.decode_attention import decode_combine_func
    from fastdlight.measure.timing import function_name
    from fastdlight.policies.decode_attention import decode_combine_configs
    from fastdlight.search.runner import apply_and_build

    func = decode_combine_func(shape)
    _, best = apply_and_build(func, decode_combine_configs(shape), arch, check="all", progress=False)
    return best.module[function_name(best.module, best._func)], str(best.config)


def form_timers(name: str, splits: int, form: str, arch, topk: int) -> tuple[list[dict], dict]:
    """Rows (one a config, timings to come) and their timers for one split count and form."""
    import tvm

    from fastdlight import ops
    from fastdlight.analysis.decode_attention import match_decode_split
    from fastdlight.measure.timing import function_name
    from fastdlight.measure.workload import Workload
    from fastdlight.policies.decode_attention import decode_attention_configs
    from fastdlight.search.runner import apply_and_build

    b, h, g, length, d = CASES[name]
    op = ops.decode_attention(b, g, h // g, length, d, splits=splits, appended=False, merged=form == "step")
    shape = match_decode_split(op.func)[0]
    configs = decode_attention_configs((shape, length), arch, topk=topk)
    built, _ = apply_and_build(op.func, configs, arch, check="all", budget_ms=10, progress=False)
    results = {r.config: r for r in built}
    wl = Workload(op.func, seed=1)
    sets = wl.timing_arg_sets(arch.l2_bytes)
    merge, merge_config = best_merge(shape, arch) if form == "pair" else (None, "")
    if merge is not None:  # the merge writes one output for every set
        out = tvm.runtime.empty(shape.out_shape, shape.dtype, wl.dev)
        sets = [list(s) + [out] for s in sets]
    rows, timers = [], {}
    for c in configs:
        r = results.get(c)
        tensor_cores = "mma.sync " if c.kind == "decode_attention_mma" else ""
        row = {"case": name, "splits": splits, "form": form,
               "config": tensor_cores + str(c).split("](", 1)[-1].rstrip(")"),
               "merge": merge_config, "registers": r.registers if r else None,
               "spill_bytes": r.spill_bytes if r else None, "verified": bool(r is not None and r.verified),
               "error": "" if r is not None and r.verified else (r.check_message if r is not None else "not built")}
        rows.append(row)
        if not row["verified"] or r.module is None:
            continue
        step = r.module[function_name(r.module, r._func)]
        if merge is None:
            launch = step
        else:
            def launch(*a, step=step):
                step(*a[:-1])
                merge(a[-4], a[-3], a[-2], a[-1])
        timers[(splits, form, row["config"])] = graph_timer(launch, sets, wl.dev, max(r.latency_ms or 0.01, 0.002))
    return rows, timers


def torch_timer(name: str, copies: int):
    import torch
    import torch.nn.functional as F

    from fastdlight.measure.graph_timing import time_torch_graph

    b, h, g, length, d = CASES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = [(torch.randn(b, h, 1, d, generator=gen, device="cuda", dtype=torch.float16),
             *(torch.randn(b, g, length, d, generator=gen, device="cuda", dtype=torch.float16) for _ in range(2)))
            for _ in range(copies)]
    fns = [lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=g < h) for q, k, v in sets]

    def run(ms: float) -> float:
        with torch.no_grad():
            return time_torch_graph(fns, ms, 0.01).median_ms

    return run


def run_case(name: str, arch, splits: list[int], forms: list[str], topk: int, rounds: int, round_ms: float):
    from fastdlight.measure.timing import rotation_copies

    b, h, g, length, d = CASES[name]
    cache_bytes = 2 * b * g * length * d * 2
    rows, timers = [], {}
    t0 = time.perf_counter()
    for s in splits or split_counts(b, g, arch.sm_count, h // g):
        for form in forms:
            got, more = form_timers(name, s, form, arch, topk)
            rows += got
            timers.update(more)
    build_s = round(time.perf_counter() - t0, 1)
    timers["torch"] = torch_timer(name, rotation_copies(cache_bytes, arch.l2_bytes))
    medians, errors = timed_rounds(timers, rounds, round_ms)
    torch_ms = medians.get("torch")
    for row in rows:
        key = (row["splits"], row["form"], row["config"])
        ms = medians.get(key)
        row["error"] = row["error"] or errors.get(key, "")
        row["ms"] = round(ms, 5) if ms else None
        row["tbs"] = round(cache_bytes / (ms * 1e-3) / 1e12, 3) if ms else None
        row["vs_torch"] = round(torch_ms / ms, 3) if ms and torch_ms else None
        print(f"  S={row['splits']:<3} {row['form']:<4} {row['config']:<42} {row['ms'] or '-':>9} ms "
              f"{row['tbs'] or '-':>6} TB/s {row['vs_torch'] or '-':>6}x {row['error']}", flush=True)
    rows.append({"case": name, "splits": None, "form": "torch SDPA", "config": "", "ms": round(torch_ms, 5) if torch_ms
                 else None, "tbs": round(cache_bytes / (torch_ms * 1e-3) / 1e12, 3) if torch_ms else None,
                 "vs_torch": 1.0, "error": errors.get("torch", ""), "build_s": build_s})
    print(f"  torch SDPA {rows[-1]['ms']} ms ({rows[-1]['tbs']} TB/s); build and verify {build_s} s", flush=True)
    return rows


def markdown(rows: list[dict], device: str) -> str:
    title = (f"{NAME}, {device}, {time.strftime('%Y-%m-%d')}: split-KV decode attention at fixed split counts "
             "against torch SDPA, CUDA graphs, inputs rotated out of L2, medians of alternating rounds")
    header = ["case", "splits", "form", "config", "ms", "TB/s", "vs torch", "registers", "verified", "error"]
    cells = [[r["case"], r.get("splits") or "-", r["form"], r.get("config") or "-",
              f"{r['ms']:.4f}" if r.get("ms") else "-", r.get("tbs") or "-",
              f"{r['vs_torch']:.3f}x" if r.get("vs_torch") else "-", r.get("registers") or "-",
              r.get("verified", "-"), r.get("error") or ""] for r in rows]
    return table(title, header, cells)


def main(argv=None) -> int:
    ap = rounds_parser(__doc__.splitlines()[0], round_ms=60.0)
    ap.add_argument("--splits", default="", help="split counts, comma-separated (default: a few around the default)")
    ap.add_argument("--forms", default=",".join(FORMS), help="pair (a merge kernel), step (merged in the step)")
    ap.add_argument("--topk", type=int, default=4, help="configs of the chunk step's policy a count and form")
    args = ap.parse_args(argv)
    splits, forms = parse_list(args.splits), parse_list(args.forms, FORMS)
    listing = "\n".join(f"{n}: B{c[0]} H{c[1]}/G{c[2]} L{c[3]} d{c[4]}" for n, c in CASES.items())
    names = cases_to_run(NAME, args, CASES, listing, (splits, forms))
    if isinstance(names, int):
        return names
    arch = gpu_arch()
    return run_cases(NAME, names, arch, lambda name: run_case(name, arch, splits, forms, args.topk, args.rounds,
                                                               args.round_ms), markdown)


if __name__ == "__main__":
    sys.exit(main())

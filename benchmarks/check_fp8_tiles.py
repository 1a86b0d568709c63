"""FP8 GEMMs at fixed wgmma tiles (no tuning), each verified and timed beside
``torch._scaled_mm`` in alternating rounds: for A/B of tiles and schedules the policy ranks
low or does not emit (ping-pong tiles in a cluster, for instance).

    python benchmarks/check_fp8_tiles.py [--only 4096³ ...] [--tiles 128x256 128x128/128+2 ...]
        [--rounds 6] [--list]

Tiles are spelled as for ``bench_energy``: ``BMxBN[/WM][+C[m|n]]`` (rows per consumer
warpgroup: ``BM`` is ping-pong, half of it cooperative; a cluster of C CTAs along M or N); the
stage ring is the policy's for the tile. Each case is ``ops.matmul_scaled`` (e4m3, per-tensor
scales, fp16 out), built and verified by ``apply_and_build`` against its float64 reference;
then every verified tile and ``torch._scaled_mm`` (fast accumulation, as ours) are timed in
CUDA graphs, inputs rotated out of L2, ``--rounds`` alternating rounds of 100 ms after 100 ms
of the same side untimed (medians). Writes ``$OUT/check_fp8_tiles.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_energy import BadTile, tile_config, tile_spec  # noqa: E402
from bench_quant import LLAMA  # noqa: E402
from bench_setup import cases_to_run, each_case, gpu_arch, write_case_results  # noqa: E402

NAME = "check_fp8_tiles"
CASES = {"4096³": (4096, 4096, 4096), "8192³": (8192, 8192, 8192),
         **{f"llama {p} 2048×{n}×{k}": (2048, n, k) for p, (n, k) in LLAMA.items()}}
#: the tuner's winners (128x256 cooperative, 256x128 in warpgroups of 128 rows), their clusters,
#: and ping-pong tiles alone and in clusters (a warpgroup's epilogue under the other's main loop)
TILES = ("128x256", "256x128/128", "128x256+2", "128x128/128", "128x128/128+2", "64x256/64+2")
ROUND_MS = 100.0


def tile_rows(name: str, specs, rounds: int, arch, log) -> list[dict]:
    from bench_gemm_hopper import paired_rounds
    from bench_quant import graph_timer, scaled_mm, torch_timer

    from fastdlight import ops
    from fastdlight.search.runner import apply_and_build

    m, n, k = CASES[name]
    flops = 2.0 * m * n * k
    op = ops.matmul_scaled(m, n, k, "float8_e4m3fn", "float16", "tensor")
    configs, refused = {}, []
    for spec in specs:
        try:
            configs.setdefault(repr(config := tile_config(spec, op.func, arch)), (spec, config))
        except BadTile as e:
            refused.append(str(e))
            log(f"  {e}")
    if not configs:
        raise RuntimeError(f"no tile of {', '.join(specs)} fits {name}")
    results, _ = apply_and_build(op.func, [c for _, c in configs.values()], arch, ref=op.reference, check="all")
    theirs = None
    rows = []
    for r in sorted(results, key=lambda r: r.index):
        row = {"case": name, "tile": configs[repr(r.config)][0], "config": repr(r.config), "verified": r.verified,
               "registers": r.registers, "failure": r.failure.message if r.failure else None}
        if r.ok and r.verified:
            theirs = theirs or torch_timer(scaled_mm(m, n, k), (m + n) * k, arch, r.latency_ms)
            ours_rounds, their_rounds = paired_rounds(graph_timer(r, arch), theirs, rounds, ROUND_MS, heat_ms=ROUND_MS)
            ours, torch_ms = (sorted(x)[len(x) // 2] for x in (ours_rounds, their_rounds))
            row.update(ms=round(ours, 4), torch_ms=round(torch_ms, 4), ratio=round(torch_ms / ours, 3),
                       tflops=round(flops / ours / 1e9), torch_tflops=round(flops / torch_ms / 1e9))
            log(f"  {row['tile']:>14} {ours:.4f} ms ({row['tflops']} TFLOPS) torch {torch_ms:.4f}: {row['ratio']:.3f}x")
        else:
            log(f"  {row['tile']:>14} not timed: {row['failure'] or 'not verified'}")
        rows.append(row)
    rows += [{"case": name, "tile": None, "refused": reason} for reason in refused]
    return rows


def markdown(rows: list[dict], device: str) -> str:
    lines = [f"check_fp8_tiles, {device}, {time.strftime('%Y-%m-%d')}: e4m3 GEMMs (per-tensor scales, fp16 out) at "
             "fixed tiles against torch._scaled_mm (fast accumulation), CUDA graphs, inputs rotated out of L2, "
             "medians of alternating rounds", "",
             "| case | tile | config | ms | torch ms | vs torch | TFLOPS | registers |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("tile") is None:
            lines.append(f"| {r['case']} | refused | {r['refused']} | | | | | |")
        elif "ms" in r:
            lines.append(f"| {r['case']} | {r['tile']} | {r['config']} | {r['ms']:.4f} | {r['torch_ms']:.4f} "
                         f"| {r['ratio']:.3f}x | {r['tflops']} | {r['registers']} |")
        else:
            lines.append(f"| {r['case']} | {r['tile']} | {r['config']} | {r['failure'] or 'not verified'} | | | | |")
    return "\n".join(lines) + "\n"


def _refusal(spec: str) -> str | None:
    """A one-line complaint about a malformed tile, or None."""
    try:
        tile_spec(spec)
    except argparse.ArgumentTypeError as e:
        return f"{NAME}: {e}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], help="case names (default: 4096³ and 8192³)")
    ap.add_argument("--tiles", nargs="+", default=list(TILES), help="BMxBN[/WM][+C[m|n]] ...")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    if not args.only and not args.list:
        args.only = ["4096³", "8192³"]
    names = cases_to_run(NAME, args, CASES, "\n".join(CASES), refusals=[_refusal(t) for t in args.tiles])
    if isinstance(names, int):
        return names
    arch = gpu_arch()
    if not arch.has_wgmma:
        print(f"{NAME}: {arch.arch} has no wgmma; the FP8 tiles need sm_90a", file=sys.stderr)
        return 2

    tiles = [t.strip().lower() for t in args.tiles]

    def one(name: str) -> list[dict]:
        print(f"[{name}]", flush=True)
        return tile_rows(name, tiles, args.rounds, arch, lambda msg: print(msg, flush=True))

    rows, errors = each_case(names, one)
    write_case_results(NAME, arch, rows, errors, markdown, tiles=args.tiles, rounds=args.rounds)
    return 0 if rows and not errors else 1


if __name__ == "__main__":
    sys.exit(main())

"""Is the 128x256 main loop bound by shared memory? Trace tiles whose TMA loads after the CTA's
first tile are skipped (stale stages: wrong results, the cycles of a main loop without TMA writes)."""
import json, os, re, sys
sys.path.insert(0, "benchmarks")
import trace_wgmma as tw
from bench_energy import tile_config, tile_spec
from bench_gemm_hopper import matmul_func

ORIG = tw.instrument

def patched(code, skip, stage_bytes, op_bytes):
    lines, n = [], 0
    for line in code.split("\n"):
        s = line.strip()
        if "cp_async_bulk_tensor_g2s" in s and any(f"(&({m}_map))" in s for m in skip):
            line = line.replace(s, f"if (k_it == 0) {{ {s} }}"); n += 1
        elif "mbarrier_arrive_expect_tx" in s and f"(uint){stage_bytes})" in s:
            left = stage_bytes - sum(op_bytes[m] for m in skip)
            line = line.replace(f"(uint){stage_bytes})", f"(uint)(k_it == 0 ? {stage_bytes} : {left}))"); n += 1
        lines.append(line)
    if skip:
        assert n >= 1 + len(skip), (n, skip)
    return "\n".join(lines)

def main():
    from fastdlight.arch import auto_arch
    arch = auto_arch()
    out = os.environ.get("OUT", "/tmp")
    cases = [((4096, 4096, 4096), "NT", t, skip) for t in ("128x256", "256x128", "128x192", "64x256")
             for skip in ((), ("B",), ("A", "B"))]
    res = []
    for shape, layout, tile, skip in cases:
        func = matmul_func(*shape, "float16", layout)
        cfg = tile_config(tile_spec(tile), func, arch)
        bm, bn = cfg.block
        ob = {"A": bm * 64 * 2, "B": bn * 64 * 2}
        sb = ob["A"] + ob["B"]
        tw.instrument = lambda code, first_launch=tw.WARM_LAUNCHES, skip=skip, sb=sb, ob=ob: ORIG(patched(code, skip, sb, ob), first_launch)
        try:
            recs = tw.trace(func, cfg, arch)
        except BaseException as e:  # noqa
            print("FAIL", tile, skip, repr(e)[:300], flush=True); continue
        ideal = tw.ideal_tile_cycles(shape, bm, bn)
        summ = tw.summarize(recs, ideal)
        w = summ[-1]["waves"]
        row = {"tile": tile, "skip": skip, "cfg": str(cfg), "cta_cycles": summ[-1]["cta_cycles"]["median"],
               "main_loop": {i: (v["main_loop"]["median"], v["main_loop"]["max"]) for i, v in w.items()},
               "epilogue": {i: v["epilogue"].get("median") for i, v in w.items()}}
        print(json.dumps(row), flush=True)
        res.append(row)
    json.dump(res, open(os.path.join(out, "smem_probe.json"), "w"), indent=1)

if __name__ == "__main__":
    main()

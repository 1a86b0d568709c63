"""Temporary: why the folded attention matmuls of llama_b1 fail on the GPU."""
import pathlib, sys, time
import tvm
from fastdlight.arch import auto_arch
from fastdlight.policies.wgmma import WgmmaPolicy, match_wgmma
from fastdlight.relax import for_inference, prepare
from fastdlight.relax.pipeline import prim_funcs
from fastdlight.tune.runner import apply_and_build

arch = auto_arch()
fixture = pathlib.Path("tests/relax/fixtures/llama_b1_s512.py")
mod = prepare(arch.target)(for_inference(tvm.script.from_source(fixture.read_text())))
funcs = prim_funcs(mod)
for name, func in sorted(funcs.items()):
    if "_view" not in name:
        continue
    m = match_wgmma(func)[0]
    print(name, m.a_view, m.b_view, flush=True)
    configs = WgmmaPolicy(func, arch).emit_config(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
    t = time.time()
    try:
        results, best = apply_and_build(func, configs, arch, check="all", budget_ms=5, progress=False, timeout=20)
    except Exception as e:
        print("FAILED", str(e)[:3000], flush=True)
        continue
    for r in results:
        print("  ", r.config, r.verified, r.error, r.check_message, getattr(r, "ms", None), flush=True)
    print("  took", time.time() - t, flush=True)

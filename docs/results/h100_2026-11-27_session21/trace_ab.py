"""trace_wgmma of 4096^3 NN 128x256 (and 256x128), with the chunked epilogue (old) and the batched one (new)."""
import os, sys
sys.path.insert(0, "benchmarks")
import trace_wgmma as tw
from fastdlight.schedules import matmul_wgmma as mw
out = os.environ["OUT"]
for tile in ("128x256", "256x128"):
    for name, on in (("old", False), ("new", True)):
        mw.BATCHED_EPILOGUE = on
        os.environ["OUT"] = os.path.join(out, f"trace_{tile}_{name}")
        os.makedirs(os.environ["OUT"], exist_ok=True)
        tw.main(["--shape", "4096", "4096", "4096", "--tile", tile])
        print(f"== {tile} {name}")
        print(open(os.path.join(os.environ["OUT"], "trace_wgmma.md")).read(), flush=True)

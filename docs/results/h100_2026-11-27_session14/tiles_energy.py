"""LLaMA down 4096x4096x11008 and o 2048x4096x4096: every large tile's time and energy at the power limit."""
import os, sys
sys.path.insert(0, "benchmarks")
import bench_energy as bench
w = bench.wgmma
bench.CASES = [
    ("LLaMA down 4096×4096×11008", (4096, 4096, 11008, "float16", "NN"),
     [w(128, 256, 64, group=8), w(128, 256, 64, 2, "m", 8), w(256, 128, 128, group=8), w(256, 128, 128, 2, "n", 8), w(192, 192, 64, group=8)]),
    ("LLaMA o 2048×4096×4096", (2048, 4096, 4096, "float16", "NN"),
     [w(128, 256, 64, group=8), w(256, 128, 128, group=8), w(256, 128, 128, 2, "n", 8)]),
]
sys.exit(bench.main(sys.argv[1:]))

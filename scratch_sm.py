import warnings
warnings.simplefilter("ignore")
from fastdlight import ops, apply_and_build
from fastdlight.arch import auto_arch
from fastdlight.policies.default import DefaultPolicy
from fastdlight.policies.config import Config
arch = auto_arch()
op = ops.softmax(512, 512, batch=64)
configs = DefaultPolicy(op.func, arch).emit_config(8) + [Config("dlight", (), arch=arch.arch)]
res, best = apply_and_build(op.func, configs, arch, check="winner", ref=op.reference)
for r in sorted(res, key=lambda r: r.latency_ms or 1e9):
    gbs = op.bytes / (r.latency_ms * 1e-3) / 1e9 if r.latency_ms else 0
    print(f"{r.latency_ms}  {gbs:.0f} GB/s  verified={r.verified}  {r.config}  {(r.error or '')[:80]}")

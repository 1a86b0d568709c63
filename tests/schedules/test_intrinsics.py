"""TVM's CUDA tensor intrinsics registered one by one in a build worker (``schedules.intrinsics``).

Each check runs in a fresh process: what is registered, and which module sits in ``sys.modules``,
is process state."""

import json
import subprocess
import sys

WORKER = """
import json, sys
import tvm
import tvm_ffi
from tvm.s_tir import TensorIntrin
from fastdlight import ops
from fastdlight.config import Config, StockSchedule
from fastdlight.schedules import intrinsics
from fastdlight.compiler import build_task
build_task.init_worker(cuda_only=True)
build_task.import_tensor_intrinsics()
has = lambda name: TensorIntrin.get(name, allow_missing=True) is not None
out = {"deferred": len(intrinsics.deferred()), "x86": "tvm.s_tir.tensor_intrin.x86" in sys.modules,
       "mma_before": has("mma_f16f16f32_trans_b")}
target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
func = ops.matmul(256, 256, 256, "float16", "float16", "NT", acc_dtype="float32").func
tc = Config("matmul_tc", block=(128, 128), warp=(64, 64), rstep=(32,), pipeline_stages=3, use_async_copy=True)
with target:
    out["tc_scheduled"] = build_task.apply_template(func, tc) is not None
out["registered_after_tc"] = 91 - len(intrinsics.deferred())
with target:
    out["dlight_scheduled"] = build_task.apply_template(func, StockSchedule("sm_90")) is not None
out["registered_after_dlight"] = 91 - len(intrinsics.deferred())
names = ["mma_f16f16f32_trans_b", "mma_ldmatrix_f16_a_dyn", "wmma_sync_16x16x16_f16f16f32_trans"]
out["hashes"] = {n: [tvm_ffi.structural_hash(f) for f in (TensorIntrin.get(n).desc, TensorIntrin.get(n).impl)]
                 for n in names if has(n)}
intrinsics.ensure_all()
out["left"] = len(intrinsics.deferred())
out["all_registered"] = has("wmma_fill_16x16x16_f16") and has("mma_ldmatrix_e5m2_b")
print(json.dumps(out))
"""

STOCK = """
import json
import tvm
import tvm_ffi
from tvm.s_tir import TensorIntrin
from fastdlight.schedules import intrinsics
from fastdlight.compiler import build_task
build_task.import_tensor_intrinsics()  # not a build worker: TVM's module as is
names = ["mma_f16f16f32_trans_b", "mma_ldmatrix_f16_a_dyn", "wmma_sync_16x16x16_f16f16f32_trans"]
print(json.dumps({"deferred": len(intrinsics.deferred()),
                  "hashes": {n: [tvm_ffi.structural_hash(f) for f in (TensorIntrin.get(n).desc, TensorIntrin.get(n).impl)]
                             for n in names}}))
"""


def _run(script: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_build_worker_registers_only_the_intrinsics_its_schedules_name():
    worker = _run(WORKER)
    assert worker["deferred"] == 91 and not worker["mma_before"] and not worker["x86"]
    assert worker["tc_scheduled"] and worker["registered_after_tc"] == 5  # one mma.sync group
    assert worker["dlight_scheduled"]  # Dlight's rule asks for its wmma group by name
    assert 5 < worker["registered_after_dlight"] <= 10
    assert worker["left"] == 0 and worker["all_registered"]
    # the same functions as TVM's own module registers
    stock = _run(STOCK)
    assert stock["deferred"] == 0
    assert worker["hashes"] == stock["hashes"] and len(stock["hashes"]) == 3

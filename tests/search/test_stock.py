"""Stock Dlight's schedule as a measured candidate: never slower than stock (CPU parts; the
measured comparison is a GPU test)."""

import dataclasses
import subprocess
import sys

import pytest
import tvm
from tvm.script import tirx as T

from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.config import Config, StockSchedule, config_from_dict
from fastdlight.measure.timing import Timing
from fastdlight.schedules import apply_config, default_schedule
from fastdlight.schedules.stock import rule_target
from fastdlight.search import candidates
from fastdlight.search.options import TuneOptions
from fastdlight.search.results import CompileResult

H100 = CUDA("nvidia/nvidia-h100")


def test_a_stock_schedule_is_validated_and_reads_well():
    c = StockSchedule("sm_90")
    assert c.is_stock and c.kind == "dlight" and repr(c) == "Config[dlight](sm_90)"
    assert config_from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="arch='sm_XY'"):
        StockSchedule("")
    with pytest.raises(ValueError, match="StockSchedule, not a tile Config"):
        Config("dlight", (1, 128), (1, 1))
    with pytest.raises(TypeError):
        Config("elementwise", (1, 128), (1, 1), arch="sm_90")


def test_a_stock_row_stored_as_a_tile_config_still_loads():
    # records written when stock Dlight's schedule was a Config with empty tiles
    old = {"kind": "dlight", "block": [], "thread": [], "rstep": [], "reduce_thread": [], "warp": [],
           "vectorize": {}, "pipeline_stages": 1, "use_async_copy": False, "rasterization": 0, "split_k": 1,
           "cluster": 1, "cluster_axis": "m", "arch": "sm_90a", "trace": "", "cost": 0.0}
    assert config_from_dict(old) == StockSchedule("sm_90a")
    with pytest.raises(ValueError, match="carries no tiles"):
        config_from_dict({**old, "block": [1, 128]})
    tile = {**old, "kind": "elementwise", "block": [1, 128], "thread": [1, 1], "arch": ""}
    assert config_from_dict(tile) == Config("elementwise", (1, 128), (1, 1))


def test_the_stock_template_gives_dlight_s_schedule_at_the_config_arch():
    f = ops.matmul(256, 256, 256, "float16", "float32").func
    for arch in ("sm_90a", "sm_90"):
        config = StockSchedule(arch)
        with H100.target:
            assert rule_target(config).attrs["arch"] == arch
            ours = apply_config(f, config).mod
        stock = default_schedule(f, tvm.target.Target({"tag": "nvidia/nvidia-h100", "arch": arch})).mod
        tvm.ir.assert_structural_equal(ours, stock)
    with H100.target:  # Dlight at sm_90 puts the matmul on tensor cores, at sm_90a it does not
        assert "mma" in apply_config(f, StockSchedule("sm_90")).mod.script()
        assert "mma" not in apply_config(f, StockSchedule("sm_90a")).mod.script()


def test_stock_configs_add_the_base_arch_only_where_dlight_would_use_tensor_cores():
    fp16_matmul = ops.matmul(256, 256, 256, "float16", "float32").func
    assert [c.arch for c in candidates.stock_configs(fp16_matmul, H100)] == ["sm_90a", "sm_90"]
    softmax = ops.softmax(256, 1024).func
    assert [c.arch for c in candidates.stock_configs(softmax, H100)] == ["sm_90a"]
    a100 = CUDA("nvidia/nvidia-a100")
    assert [c.arch for c in candidates.stock_configs(fp16_matmul, a100)] == ["sm_80"]
    # a convolution is not tensor-core eligible for our policy, but Dlight's Matmul rule puts it
    # on tensor cores at sm_90 (ResNet-18: 2x faster than at sm_90a), so both are measured
    conv = ops.conv2d_nhwc(16, 28, 28, 128, 128, dtype="float16", out_dtype="float32").func
    assert [c.arch for c in candidates.stock_configs(conv, H100)] == ["sm_90a", "sm_90"]


def test_stock_dlight_imports_the_tensor_intrinsics_only_where_it_tensorizes():
    """In the tuning process: comparing stock Dlight at sm_90 with sm_90a on a softmax must not
    import TVM's tensor intrinsics (seconds before a first build); an fp16 matmul at sm_90 is
    still tensorized (Dlight's rule imports them itself). A fresh process, so that no other test
    has imported them already."""
    code = """
import sys
from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.compiler import build_task
from fastdlight.config import StockSchedule
from fastdlight.search import candidates
arch = CUDA("nvidia/nvidia-h100")
assert [c.arch for c in candidates.stock_configs(ops.softmax(256, 1024).func, arch)] == ["sm_90a"]
assert "tvm.s_tir.tensor_intrin.cuda" not in sys.modules
with arch.target:
    sch = build_task.apply_template(ops.matmul(256, 256, 256, "float16").func, StockSchedule("sm_90"))
assert "mma_sync" in sch.mod.script() or "wmma" in sch.mod.script()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_stock_joins_the_first_set_ranked_last_or_comes_last_alone():
    f = ops.matmul(256, 256, 256, "float16", "float32").func
    stock = candidates.stock_configs(f, H100)
    merged = list(candidates.candidate_sets(f, H100, 2, stock))
    assert merged[0].policy == "TensorCorePolicy" and merged[0].configs[-2:] == stock
    policy_costs = [c.cost for c in merged[0].configs if not c.is_stock]
    assert min(c.cost for c in merged[0].configs[-2:]) > max(policy_costs)
    last = list(candidates.candidate_sets(f, H100, 2, stock, stock_last=True))
    assert [s.policy for s in last] == ["TensorCorePolicy", "DefaultPolicy", "stock Dlight"]
    assert not any(c.is_stock for s in last[:-1] for c in s.configs)


def test_a_function_no_policy_covers_is_measured_on_stock_alone():
    @T.prim_func(s_tir=True)
    def dynamic(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (n, 64), "float32")
        B = T.match_buffer(b, (n, 64), "float32")
        for i, j in T.grid(n, 64):
            with T.sblock("b"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = T.exp(A[vi, vj])

    with pytest.warns(UserWarning, match="measuring stock Dlight only"):
        (only,) = candidates.candidate_sets(dynamic, H100, 2, candidates.stock_configs(dynamic, H100))
    assert only.policy == "stock Dlight" and all(c.is_stock for c in only.configs)
    with pytest.raises(ValueError, match="symbolic"):  # and without stock, the reason surfaces
        list(candidates.candidate_sets(dynamic, H100, 2))


def _row(config, ms):
    return CompileResult(config, 0, timing=Timing.of([ms]))


def test_a_later_policy_must_be_faster_than_the_stock_winner_of_an_earlier_set():
    stock_cfg, ours = StockSchedule("sm_90"), Config("matmul", (64, 64), (4, 4), (16,))
    stock_won = candidates.Tuned(stock_cfg, "tuned", "TensorCorePolicy", (_row(stock_cfg, 1.0),), _row(stock_cfg, 1.0))
    slower = candidates.Tuned(ours, "tuned", "DefaultPolicy", (_row(ours, 2.0),), _row(ours, 2.0))
    faster = dataclasses.replace(slower, results=(_row(ours, 0.5),), best=_row(ours, 0.5))
    kept = candidates.faster_of(stock_won, slower)
    assert kept.config == stock_cfg and kept.stock.latency_ms == 1.0
    won = candidates.faster_of(stock_won, faster)
    assert won.config == ours and won.stock.latency_ms == 1.0  # the report still knows stock's time


@pytest.mark.gpu
def test_gpu_the_winner_is_never_slower_than_stock_dlight():
    arch = CUDA.from_device(tvm.cuda(0))
    f = ops.reduce((4096, 1024), "float16", "max").func  # Dlight is far behind here
    tuned = candidates.tune_function(f, arch, 4, TuneOptions(budget_ms=50))
    # stock Dlight was timed; far behind at the first pass, it was not timed again with the
    # finalists (so its time is a first pass's, the winner's a hot one's)
    stock = [r for r in tuned.results if r.config.is_stock and r.latency_ms is not None]
    assert stock
    assert tuned.best.verified and not tuned.best.config.is_stock
    assert tuned.best.latency_ms <= min(r.latency_ms for r in stock)


def test_a_tensor_core_matmul_gets_both_stock_configs_without_importing_intrinsics_here():
    """Choosing the stock candidates of an fp16 matmul must not import the tensor intrinsics
    into the tuning process (2-5 s before the first candidate can go to the build workers).
    A build worker sets TVM's CUDA ones aside to register as they are named, without the other
    targets' (the package's ``__init__``); fastdlight's own bf16/int8 ones are registered only
    for their dtype."""
    code = """
import sys
from fastdlight import ops
from fastdlight.arch import CUDA
from fastdlight.search.candidates import stock_configs
h100 = CUDA("nvidia/nvidia-h100")
fp16 = stock_configs(ops.matmul(512, 512, 512, "float16", "float16", "NT", acc_dtype="float32").func, h100)
imported = "tvm.s_tir.tensor_intrin.cuda" in sys.modules
fp32 = stock_configs(ops.matmul(512, 512, 512, "float32", "float32").func, h100)  # scheduled both ways: the same
print(len(fp16), len(fp32), imported)
"""
    worker = """
import sys
from fastdlight.compiler import build_task
from fastdlight.schedules import intrinsics
from fastdlight.schedules.matmul_tensorcore import register_intrinsics
from tvm.s_tir import TensorIntrin
build_task.init_worker(cuda_only=True)
build_task.import_tensor_intrinsics()
has = lambda name: TensorIntrin.get(name, allow_missing=True) is not None
print("mma_f16f16f32_trans_b" in intrinsics.deferred(), "tvm.s_tir.tensor_intrin.x86" in sys.modules, has("mma_ldmatrix_bf16_a_dyn"))
register_intrinsics("bfloat16")
print(has("mma_ldmatrix_bf16_a_dyn"), has("mma_ldmatrix_i8_a_dyn"))
"""
    for script, expected in ((code, ["2", "1", "False"]), (worker, ["True", "False", "False", "True", "False"])):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == expected

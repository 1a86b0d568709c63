"""benchmarks/bench_energy.py (CPU; the GPU, torch and NVML only on the GPU machine): how a
stretch turns the energy counter into power and energy a GEMM, and the table's ratios."""

import json
import os
import sys

import pytest

from fastdlight.arch import CUDA, auto_arch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_energy as bench  # noqa: E402


class FakeNvml:
    def __init__(self):
        self.reads = iter([1_000_000, 1_000_000 + 1_400])  # 1.4 J over the stretch

    def energy_mj(self):
        return next(self.reads)


class FakeClock:
    def mean(self, t0, t1):
        return 1500.0

    def power(self, t0, t1):
        return 698.0, 712.0

    def reasons(self, t0, t1):
        return {name: 0.5 if name == "sw_power_cap" else 0.0 for name in bench.CLOCK_REASONS}


def test_a_stretch_gives_power_energy_and_cycles_a_gemm(monkeypatch):
    calls = []

    def run(ms):
        calls.append(ms)
        return 0.2 if ms == bench.BATCH_MS else 9.9

    ticks = iter([10.0, 12.0])  # the timed stretch: 2 s
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(ticks))
    r = bench.stretch(run, 1.0, FakeNvml(), FakeClock())
    assert calls == [bench.LEAD_MS] + [bench.BATCH_MS] * 4  # the untimed lead-in, then 1 s of batches
    assert r["ms"] == 0.2 and r["w"] == 0.7  # 1.4 J in 2 s
    assert abs(r["mj_per_gemm"] - 0.14) < 1e-12 and r["kcycles_per_gemm"] == 300.0
    assert r["sampled_w"] == 698.0 and r["max_sampled_w"] == 712.0 and r["share_sw_power_cap"] == 0.5 and r["share_hw_slowdown"] == 0.0


def test_the_sampler_gives_each_reasons_share_and_the_highest_power_within_the_stretch():
    clock = bench.ClockSampler.__new__(bench.ClockSampler)  # no sampling thread: samples set by hand
    cap, slow = bench.CLOCK_REASONS["sw_power_cap"], bench.CLOCK_REASONS["hw_slowdown"]
    clock.samples = [(0.5, 1980, 100.0, 0), (1.0, 1400, 690.0, cap), (1.5, 1380, 705.0, cap | slow),
                     (2.0, 1410, 698.0, 0), (3.5, 1980, 900.0, slow)]  # the first and last: outside
    assert clock.mean(1.0, 2.0) == 1396.6666666666667
    assert clock.power(1.0, 2.0) == (2093.0 / 3, 705.0)
    shares = clock.reasons(1.0, 2.0)
    assert shares["sw_power_cap"] == 2 / 3 and shares["hw_slowdown"] == 1 / 3 and shares["hw_power_brake"] == 0.0


def test_the_table_gives_each_side_against_cublas():
    rows = [{"case": "4096³ NN", "sides": {
        "ours": {"ms": 0.2, "mhz": 1400.0, "w": 700.0, "mj_per_gemm": 140.0, "kcycles_per_gemm": 280.0},
        "cuBLAS": {"ms": 0.21, "mhz": 1300.0, "w": 700.0, "mj_per_gemm": 147.0, "kcycles_per_gemm": 273.0}}}]
    md = bench.markdown(rows, "H100", 3.0)
    assert "| 4096³ NN | ours | 0.2000 | 1400 | 700 | 140.0 | 280.0 | 1.050 | 0.952 | 1.026 | nan, nan | nan / nan / nan | nan | nan |" in md
    assert "| 4096³ NN | cuBLAS | 0.2100 | 1300 | 700 | 147.0 | 273.0 | 1.000 | 1.000 | 1.000 | nan, nan | nan / nan / nan | nan | nan |" in md
    rows[0]["sides"]["ours"].update(sampled_w=699.6, max_sampled_w=711.0, share_sw_power_cap=0.96, share_hw_slowdown=0.0,
                                    share_hw_power_brake=0.0, hot_ms=0.19, graph_ms=0.25)
    rows[0]["sides"]["cuBLAS"].update(hot_ms=0.2, graph_ms=0.2)
    md = bench.markdown(rows, "H100", 3.0, turns=4)
    assert "| 1.026 | 700, 711 | 0.96 / 0.00 / 0.00 | 1.053 | 0.800 |" in md and "4 turns" in md


def test_turns_flip_the_order_and_time_each_side_hot_and_in_a_graph(monkeypatch):
    order = []

    def side(name, ms):
        return bench.Side(name, lambda budget: ms * (0.9 if budget == bench.HOT_MS else 1.0),
                          lambda budget, est: order.append(("graph", name, est)) or ms * 1.1)

    def stretch(run, seconds, nvml, clock):
        order.append(("stretch", run(bench.BATCH_MS)))
        return {"ms": run(bench.BATCH_MS), "w": 700.0}

    monkeypatch.setattr(bench, "stretch", stretch)
    out = bench.take_turns([side("a", 1.0), side("b", 2.0)], 3, 1.0, None, None)
    assert [o[1] for o in order if o[0] == "stretch"] == [1.0, 2.0, 2.0, 1.0, 1.0, 2.0]
    assert ("graph", "b", 2.0) in order  # each graph sized by the side's own stretch
    assert out["turn_ms"] == {"a": [1.0] * 3, "b": [2.0] * 3}
    a = out["sides"]["a"]
    assert a["ms"] == 1.0 and a["hot_ms"] == 0.9 and abs(a["graph_ms"] - 1.1) < 1e-12 and a["w"] == 700.0


def test_a_tile_gets_the_policys_stages_group_and_cluster_axis():
    h100 = CUDA("nvidia/nvidia-h100")
    func = bench.matmul_func(2048, 12288, 4096, "float16", "NN")
    wide = bench.tile_config("256x192/128", func, h100)
    assert (wide.block, wide.warp, wide.pipeline_stages, wide.cluster) == ((256, 192), (128, 192), 3, 1)
    assert wide.rasterization == 8  # 8 rows of tiles: fewer than 32
    three = bench.tile_config("192x192", func, h100)  # 192 rows: three warpgroups of 64
    assert three.warp == (64, 192) and three.num_threads == 512 and three.pipeline_stages == 4
    tall = bench.tile_config("256x128/128+2", func, h100)
    assert (tall.cluster, tall.cluster_axis) == (2, "n")  # taller than wide: A shared, as the policy does
    assert bench.tile_config("256x128/128+2m", func, h100).cluster_axis == "m"
    assert bench.tile_config("128x256", func, h100).warp == (64, 256)
    # a tile spelled twice is one side
    assert bench.tile_configs(["128x256", "256x192/128", "128x256/64"], func, h100) == [
        bench.tile_config("128x256", func, h100), wide]


@pytest.mark.parametrize("spec,why", [
    ("96x96", "does not take tile 96x96"),
    ("128x256/0", "zero rows"),
    ("256x256/128", "does not take"),  # 256 accumulators a thread
    ("128x256+3", "tile 128x256\\+3: "),  # the Config type takes clusters of 1 or 2
])  # fmt: skip
def test_tiles_the_template_does_not_take_are_refused_in_one_line(spec, why):
    func = bench.matmul_func(2048, 12288, 4096, "float16", "NN")
    with pytest.raises(bench.BadTile, match=why) as e:
        bench.tile_config(spec, func, CUDA("nvidia/nvidia-h100"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv,message", [
    (["--tile", "128x256"], "--tile needs --shape"),
    (["--shape", "64", "64", "64"], "needs at least one --tile"),
    (["--shape", "0", "64", "64", "--tile", "128x256"], "must be positive"),
    (["--shape", "64", "64", "64", "--tile", "128by256"], "is not BMxBN"),
])  # fmt: skip
def test_bad_arguments_are_one_line_before_any_gpu_work(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.gpu
def test_one_gemm_of_your_own_runs_end_to_end_on_a_hopper_gpu(tmp_path, monkeypatch):
    """Two tiles (one spelled twice) and cuBLAS: each side checked, timed at the cap, hot and in
    a graph, and written out."""
    pytest.importorskip("torch")
    if not auto_arch().has_wgmma:
        pytest.skip("no wgmma on this GPU")
    try:
        bench.Nvml().energy_mj()
    except (OSError, RuntimeError) as e:
        pytest.skip(f"no NVML energy counter: {e}")
    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["--shape", "512", "512", "256", "--tile", "128x256", "--tile", "128x256/64", "--tile", "64x128/64",
            "--seconds", "0.25", "--turns", "2"]
    assert bench.main(argv) == 0
    (row,) = json.loads((tmp_path / "bench_energy.json").read_text())["rows"]
    assert len(row["sides"]) == 3 and "cuBLAS" in row["sides"]
    for side in row["sides"].values():
        assert side["ms"] > 0 and side["hot_ms"] > 0 and side["graph_ms"] > 0 and side["mj_per_gemm"] > 0
    assert all(len(turns) == 2 for turns in row["turn_ms"].values())

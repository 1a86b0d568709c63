"""The winner and stock Dlight are compared, and reported, on times measured the same way.

A fake GPU stands in for the timing functions: each kernel has a true time, which a CUDA graph
replay reads; queued launches read the host's launch pace instead while the host is busy (other
functions tuned at once), as on the H200 where GPT-2's ``fused_matmul1_cast5`` was reported at
0.0834 ms, won against stock Dlight's 0.0181, and the whole model ran in 0.12 ms.
"""

import pytest

from fastdlight.arch import CUDA
from fastdlight.config import Config, StockSchedule
from fastdlight.measure import graph_timing
from fastdlight.measure.timing import Timing
from fastdlight.relax import apply_fast_tuning
from fastdlight.search import stages
from fastdlight.search.candidates import Tuned
from fastdlight.search.options import TuneOptions
from fastdlight.search.results import CompileResult
from fastdlight.search.runner import verify_and_pick

H200 = CUDA("nvidia/nvidia-h200")
#: the host's pace per queued launch while other functions' threads hold the interpreter
BUSY_HOST_MS = 0.0834


class FakeGPU:
    """True kernel times by name; ``busy``: queued launches run at the host's pace."""

    def __init__(self, true_ms: dict[str, float]):
        self.true_ms, self.busy = true_ms, False
        self.uncapturable: set[str] = set()
        self.captures: list[str] = []
        self.graph_ms: list[float] = []
        self.graph_budgets: dict[str, list[float]] = {}
        self.closed: list[str] = []
        self.estimates = 0
        self.give_ups: dict[str, float | None] = {}

    def launch_estimate_ms(self, launch, arg_sets, dev):
        self.estimates += 1
        return self.true_ms[launch]

    def time_module(self, module, name, arg_sets, dev, budget_ms, method, flush, give_up_ms=None):
        ms = self.true_ms[module[name]]
        self.give_ups.setdefault(module[name], give_up_ms)  # the first pass's
        if give_up_ms is not None and ms > give_up_ms:
            return Timing.of([ms])  # the probe's one launch
        if self.busy:
            return Timing.of([max(ms, BUSY_HOST_MS)] * 5)
        return Timing.of([ms + 0.002] * 5)  # the launch cost a queued sample carries

    def graph(self, launch, arg_sets, dev, per_launch_ms, min_ms=graph_timing.MIN_GRAPH_MS):
        """Stands in for ``stages.LaunchGraph``: records each capture (with the length asked of
        its graph) and each timing's budget."""
        if launch in self.uncapturable:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures.append(launch)
        self.graph_ms.append(min_ms)
        return FakeGraph(self, launch)


class FakeGraph:
    def __init__(self, gpu: FakeGPU, launch: str):
        self.gpu, self.launch = gpu, launch

    def time(self, budget_ms):
        self.gpu.graph_budgets.setdefault(self.launch, []).append(budget_ms)
        return Timing.of([self.gpu.true_ms[self.launch]] * 5, graph=True)

    def close(self):
        self.gpu.closed.append(self.launch)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FakeWorkload:
    func, dev, args = None, None, []

    def timing_arg_sets(self, l2_bytes):
        return [[]]


@pytest.fixture
def gpu(monkeypatch):
    def install(true_ms):
        fake = FakeGPU(true_ms)
        monkeypatch.setattr(stages, "time_module", fake.time_module)
        monkeypatch.setattr(stages, "LaunchGraph", fake.graph)
        monkeypatch.setattr(stages, "launch_estimate_ms", fake.launch_estimate_ms)
        monkeypatch.setattr(stages, "function_name", lambda module, func: "main")
        monkeypatch.setattr(stages, "load_module", lambda art, arch: art)  # the "artifact" is the module
        monkeypatch.setattr(stages, "heat", lambda *args, **kwargs: 0.0)
        return fake

    return install


def row(index: int, config, kernel: str) -> CompileResult:
    return CompileResult(config, index, artifact={"main": kernel})


def ours(index: int) -> CompileResult:
    return row(index, Config("elementwise", (1, 64 << index), (1, 1), cost=float(index + 1)), f"ours{index}")


def tune(gpu: FakeGPU, rows, busy_first_pass=()) -> Tuned:
    """The first pass (``busy_first_pass``: kernels timed while the host is busy), the hot
    retime with the host busy, the pick: what ``apply_and_build`` and ``tune_function`` do."""
    timer = stages.Timer(H200, FakeWorkload, TuneOptions(budget_ms=30, screen_ms=10))
    measured = []
    for r in rows:
        gpu.busy = r.artifact["main"] in busy_first_pass
        measured.append(timer.measure(r))
    gpu.busy = True
    ranked, best = verify_and_pick(timer.retime_fastest(measured), FakeWorkload(), None, "none")
    return Tuned(best.config, "tuned", "TestPolicy", tuple(ranked), best, kernel=object())


def report(monkeypatch, tuned: Tuned) -> apply_fast_tuning.FunctionReport:
    """The pass's report entry for a function tuned as ``tuned``."""
    monkeypatch.setattr(apply_fast_tuning, "tune_function", lambda *args, **kwargs: tuned)
    monkeypatch.setattr(apply_fast_tuning, "is_symbolic", lambda func: False)
    _, entry, _ = apply_fast_tuning.ApplyFastTuning()._tune_one("fused_matmul1_cast5", None, H200, None)
    return entry


def test_a_winner_is_reported_beside_stock_timed_the_same_way(gpu, monkeypatch):
    """Our three kernels (6-8 us) beat stock Dlight's (18 us) in the first pass, from graphs;
    their hot turns ran while the host was busy. The turns are taken from graphs as the first
    pass's were (queued, they read the host's 83 us, over the 50 us graph threshold, and won as
    hot finalists against stock's first-pass 18 us), and stock Dlight takes the turns too."""
    fake = gpu({"ours0": 0.006, "ours1": 0.007, "ours2": 0.008, "stock": 0.018})
    tuned = tune(fake, [ours(0), ours(1), ours(2), row(3, StockSchedule("sm_90a"), "stock")])
    entry = report(monkeypatch, tuned)
    assert entry.winner == "fastdlight"
    assert entry.latency_ms == pytest.approx(0.006) and entry.stock_ms == pytest.approx(0.018)
    assert tuned.best.timing.hot and tuned.best.timing.graph
    assert tuned.stock.timing.hot and tuned.stock.timing.graph


def test_stock_timed_queued_first_is_retimed_and_wins(gpu, monkeypatch):
    """Stock Dlight (5 us) was timed first, while the host was busy: 83 us queued, no graph yet.
    Left out of the finalists it lost to our 10 us kernel's hot time, reported as 8x faster
    than stock; as a finalist it is timed from a graph like the others, and wins."""
    fake = gpu({"stock": 0.005, "ours1": 0.010, "ours2": 0.011, "ours3": 0.012})
    tuned = tune(fake, [row(0, StockSchedule("sm_90a"), "stock"), ours(1), ours(2), ours(3)], busy_first_pass=("stock",))
    entry = report(monkeypatch, tuned)
    assert entry.winner == "stock"
    assert entry.latency_ms == pytest.approx(0.005) == entry.stock_ms


def test_a_stock_time_taken_another_way_is_not_reported_as_stock_ms():
    """Where stock Dlight has only a time measured unlike the winner's (a first-pass one beside
    a hot winner), the report leaves stock_ms out rather than show numbers the pick never compared."""
    hot = Timing(0.006, (0.006,), hot=True, graph=True)
    winner = CompileResult(Config("elementwise", (1, 64), (1, 1)), 0, artifact={}, timing=hot)
    stock = CompileResult(StockSchedule("sm_90a"), 1, artifact={}, timing=Timing(0.018, (0.018,), graph=True))
    assert Tuned(winner.config, "tuned", "TestPolicy", (winner, stock), winner).stock is None
    stock = stock.replace(timing=Timing(0.018, (0.018,), hot=True, graph=True))
    assert Tuned(winner.config, "tuned", "TestPolicy", (winner, stock), winner).stock is stock


def queued_budgets(fake: FakeGPU, monkeypatch) -> list[float]:
    """The budgets of the queued timings to come, in order (the fake GPU times them)."""
    budgets = []

    def time_module(module, name, arg_sets, dev, budget_ms, method, flush, give_up_ms=None):
        budgets.append(budget_ms)
        return fake.time_module(module, name, arg_sets, dev, budget_ms, method, flush, give_up_ms)

    monkeypatch.setattr(stages, "time_module", time_module)
    return budgets


def test_once_timing_from_graphs_no_queued_launches_are_timed(gpu, monkeypatch):
    """The graph's timing is the one kept: once the run times from graphs, a few queued launches
    (:func:`launch_estimate_ms`) only size the graph; timed at the whole budget as well, they
    had taken half of a model's timing."""
    fake = gpu({"ours0": 0.006, "ours1": 0.007})
    budgets = queued_budgets(fake, monkeypatch)
    timer = stages.Timer(H200, FakeWorkload, TuneOptions(budget_ms=30, screen_ms=10))
    timer.measure(ours(0))  # short: from here on the run times from graphs
    second = timer.measure(ours(1))
    assert budgets == [10] and fake.estimates == 1
    assert second.timing.graph and fake.graph_budgets["ours1"] == [10]
    assert fake.closed == ["ours0", "ours1"]  # a screening graph is freed at once


def test_a_kernel_a_graph_cannot_hold_gets_a_whole_queued_timing(gpu, monkeypatch):
    fake = gpu({"ours0": 0.006, "ours1": 0.007})
    budgets = queued_budgets(fake, monkeypatch)
    fake.uncapturable.add("ours1")
    timer = stages.Timer(H200, FakeWorkload, TuneOptions(budget_ms=30, screen_ms=10))
    timer.measure(ours(0))
    second = timer.measure(ours(1))
    assert budgets == [10, 10]
    assert not second.timing.graph and second.latency_ms == pytest.approx(0.009)


def test_hot_turns_of_a_short_kernel_are_short_and_a_long_ones_take_the_budget(gpu, monkeypatch):
    fake = gpu({"ours0": 0.005, "ours1": 0.2})
    timer = stages.Timer(H200, FakeWorkload, TuneOptions(budget_ms=90, screen_ms=10))
    measured = [timer.measure(ours(0)), timer.measure(ours(1))]  # from graphs once ours0 was short
    fake.graph_budgets.clear()
    for r in measured:  # each the finalist of a retime of its own (1 is far behind 0)
        timer.retime_fastest([r])
    rounds = stages.RETIME_ROUNDS
    budgets = fake.graph_budgets
    assert budgets["ours0"] == [stages.HOT_MIN_MS / rounds] * rounds  # 3000 launches: 15 ms, under the floor
    assert [b for b in budgets["ours1"] if b != stages.OWN_HEAT_MS] == [90 / rounds] * rounds


def test_each_finalist_is_captured_once_for_all_its_hot_turns(gpu, monkeypatch):
    """A capture costs the host about as long as the replays it times: a finalist's graph is
    kept for its rounds (and its own heat), and freed when the turns end."""
    fake = gpu({"ours0": 0.005, "ours1": 0.0055, "ours2": 0.0056})
    timer = stages.Timer(H200, FakeWorkload, TuneOptions(budget_ms=90, screen_ms=10))
    measured = [timer.measure(ours(i)) for i in range(3)]
    # the first pass only picks finalists: its graphs are shorter than a hot turn's
    assert fake.graph_ms == [stages.SCREEN_GRAPH_MS] * 3 and stages.SCREEN_GRAPH_MS < graph_timing.MIN_GRAPH_MS
    fake.captures.clear(), fake.closed.clear(), fake.graph_ms.clear()
    hot = timer.retime_fastest(measured)
    assert sorted(fake.captures) == ["ours0", "ours1", "ours2"] and fake.graph_ms == [graph_timing.MIN_GRAPH_MS] * 3
    assert sorted(fake.closed) == sorted(fake.captures)
    assert all(r.timing.hot and r.timing.graph and len(r.timing.samples_ms) == 5 * stages.RETIME_ROUNDS for r in hot)


def test_a_finalist_a_graph_cannot_hold_is_timed_queued_in_its_turns(gpu, monkeypatch):
    fake = gpu({"ours0": 0.005, "ours1": 0.006})
    timer = stages.Timer(H200, FakeWorkload, TuneOptions(budget_ms=90, screen_ms=10))
    measured = [timer.measure(ours(0)), timer.measure(ours(1))]
    fake.uncapturable.add("ours1")
    hot = {r.index: r for r in timer.retime_fastest(measured)}
    assert hot[0].timing.graph and not hot[1].timing.graph and hot[1].timing.hot


def test_a_candidate_far_behind_the_fastest_is_timed_no_further_than_its_probe(gpu, monkeypatch):
    """Stock Dlight's schedule of a long attention runs 1000x slower than the template's (a
    second a launch, where the first pass's five samples, warm-up and probe took 16 of a
    25 s tune): once a candidate has been timed, each later one gives up after its probe when it
    is STOCK_FINALIST_BEHIND times slower; it is no finalist, and the winner is unchanged."""
    fake = gpu({"ours0": 2.0, "ours1": 2.2, "stock": 2000.0})
    tuned = tune(fake, [ours(0), ours(1), row(2, StockSchedule("sm_90a"), "stock")])
    assert fake.give_ups["ours0"] is None  # the first candidate: nothing to compare with yet
    first = 2.0 + 0.002  # its first-pass time (a queued sample carries the launch cost)
    assert fake.give_ups["ours1"] == fake.give_ups["stock"] == pytest.approx(first * stages.STOCK_FINALIST_BEHIND)
    stock = next(r for r in tuned.results if r.config.is_stock)
    assert stock.timing.samples_ms == (2000.0,) and not stock.timing.hot
    assert tuned.best.config == ours(0).config and tuned.best.timing.hot


def test_in_a_run_timed_from_graphs_a_candidate_far_behind_is_no_finalist(gpu, monkeypatch):
    """Once the run times from graphs, a candidate whose launch estimate is far behind gives up
    before its graph is captured, and is still compared (not kept as an unmeasured finalist)."""
    fake = gpu({"ours0": 0.006, "ours1": 0.007, "stock": 0.5})
    tuned = tune(fake, [ours(0), ours(1), row(2, StockSchedule("sm_90a"), "stock")])
    assert "stock" not in fake.captures
    stock = next(r for r in tuned.results if r.config.is_stock)
    assert stock.timing.samples_ms == (0.5,) and not stock.timing.hot
    assert tuned.best.config == ours(0).config


def test_in_a_graph_run_a_launch_longer_than_the_budget_is_timed_by_its_estimate(gpu):
    """A run timed from graphs (a short kernel met before) whose first candidate of a function is
    stock Dlight's naive attention, a second a launch: nothing to give up against yet, but its
    launch estimate outlasts the first pass's budget, so no graph is captured for it (capture,
    warm-up and five replays were seven more launches)."""
    fake = gpu({"stock": 1000.0, "ours1": 2.0})
    timer = stages.Timer(H200, FakeWorkload, TuneOptions(budget_ms=30, screen_ms=10))
    timer.graph = True
    stock = timer.measure(row(0, StockSchedule("sm_90a"), "stock"))
    assert "stock" not in fake.captures and stock.timing.samples_ms == (1000.0,) and stock.timing.graph
    timer.measure(ours(1))
    assert fake.captures == ["ours1"]


def test_finalists_far_behind_after_a_hot_round_take_no_more_turns():
    samples = {0: [1.0, 1.02], 1: [1.1], 2: [1.2, 1.16], 3: [], 4: [0.5]}
    assert stages.out_of_the_race(samples, failed={4: None}) == {2}  # 4 failed; 3 has no samples
    assert stages.out_of_the_race({0: [1.0]}, failed={}) == set()
    assert stages.out_of_the_race({}, failed={}) == set()


def test_the_first_passs_graph_sizing_and_input_copies_are_stages_of_their_own(gpu, monkeypatch):
    gpu({"ours0": 0.005, "ours1": 0.006})
    booked, stage = [], stages.clock.stage
    monkeypatch.setattr(stages.clock, "stage", lambda name: booked.append(name) or stage(name))
    timer = stages.Timer(H200, FakeWorkload, TuneOptions(budget_ms=30, screen_ms=10))
    timer.measure(ours(0))  # queued, then (a short kernel) from a graph
    timer.measure(ours(1))  # from a graph, sized by a few queued launches
    assert booked.count("time: input copies") == 1  # made once
    assert booked.count("time: estimate") == 1 and booked.count("time: capture") == 2

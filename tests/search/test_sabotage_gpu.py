"""Wrong kernels made the fastest candidates are rejected by verification, the next correct
candidate wins, and nothing wrong reaches the database (GPU)."""

import pytest
import standins

from fastdlight.arch import auto_arch
from fastdlight.config import Config
from fastdlight.search import candidates
from fastdlight.search.database import TuningDatabase
from fastdlight.search.options import TuneOptions
from fastdlight.search.runner import TuningError, apply_and_build

pytestmark = pytest.mark.gpu


def sabotage_configs(threads):
    return tuple(Config("elementwise", (1, t), (1, 1)) for t in threads)


@pytest.fixture(scope="module")
def arch():
    return auto_arch()


@pytest.mark.parametrize("variant_threads", [64, 128, 256, 512],
                         ids=["sign_flip", "broken_index", "dropped_edge_tile", "nan"])
def test_each_wrong_kernel_is_rejected_and_the_next_correct_one_wins(arch, variant_threads):
    func = standins.sabotage_matmul("correct", *standins.MATMUL_SHAPE)
    configs = sabotage_configs((2, variant_threads))
    results, best = apply_and_build(func, configs, arch, template=standins.sabotage_template, budget_ms=20)
    wrong = next(r for r in results if r.config.num_threads == variant_threads)
    assert wrong.latency_ms < best.latency_ms, "the wrong kernel must be the fastest for this test to mean anything"
    assert wrong.verified is False, wrong.check_message
    assert "of 65536 elements" in wrong.check_message  # says how many failed, of how many
    assert best.config.num_threads == 2 and best.verified is True


def test_all_wrong_fastest_kernels_are_rejected_and_never_stored(arch, tmp_path, monkeypatch):
    func = standins.sabotage_matmul("correct", *standins.MATMUL_SHAPE)
    configs = sabotage_configs((1, 2, 64, 128, 256, 512))
    monkeypatch.setattr(candidates, "candidate_sets",
                        lambda f, a, k, *_, **__: iter([candidates.CandidateSet("Sabotage", f, configs)]))
    db = TuningDatabase(tmp_path)
    opts = TuneOptions(template=standins.sabotage_template, budget_ms=20)
    tuned = candidates.tune_function(func, arch, 6, opts, db=db)
    by_threads = {r.config.num_threads: r for r in tuned.results}
    for t in (64, 128, 256, 512):
        assert by_threads[t].verified is False, (t, by_threads[t].check_message)
    assert tuned.best.config.num_threads in (1, 2) and tuned.best.verified is True
    record = db.lookup(func, arch)
    assert record is not None and record.config == tuned.best.config and record.verified is True
    assert len(db) == 1


def test_no_correct_candidate_means_no_winner_and_nothing_stored(arch, tmp_path, monkeypatch):
    func = standins.sabotage_matmul("correct", *standins.MATMUL_SHAPE)
    configs = sabotage_configs((64, 128, 256, 512))
    monkeypatch.setattr(candidates, "candidate_sets",
                        lambda f, a, k, *_, **__: iter([candidates.CandidateSet("Sabotage", f, configs)]))
    db = TuningDatabase(tmp_path)
    with pytest.raises(TuningError, match="4 × wrong result"):
        candidates.tune_function(func, arch, 4, TuneOptions(template=standins.sabotage_template, budget_ms=20), db=db)
    assert len(db) == 0

"""Config: the policy/template contract — printable, serializable, validated, hashable."""

import json

import pytest

from fastdlight.config import Config


def _matmul():
    return Config(
        kind="matmul",
        block=(128, 64),
        thread=(8, 4),
        rstep=(16,),
        vectorize={"B": 4, "A": 4},
        pipeline_stages=2,
        cost=12.5,
    )


def test_repr_is_readable():
    text = repr(_matmul())
    assert text == "Config[matmul](block=[128, 64], thread=[8, 4], rstep=[16], vec={A:4, B:4}, stages=2)"
    red = Config(kind="reduction", block=(4,), thread=(1,), rstep=(512,), reduce_thread=(64,))
    assert "rthread=[64]" in repr(red) and repr(red).startswith("Config[reduction]")
    tc = Config(kind="matmul_tc", block=(128, 128), warp=(64, 64), rstep=(32,), use_async_copy=True, rasterization=8)
    assert "warp=[64, 64]" in repr(tc) and "async" in repr(tc) and "raster=8" in repr(tc)


@pytest.mark.parametrize(
    "cfg",
    [
        _matmul(),
        Config(kind="elementwise", block=(1, 2048), thread=(1, 8), vectorize={"A": 8, "C": 8}),
        Config(kind="gemv", block=(8, 4), thread=(8, 1), rstep=(256,), reduce_thread=(32,), cost=3.0),
        Config(kind="matmul_tc", block=(128, 256), warp=(64, 64), rstep=(32,), pipeline_stages=3, rasterization=4),
    ],
)
def test_round_trip_through_dict_and_json(cfg):
    d = cfg.to_dict()
    assert isinstance(d["vectorize"], dict)
    back = Config.from_dict(d)
    assert back == cfg and back.cost == cfg.cost
    via_json = Config.from_dict(json.loads(json.dumps(d)))  # lists instead of tuples
    assert via_json == cfg and hash(via_json) == hash(cfg)
    assert via_json.block == cfg.block and isinstance(via_json.block, tuple)
    assert via_json.vectorize == cfg.vectorize and via_json.cost == cfg.cost


def test_identity_ignores_cost():
    a, b = _matmul(), Config(**{**_matmul().to_dict(), "cost": 99.0})
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert Config(**{**_matmul().to_dict(), "rstep": (32,)}) != a
    # vectorize order does not matter
    assert Config(kind="elementwise", block=(256,), thread=(8,), vectorize={"A": 8, "B": 8}) == Config(
        kind="elementwise", block=(256,), thread=(8,), vectorize=(("B", 8), ("A", 8))
    )


def test_derived_quantities():
    cfg = _matmul()
    assert cfg.threads_per_axis == (16, 16) and cfg.num_threads == 256 and cfg.num_warps == 8
    assert cfg.vector_width("A") == 4 and cfg.vector_width("Z", 1) == 1
    red = Config(kind="reduction", block=(4,), thread=(1,), rstep=(512,), reduce_thread=(64,))
    assert red.num_threads == 256
    tc = Config(kind="matmul_tc", block=(128, 128), warp=(64, 32), rstep=(32,))
    assert tc.num_threads == 8 * 32


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind="conv", block=(4,), thread=(1,)), "unknown config kind"),
        (dict(kind="elementwise", block=(), thread=()), "positive"),
        (dict(kind="elementwise", block=(0, 4), thread=(1, 1)), "positive"),
        (dict(kind="elementwise", block=(64,), thread=(3,)), "divide"),
        (dict(kind="elementwise", block=(64, 64), thread=(8,)), "rank"),
        (dict(kind="reduction", block=(4,), thread=(1,), rstep=(64,), reduce_thread=(8, 8)), "reduce_thread"),
        (dict(kind="reduction", block=(4,), thread=(1,), rstep=(0,)), "positive"),
        (dict(kind="matmul", block=(64, 64), thread=(8, 8), rstep=(16,), pipeline_stages=0), "pipeline_stages"),
        (dict(kind="elementwise", block=(64,), thread=(8,), vectorize={"A": 3}), "power of two"),
        (dict(kind="matmul_tc", block=(128, 128), warp=(48, 64), rstep=(32,)), "divide"),
        (dict(kind="matmul_tc", block=(128, 128), warp=(64, 64), rstep=()), "rstep"),
        (dict(kind="matmul_tc", block=(128,), warp=(64,), rstep=(32,)), r"block=\(I, J\)"),
    ],
)
def test_validation_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Config(**kwargs)


def test_from_dict_rejects_unknown_fields():
    d = _matmul().to_dict()
    d["tile"] = [1, 2]
    with pytest.raises(ValueError, match="unknown Config fields"):
        Config.from_dict(d)


def test_config_is_immutable():
    cfg = _matmul()
    with pytest.raises(Exception):
        cfg.block = (1, 1)  # frozen dataclass


def test_cluster_is_for_wgmma_configs_and_shows_in_the_repr():
    c = Config("matmul_wgmma", block=(128, 256), warp=(64, 256), rstep=(64,), pipeline_stages=4, cluster=2)
    assert "cluster=2" in repr(c) and Config.from_dict(c.to_dict()) == c
    along_n = Config("matmul_wgmma", block=(256, 128), warp=(128, 128), rstep=(64,), cluster=2, cluster_axis="n")
    assert "cluster_n=2" in repr(along_n) and Config.from_dict(along_n.to_dict()) == along_n != c
    for cluster, axis in ((1, "n"), (2, "k")):
        with pytest.raises(ValueError, match="cluster_axis"):
            Config("matmul_wgmma", block=(256, 128), warp=(128, 128), rstep=(64,), cluster=cluster, cluster_axis=axis)
    assert c != Config("matmul_wgmma", block=(128, 256), warp=(64, 256), rstep=(64,), pipeline_stages=4)
    for kind, cluster in (("matmul_tc", 2), ("matmul_wgmma", 3)):
        with pytest.raises(ValueError, match="cluster"):
            Config(kind, block=(128, 128), warp=(64, 64), rstep=(32,), cluster=cluster)

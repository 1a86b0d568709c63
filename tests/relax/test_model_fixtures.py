"""The Relax graphs of the benchmark's torch models (``benchmarks/bench_models.py
--export-fixtures``: TVMScript, weights as parameters), through fastdlight's pipeline without
torch (CPU): every function gets candidates, each set's best-ranked one scheduled by its own
template (never silently by the fallback), and one whole model tunes and builds with none left
untuned, its tuned kernels in the built model unchanged."""

import pathlib
import re
import warnings

import pytest
import tvm
from tvm import relax

import fastdlight
from fastdlight.analysis.matmul_match import anchor_key
from fastdlight.arch import CUDA
from fastdlight.compiler.build_task import lower_and_compile
from fastdlight.compiler.compile import compile_cubin, cuda_source
from fastdlight.policies.select import candidate_sets
from fastdlight.relax import for_inference, prepare
from fastdlight.relax.apply_fast_tuning import SELF, sibling_leaders
from fastdlight.relax.pipeline import leftovers, prim_funcs
from fastdlight.schedules import dispatch_config
from fastdlight.search.candidates import stock_configs

H100 = CUDA("nvidia/nvidia-h100")
FIXTURES = pathlib.Path(__file__).parent / "fixtures"
MODELS = sorted(p.stem for p in FIXTURES.glob("*.py"))


def prepared(name: str):
    mod = tvm.script.from_source((FIXTURES / f"{name}.py").read_text())
    return prepare(H100.target)(for_inference(mod, layout="NHWC" if "nhwc" in name else None))


def test_the_fixtures_are_there():
    assert {"mlp_gelu", "mlp_silu", "decoder_ln", "llama_b1_s512", "resnet18_nhwc_b16", "resnet18_nchw_b16"} <= set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_every_function_of_the_model_gets_fastdlight_candidates(name):
    funcs = prim_funcs(prepared(name))
    assert funcs
    for fname, func in funcs.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "no fastdlight template covers this function" fails
            sets = list(candidate_sets(func, H100, 4, stock_configs(func, H100)))
        assert sets and all(s.configs for s in sets), fname
        policy_configs = [c for s in sets for c in s.configs if not c.is_stock]
        assert policy_configs, f"{fname}: stock Dlight only"
        if fname.startswith("fused_conv2d"):  # NCHW included: convolutions have matmul configs
            assert any(c.kind in ("matmul", "matmul_tc") for c in policy_configs), fname
        for s in sets:  # each set's best-ranked config is scheduled by its own template, not the fallback
            top = next((c for c in s.configs if not c.is_stock and c.kind != "matmul_wgmma"), None)
            if top is not None:
                with H100.target:
                    dispatch_config(s.func, top, allow_fallback=False)


def test_a_decoder_layer_tunes_and_builds_with_nothing_untuned():
    mod = prepared("llama_b1_s512")
    tuning = fastdlight.ApplyFastTuning(topk=1, target=H100, measure=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = tuning(mod)
    assert [e.function for e in tuning.report if e.status == "untuned"] == []
    assert {e.function for e in tuning.report} == set(prim_funcs(mod))
    views = {e.function for e in tuning.report if e.status == "view"}
    assert views, "the flattening reshapes around the matmuls are views"
    src = cuda_source(fastdlight.build(tuned, H100.target))
    for name in prim_funcs(mod):
        assert f"{name}_kernel" in src, name
    # the views launch no kernel: lowering turns their calls into reshapes of the input
    with H100.target:
        lowered = relax.transform.RewriteDataflowReshape()(leftovers()(tuned))
    called = {v.name_hint for v in relax.analysis.all_global_vars(lowered["main"])}
    assert not views & called and set(prim_funcs(tuned)) - views <= called
    # the tuned kernels are what runs: a sample, compiled alone, is the model's kernel to the letter
    kernels = {n: f for n, f in prim_funcs(tuned).items() if n not in views}
    for name, func in sorted(kernels.items())[::3]:
        _, alone, _ = lower_and_compile(tvm.IRModule({name: func.with_attr("global_symbol", name)}), H100.target)
        assert _kernel(alone, name) is not None and _kernel(alone, name) == _kernel(src, name), name
    assert compile_cubin(src, H100.target).registers > 0  # the whole model's kernels, one nvcc run


def _kernel(source: str, name: str) -> str | None:
    """The definition of kernel ``{name}_kernel`` in CUDA ``source``."""
    head = r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?' + re.escape(name) + r"_kernel\([^)]*\) \{"
    found = re.search(head + r".*?\n}\n", source, re.S)
    return found.group(0) if found else None


def test_resnet_layers_with_and_without_the_residual_add_are_siblings():
    """Each convolution that occurs with two epilogues is tuned once in full; its other variants
    follow it, and no two different convolutions are paired."""
    funcs = prim_funcs(prepared("resnet18_nhwc_b16"))
    names = sorted(funcs)
    leaders = sibling_leaders([funcs[n] for n in names])
    pairs = [(names[i], names[lead]) for i, lead in enumerate(leaders) if lead not in (None, SELF)]
    assert {names[i] for i, lead in enumerate(leaders) if lead == SELF} == {leader for _, leader in pairs} | {
        n for n in names if ("conv" in n or "matmul" in n) and n not in {f for f, _ in pairs}}
    assert len(pairs) >= 4
    conv = re.compile(r"fused_(conv2d\d*)_")
    for follower, leader in pairs:
        assert conv.match(follower).group(1) == conv.match(leader).group(1) and follower != leader
        assert anchor_key(funcs[follower]) == anchor_key(funcs[leader])
    assert all(anchor_key(f) is None for n, f in funcs.items() if "conv" not in n and "matmul" not in n)

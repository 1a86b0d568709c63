"""torch.compile(model, backend="fastdlight"): graphs through Relax to a callable, on the CPU
(TVM's default pipeline) and, marked gpu, through fastdlight's tuning on CUDA."""

import importlib.metadata
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from torch._dynamo.backends.registry import lookup_backend  # noqa: E402 - after the torch check

from fastdlight.arch import CUDA  # noqa: E402
from fastdlight.torch_backend import EagerFallbackWarning, backend  # noqa: E402
from fastdlight.torch_backend.dynamo import CompiledGraph  # noqa: E402
from fastdlight.torch_backend.graph import host_fp32  # noqa: E402
from fastdlight.torch_backend.runtime import GraphReplay, LentOutputs, Program, Settings, tuning_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class SmallCNN(nn.Module):
    """conv, BatchNorm, relu6, max and adaptive average pooling, linear."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool, self.head = nn.AdaptiveAvgPool2d(1), nn.Linear(32, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.nn.functional.relu6(self.bn(self.conv1(x))), 2)
        x = torch.nn.functional.relu6(self.conv2(x))
        return self.head(torch.flatten(self.pool(x), 1))


class Lgamma(nn.Module):
    """``lgamma`` has no conversion in TVM 0.27's exported-program importer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.lgamma(self.fc(x).abs() + 1)


def _model(cls, seed=0):
    torch.manual_seed(seed)
    model = cls().eval()
    if isinstance(model, SmallCNN):  # running statistics that are not the identity
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def _through_backend(model, *inputs, options=None):
    """What :func:`backend` returns for the graph of ``model(*inputs)``, and the example inputs
    dynamo gave it. Called inside dynamo's compile, as torch calls it: dynamo drops the
    placeholders' sources (which tell weights from activations) once the graph is compiled."""
    seen = []

    def capture(gm, example_inputs):
        seen.append((backend(gm, example_inputs, options=options), list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture)(*inputs)
    assert len(seen) == 1, "the test models compile to one graph"
    return seen[0]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_fallback():
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        yield


@pytest.mark.parametrize("cls, shape", [(MLP, (4, 32)), (SmallCNN, (2, 3, 16, 16))])
def test_graph_compiles_to_a_program_matching_eager(cls, shape, no_fallback):
    model = _model(cls)
    x = torch.randn(shape)
    compiled, example_inputs = _through_backend(model, x)
    assert isinstance(compiled, CompiledGraph) and isinstance(compiled.static, Program)
    assert compiled.static.device.type == "cpu"
    assert len(compiled.sig.activations) == 1  # parameters and BatchNorm's statistics are constants
    with torch.no_grad():
        (out,) = compiled(*example_inputs)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)


def test_torch_compile_by_name_matches_eager(no_fallback):
    model = _model(SmallCNN)
    fast = torch.compile(model, backend="fastdlight")
    with torch.no_grad():
        for seed in range(2):  # the second call runs the program compiled by the first
            x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)


class AttentionThenView(nn.Module):
    """Causal SDPA, heads merged, then ``view`` as Hugging Face's GPT-2 ``Conv1D`` does."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, q, k, v):
        b, h, t, d = q.shape
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, h * d).contiguous()
        return self.proj.weight @ y.view(-1, h * d).t()


def test_a_view_after_attention_imports_at_batch_4(no_fallback):
    """Decomposed, the attention's output has other strides than in eager and export dropped the
    ``contiguous()``: the plain importer raises "Cannot view a tensor ..." at batch 4."""
    model = _model(AttentionThenView)
    q, k, v = (torch.randn(4, 2, 16, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    fast = torch.compile(model, backend="fastdlight")
    with torch.no_grad():
        torch.testing.assert_close(fast(q, k, v), model(q, k, v), rtol=1e-4, atol=1e-5)


def test_a_new_shape_compiles_again(no_fallback):
    model = _model(MLP)
    fast = torch.compile(model, backend="fastdlight")
    with torch.no_grad():
        for batch in (4, 7, 3, 7):  # 7: dynamo traces symbolic sizes; each value gets a program
            x = torch.randn(batch, 32)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)


def test_half_model_runs_in_fp16(no_fallback):
    model = _model(MLP).half()
    x = torch.randn(4, 32).half()
    with torch.no_grad():
        out = torch.compile(model, backend="fastdlight")(x)
        assert out.dtype == torch.float16
        torch.testing.assert_close(out, model(x), rtol=1e-2, atol=1e-2)


def test_bf16_model_runs_in_fp32_and_answers_in_bf16(no_fallback):
    model = _model(MLP).bfloat16()
    x = torch.randn(4, 32).bfloat16()
    with torch.no_grad():
        out = torch.compile(model, backend="fastdlight")(x)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)


class Casts(nn.Module):
    """An fp32 island in an fp16 model, and a tensor made on the input's device: dtypes and
    devices dynamo writes into the graph as constants."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x).float().softmax(-1).to(x.dtype)
        return y + torch.arange(8, device=x.device, dtype=x.dtype)


def test_dtype_and_device_constants_of_a_half_model(no_fallback):
    model = _model(Casts).half()
    x = torch.randn(4, 8).half()
    with torch.no_grad():
        out = torch.compile(model, backend="fastdlight")(x)
        assert out.dtype == torch.float16
        torch.testing.assert_close(out, model(x), rtol=1e-2, atol=1e-2)


def test_host_fp32_copy_moves_constants_and_leaves_the_graph_alone():
    def f(x):
        return x.to(torch.float16) + torch.full_like(x, 1.0, device=torch.device("cuda"), dtype=torch.bfloat16)

    gm = torch.fx.symbolic_trace(f)  # traced, not run: no GPU needed
    copy = host_fp32(gm)
    constants = [v for n in copy.graph.nodes for v in [*n.args, *n.kwargs.values()]
                 if isinstance(v, (torch.device, torch.dtype))]
    assert set(constants) == {torch.device("cpu"), torch.float32}
    assert torch.device("cuda") in gm.graph.find_nodes(op="call_function", target=torch.full_like)[0].kwargs.values()
    out = copy(torch.randn(4))
    assert out.dtype == torch.float32 and out.device.type == "cpu"


def test_fp16_option_keeps_an_fp32_model_s_dtypes(no_fallback):
    model = _model(MLP)
    x = torch.randn(4, 32)
    with torch.no_grad():
        out = torch.compile(model, backend="fastdlight", options={"fp16": True})(x)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, model(x), rtol=1e-2, atol=1e-2)


def test_unimportable_op_runs_eagerly_with_one_warning():
    model = _model(Lgamma)
    fast = torch.compile(model, backend="fastdlight")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(4, 8)
            torch.testing.assert_close(fast(x), model(x))
    fallbacks = [w for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in fallbacks]
    assert "aten.lgamma.default" in str(fallbacks[0].message)
    assert fallbacks[0].filename == __file__  # it points at the caller's line, not at torch's


def test_fallback_false_raises():
    with pytest.raises(Exception, match="lgamma"):
        _through_backend(_model(Lgamma), torch.randn(4, 8), options={"fallback": False})


def test_autograd_runs_eagerly_with_a_warning():
    model = _model(MLP)
    x = torch.randn(4, 32)
    with pytest.warns(EagerFallbackWarning, match="no_grad"):
        out = torch.compile(model, backend="fastdlight")(x)
    assert out.requires_grad  # eager: gradients still flow
    torch.testing.assert_close(out, model(x))


def test_in_place_update_of_an_input_runs_eagerly():
    def bump(x, y):
        x.add_(1)
        return x * y

    a, b = torch.randn(4), torch.randn(4)
    expected = (a + 1) * b
    with pytest.warns(EagerFallbackWarning, match="in place"), torch.no_grad():
        out = torch.compile(bump, backend="fastdlight")(a, b)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(a, expected / b)  # the update happened


@pytest.mark.parametrize("options, match", [({"no_such_option": 1}, "no_such_option"),
                                            ({"meta_database_dir": "x"}, "database"),
                                            ({"target": "cuda"}, "device"),
                                            ({"fp16": "yes"}, "fp16")])
def test_bad_options_are_refused(options, match):
    with pytest.raises(Exception, match=match):
        _through_backend(_model(MLP), torch.randn(4, 32), options=options)


def test_cuda_graph_replay_is_an_option_and_never_on_the_cpu():
    assert Settings.of({}).cuda_graph and not Settings.of({"cuda_graph": False}).cuda_graph
    compiled, _ = _through_backend(_model(MLP), torch.randn(4, 32))
    assert compiled.static.device.type == "cpu" and compiled.static.replay is None


def test_pyproject_declares_the_entry_point():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["torch_dynamo_backends"]["fastdlight"]
    module, attr = target.split(":")
    assert getattr(importlib.import_module(module), attr) is backend


def test_torch_resolves_the_name_through_the_entry_point():
    found = [ep for ep in importlib.metadata.entry_points(group="torch_dynamo_backends") if ep.name == "fastdlight"]
    if not found:
        pytest.skip("fastdlight is not installed (pip install -e .): no entry point to read")

    assert found[0].load() is backend
    assert lookup_backend("fastdlight") is backend


@pytest.mark.gpu
def test_cuda_fp16_cnn_matches_eager_and_replays_from_the_database(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    model = _model(SmallCNN).half().cuda()
    x = torch.randn(8, 3, 32, 32, device="cuda").half()
    options = {"database": tmp_path, "topk": 4}
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        compiled, example_inputs = _through_backend(model, x, options=options)
    program = compiled.static
    assert program.device.type == "cuda" and program.in_dtypes == (torch.float16,)
    assert {row.status for row in program.report} <= {"tuned", "database", "view"}
    with torch.no_grad():
        expected = model(x)
        for _ in range(2):  # the second call runs the same program, on the GPU
            (out,) = compiled(*example_inputs)
            assert out.device.type == "cuda" and out.dtype == torch.float16
            torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
        stream = torch.cuda.Stream()  # kernels go on torch's current stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            (out,) = compiled(*example_inputs)
        stream.synchronize()
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
        # replayed from a CUDA graph: new activations are copied in, outputs are the caller's own
        assert program.replay is not None and program.replay.graph is not None, program.replay.why_not
        y, with_y = torch.randn_like(x), list(example_inputs)
        with_y[compiled.sig.activations[0]] = y
        (out_y,) = compiled(*with_y)
        (out_x,) = compiled(*example_inputs)
        torch.testing.assert_close(out_y, model(y), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(out_x, expected, rtol=2e-2, atol=2e-2)
        # inside the caller's own CUDA graph: the kernels are captured into it
        static_x, outer = example_inputs[compiled.sig.activations[0]].clone(), torch.cuda.CUDAGraph()
        captured = list(example_inputs)
        captured[compiled.sig.activations[0]] = static_x
        with torch.cuda.graph(outer):
            (graph_out,) = compiled(*captured)
        static_x.copy_(y)
        outer.replay()
        torch.testing.assert_close(graph_out, model(y), rtol=2e-2, atol=2e-2)
    again, _ = _through_backend(model, x, options=options)  # as another process would: no tuning
    assert [row.status for row in again.static.report if row.status == "tuned"] == []


def test_a_program_called_while_torch_captures_a_graph_adds_its_own_graph_to_it(monkeypatch):
    """Under the caller's own capture the program's graph goes into the caller's as a node (its
    kernels run there would allocate under capture); before it has a graph of its own, it runs
    its kernels and captures none then."""
    calls = []
    replay = GraphReplay(lambda *args: calls.append(args) or ("out",), torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert replay(["x"]) == ("out",) and calls == [("x",)] and replay.graph is None

    class FakeGraph:
        def __init__(self):
            self.used = []

        def add_to_capture(self, stream):
            self.used.append(("node", stream))

        def launch(self, stream):
            self.used.append(("launch", stream))

    class FakeStream:
        cuda_stream = 7

    graph, static_in, static_out = FakeGraph(), torch.zeros(2), torch.arange(3.0)
    replay.graph, replay.inputs, replay.outputs = graph, [static_in], (static_out,)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    (out,) = replay([torch.ones(2)])
    assert graph.used == [("node", 7)] and calls == [("x",)]  # no kernels run: the graph is the node
    assert torch.equal(static_in, torch.ones(2)) and out.data_ptr() == static_out.data_ptr()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    replay([torch.ones(2)])
    assert graph.used[-1] == ("launch", 7)


def test_lent_outputs_cost_no_copy_and_a_held_one_keeps_its_values():
    """A CUDA graph writes the same output memory every replay: outputs are handed out without a
    copy, and one still held when the next replay comes gets storage of its own first."""
    buffer, lent = torch.arange(6.0).reshape(2, 3), LentOutputs()
    (first,) = lent.lend([buffer])
    assert first.data_ptr() == buffer.data_ptr()
    lent.reclaim()  # "before the next replay": first is still held
    buffer.zero_()  # the replay
    assert first.data_ptr() != buffer.data_ptr() and first.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    (second,) = lent.lend([buffer])
    ptr = second.data_ptr()
    del second  # the caller is done with it: nothing to copy
    lent.reclaim()
    assert ptr == buffer.data_ptr() and lent.handed == []


def test_a_graph_on_another_gpu_is_tuned_on_that_gpu():
    h100 = CUDA("nvidia/nvidia-h100")
    assert tuning_for(h100, 1, Settings.of({"database": False})).options.devices == (1,)
    assert tuning_for(h100, 1, Settings.of({"database": False, "devices": (0, 1)})).options.devices == (0, 1)

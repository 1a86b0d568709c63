"""Compiled programs kept in the backend's cache: a graph compiled before (by this process or
another) loads its program without being exported or built; anything that changes the program
(a weight, a shape, the settings) is a miss."""

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fastdlight.torch_backend import EagerFallbackWarning, backend  # noqa: E402 - after the torch check
from fastdlight.torch_backend import dynamo, programs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _net(seed=0):
    torch.manual_seed(seed)
    return Net().eval()


@pytest.fixture
def exports(monkeypatch):
    """How many graphs were exported (a kept program skips the export)."""
    calls = []
    real = dynamo.to_relax

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dynamo, "to_relax", counted)
    return calls


def _run(model, x, options=None):
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        return torch.compile(model, backend=backend, options=options)(x)


def test_a_graph_compiled_before_loads_its_kept_program(exports, fresh_cache):
    model, x = _net(), torch.randn(3, 16)
    first = _run(model, x)
    assert len(exports) == 1 and len(list((fresh_cache / "programs").iterdir())) == 1
    again = _run(model, x)
    assert len(exports) == 1  # loaded, not exported again
    torch.testing.assert_close(again, first)
    torch.testing.assert_close(again, model(x), rtol=1e-4, atol=1e-5)


def test_changed_weights_a_new_shape_or_other_settings_build_anew(exports, fresh_cache):
    model, x = _net(), torch.randn(3, 16)
    _run(model, x)
    with torch.no_grad():
        model.fc1.weight[0, 0] += 1.0  # a program holds the weights as constants
    torch.testing.assert_close(_run(model, x), model(x), rtol=1e-4, atol=1e-5)
    _run(model, torch.randn(5, 16))
    _run(model, x, options={"fp16": True})
    assert len(exports) == 4 and len(list((fresh_cache / "programs").iterdir())) == 4


def test_without_a_database_nothing_is_kept(exports, fresh_cache):
    model, x = _net(), torch.randn(3, 16)
    _run(model, x, options={"database": False})
    _run(model, x, options={"database": False})
    assert len(exports) == 2 and not (fresh_cache / "programs").exists()


def test_a_damaged_entry_is_a_miss_and_is_replaced(exports, fresh_cache):
    model, x = _net(), torch.randn(3, 16)
    _run(model, x)
    (entry,) = (fresh_cache / "programs").iterdir()
    (entry / programs.LIBRARY).write_bytes(b"not a library")
    torch.testing.assert_close(_run(model, x), model(x), rtol=1e-4, atol=1e-5)
    assert len(exports) == 2


def test_another_process_loads_the_program_without_exporting(fresh_cache):
    """The point of keeping programs: a second process's first result skips export and build."""
    code = f"""
import sys, torch
sys.path.insert(0, {str(ROOT / 'tests' / 'torch_backend')!r})
from test_torch_programs import _net, _run
from fastdlight.torch_backend import dynamo
calls = []
real = dynamo.to_relax
dynamo.to_relax = lambda *a, **k: calls.append(1) or real(*a, **k)
model = _net()
x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
out = _run(model, x)
torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
print("exports", len(calls))
"""
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
            for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stderr[-2000:]
    assert [done.stdout.split()[-1] for done in runs] == ["1", "0"]

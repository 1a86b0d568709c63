"""Measuring on another machine's GPU through TVM's RPC (CPU): a fastdlight RPC server as a
local process, reached directly and through a TVM tracker. This machine has no GPU, so the
server says so and the tuner ranks by the policy's estimate: the test covers the whole path
(connection, the libraries' upload, the remote call, the answer) but no timing."""

import collections
import json
import socket
import subprocess
import sys
import threading
import time
import warnings

import pytest
from tvm import rpc

import fastdlight
from fastdlight import ops, rpc_server
from fastdlight.arch import has_gpu
from fastdlight.cli import main
from fastdlight.compiler.build_task import runtime_has_cuda
from fastdlight.search import remote
from fastdlight.search.options import TuneOptions

H100 = "nvidia/nvidia-h100"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], ready: str, timeout: float = 60.0, env=None) -> subprocess.Popen:
    """A process of ours that prints ``ready`` once it serves. Its output is read on after that
    (kept in ``proc.lines``): a server that logs while it measures would otherwise fill the pipe
    and block on its next write."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    proc.lines = collections.deque(maxlen=200)
    t0 = time.time()
    while time.time() - t0 < timeout:
        line = proc.stdout.readline()
        proc.lines.append(line)
        if ready in line:
            threading.Thread(target=lambda: proc.lines.extend(proc.stdout), daemon=True).start()
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"{args} did not start: {''.join(proc.lines)[-1500:]}")


@pytest.fixture
def server():
    if has_gpu():
        pytest.skip("a GPU is here: the server would time, which these CPU checks do not cover")
    port = free_port()
    proc = start(["-m", "fastdlight.rpc_server", "--host", "127.0.0.1", "--port", str(port)], "fastdlight RPC server")
    yield proc, port
    proc.kill()
    proc.wait()


def test_the_candidates_travel_to_the_server_and_a_server_without_a_gpu_says_so(server):
    proc, port = server
    op = ops.matmul(256, 256, 256, "float16", "float16", "NT", acc_dtype="float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results, best = fastdlight.tune(op.func, H100, topk=2, rpc=f"127.0.0.1:{port}", max_workers=2)
    said = [str(w.message) for w in caught if "has no GPU" in str(w.message)]
    assert len(said) == 1 and "nothing was timed: candidates ranked by the policy's estimate" in said[0]
    # libraries travel where this TVM can make them (a CUDA runtime); the pip wheel cannot
    libraries = len([r for r in results if r.compiled]) + 1 if runtime_has_cuda() else 0
    assert f"(it received {libraries} libraries)" in said[0]
    assert best.compiled and all(r.latency_ms is None for r in results)


def test_the_server_answers_what_it_received(server):
    """The remote call itself: uploads, then the request naming them."""
    proc, port = server
    conn = rpc.connect("127.0.0.1", port)
    conn.upload(__file__, target="one.so")
    answer = json.loads(conn.get_function(remote.MEASURE_FUNC)(json.dumps(
        {"func": "", "configs": [], "artifacts": {"0": "one.so"}, "reference": None, "options": {}})))
    assert answer["received"] == 1 and "has no GPU" in answer["error"]


def test_the_server_measures_in_its_own_long_lived_process(server):
    """Requests go to one measuring process the server started (one TVM import and CUDA context
    for all of them), not to the child that serves the connection."""
    proc, port = server
    children = subprocess.run(["ps", "-o", "args=", "--ppid", str(proc.pid)], capture_output=True, text=True).stdout
    assert "fastdlight.rpc_server --measure-loop" in children

    conn = rpc.connect("127.0.0.1", port)
    for _ in range(2):  # the same process answers again
        answer = json.loads(conn.get_function(remote.MEASURE_FUNC)(json.dumps(
            {"func": "", "configs": [], "artifacts": {}, "reference": None, "options": {}})))
        assert "has no GPU" in answer["error"]
    after = subprocess.run(["ps", "-o", "args=", "--ppid", str(proc.pid)], capture_output=True, text=True).stdout
    assert after.count("--measure-loop") == 1


def test_a_server_that_is_gone_fails_in_one_line_after_the_retries():
    port = free_port()  # nothing listens there
    op = ops.matmul(128, 128, 128, "float16", "float16", "NT", acc_dtype="float32")
    with pytest.raises(remote.RemoteError, match=rf"the RPC server at 127.0.0.1:{port} did not measure \(3 tries\)"):
        fastdlight.tune(op.func, H100, topk=1, rpc=f"127.0.0.1:{port}", max_workers=1)


def test_a_server_killed_between_tries_is_replaced_by_the_next_one(server, monkeypatch):
    """The first connection's server dies before answering; the retry reaches a live one."""
    proc, port = server
    calls = []
    real = remote.connect

    def connect(spec):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionResetError("the server went away")
        return real(spec)

    monkeypatch.setattr(remote, "connect", connect)
    op = ops.matmul(128, 128, 128, "float16", "float16", "NT", acc_dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, best = fastdlight.tune(op.func, H100, topk=1, rpc=f"127.0.0.1:{port}", max_workers=1)
    assert len(calls) == 2 and best.compiled


@pytest.mark.parametrize("spec", ["localhost", "host:port", ":9090", "h:70000", "a:1:b:c"])
def test_bad_rpc_addresses_are_refused_in_one_line(spec):
    with pytest.raises(ValueError, match="expected HOST:PORT .a server. or HOST:PORT:KEY"):
        TuneOptions(rpc=spec)


def test_through_a_tracker(tmp_path):
    """A TVM tracker (it needs tornado) and our server registered with it under a key."""
    pytest.importorskip("tornado")
    if has_gpu():
        pytest.skip("a GPU is here")
    tracker_port, server_port = free_port(), free_port()
    tracker = start(["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(tracker_port),
                     "--port-end", str(tracker_port + 1)], f"bind to 127.0.0.1:{tracker_port}", timeout=60)
    try:
        server = start(["-m", "fastdlight.rpc_server", "--host", "127.0.0.1", "--port", str(server_port),
                        "--tracker", f"127.0.0.1:{tracker_port}", "--key", "h200"], "fastdlight RPC server")
        try:
            time.sleep(1.0)  # the registration reaches the tracker
            op = ops.matmul(128, 128, 128, "float16", "float16", "NT", acc_dtype="float32")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _, best = fastdlight.tune(op.func, H100, topk=1, rpc=f"127.0.0.1:{tracker_port}:h200", max_workers=1)
            assert best.compiled and any("has no GPU" in str(w.message) for w in caught)
        finally:
            server.kill()
    finally:
        tracker.kill()


def test_the_command_line_tunes_through_the_server(server, capsys):
    proc, port = server
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(["tune", "matmul", "128", "128", "128", "--rpc", f"127.0.0.1:{port}", "--workers", "1",
                   "--topk", "1", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0 and f"timed through RPC at 127.0.0.1:{port}" in out


def test_a_measurement_that_fails_on_the_server_is_not_retried(monkeypatch):
    """The server answers ``failed``: the tuner says so in one line after one attempt."""
    calls = []

    class Connection:
        def upload(self, path, target):
            pass

        def get_function(self, name):
            calls.append(name)
            return lambda request: json.dumps({"failed": "no candidate could be used (2 tried, none verified)"})

    monkeypatch.setattr(remote, "connect", lambda spec: Connection())
    with pytest.raises(remote.RemoteError, match="could not use the candidates: no candidate could be used"):
        remote.measure_remotely(remote.RpcSpec("h", 1), "{}", [], [], None, {})
    assert calls == [remote.MEASURE_FUNC]


def test_the_server_process_never_initializes_cuda_itself(monkeypatch):
    """Each connection is served by a child forked from the server: CUDA initialized in the
    server first is unusable there (a measurement then never came back, H200). Its GPU line is
    asked of a process of its own."""
    def touched():
        raise AssertionError("has_gpu() ran in the server's own process")

    monkeypatch.setattr(rpc_server, "has_gpu", touched)
    assert rpc_server.gpu_line() in ("yes", "none (compile-only)")
